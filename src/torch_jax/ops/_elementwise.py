"""Elementwise ops: unary math, binary arithmetic, comparisons, logic, where/clamp.

Families are one line each: ``unary(aten.exp, jnp.exp, INT_TO_FLOAT)`` lowers the
functional overload and the executor derives ``exp_`` and ``exp.out``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from torch_jax.ops._promote import (
    ALWAYS_BOOL,
    COMPLEX_TO_FLOAT,
    DEFAULT,
    INT_TO_FLOAT,
    cast,
    promote,
)
from torch_jax.ops._registry import aten, lower


def unary(packet, fn, kind=DEFAULT, overload="default"):
    op = getattr(packet, overload)

    def lowering(x):
        (x,), out = promote(x, kind=kind)
        return cast(fn(x), out)

    lowering.__name__ = f"{op._schema.name.split('::')[1]}_{overload}"
    lower(op)(lowering)
    return lowering


def binary(packet, fn, kind=DEFAULT, overloads=("Tensor", "Scalar")):
    for overload in overloads:
        op = getattr(packet, overload, None)
        if op is None:
            continue

        def lowering(a, b, _fn=fn):
            (a, b), out = promote(a, b, kind=kind)
            return cast(_fn(a, b), out)

        lowering.__name__ = f"{op._schema.name.split('::')[1]}_{overload}"
        lower(op)(lowering)


# ---- unary math ----
unary(aten.neg, jnp.negative)
unary(aten.abs, jnp.abs, COMPLEX_TO_FLOAT)
unary(aten.exp, jnp.exp, INT_TO_FLOAT)
unary(aten.exp2, jnp.exp2, INT_TO_FLOAT)
unary(aten.expm1, jnp.expm1, INT_TO_FLOAT)
unary(aten.log, jnp.log, INT_TO_FLOAT)
unary(aten.log2, jnp.log2, INT_TO_FLOAT)
unary(aten.log10, jnp.log10, INT_TO_FLOAT)
unary(aten.log1p, jnp.log1p, INT_TO_FLOAT)
unary(aten.sqrt, jnp.sqrt, INT_TO_FLOAT)
unary(aten.rsqrt, lax.rsqrt, INT_TO_FLOAT)
unary(aten.sin, jnp.sin, INT_TO_FLOAT)
unary(aten.cos, jnp.cos, INT_TO_FLOAT)
unary(aten.tan, jnp.tan, INT_TO_FLOAT)
unary(aten.asin, jnp.arcsin, INT_TO_FLOAT)
unary(aten.acos, jnp.arccos, INT_TO_FLOAT)
unary(aten.atan, jnp.arctan, INT_TO_FLOAT)
unary(aten.sinh, jnp.sinh, INT_TO_FLOAT)
unary(aten.cosh, jnp.cosh, INT_TO_FLOAT)
unary(aten.tanh, jnp.tanh, INT_TO_FLOAT)
unary(aten.asinh, jnp.arcsinh, INT_TO_FLOAT)
unary(aten.acosh, jnp.arccosh, INT_TO_FLOAT)
unary(aten.atanh, jnp.arctanh, INT_TO_FLOAT)
unary(aten.sigmoid, jax.nn.sigmoid, INT_TO_FLOAT)
unary(aten.erf, jax.scipy.special.erf, INT_TO_FLOAT)
unary(aten.erfc, jax.scipy.special.erfc, INT_TO_FLOAT)
unary(aten.erfinv, jax.scipy.special.erfinv, INT_TO_FLOAT)
unary(aten.reciprocal, lambda x: 1 / x, INT_TO_FLOAT)
unary(aten.sign, jnp.sign)
unary(aten.sgn, lambda x: jnp.where(x == 0, 0, x / jnp.abs(x)) if jnp.iscomplexobj(x) else jnp.sign(x))
unary(aten.ceil, lambda x: jnp.ceil(x) if jnp.issubdtype(x.dtype, jnp.inexact) else x)
unary(aten.floor, lambda x: jnp.floor(x) if jnp.issubdtype(x.dtype, jnp.inexact) else x)
unary(aten.round, lambda x: jnp.round(x) if jnp.issubdtype(x.dtype, jnp.inexact) else x)
unary(aten.trunc, lambda x: jnp.trunc(x) if jnp.issubdtype(x.dtype, jnp.inexact) else x)
unary(aten.frac, lambda x: x - jnp.trunc(x))
unary(aten.bitwise_not, lambda x: jnp.logical_not(x) if x.dtype == jnp.bool_ else jnp.bitwise_not(x))
unary(aten.logical_not, jnp.logical_not, ALWAYS_BOOL)
unary(aten.isnan, jnp.isnan, ALWAYS_BOOL)
unary(aten.isinf, jnp.isinf, ALWAYS_BOOL)
unary(aten.isneginf, jnp.isneginf, ALWAYS_BOOL)
unary(aten.isposinf, jnp.isposinf, ALWAYS_BOOL)
unary(aten.signbit, jnp.signbit, ALWAYS_BOOL)
unary(aten.relu, lambda x: jnp.maximum(x, jnp.zeros((), x.dtype)) if x.dtype != jnp.bool_ else x)


@lower(aten.round.decimals, static=("decimals",))
def round_decimals(x, decimals=0):
    (x,), out = promote(x)
    scale = 10.0**decimals
    return cast(jnp.round(x * scale) / scale, out)


# ---- binary arithmetic ----


@lower(aten.add.Tensor, aten.add.Scalar)
def add(a, b, alpha=1):
    (a, b), out = promote(a, b)
    if alpha is not None and not (isinstance(alpha, (int, float)) and alpha == 1):
        b = b * cast(alpha, b.dtype) if b.dtype != jnp.bool_ else jnp.logical_and(b, alpha)
    return cast(a + b if a.dtype != jnp.bool_ else jnp.logical_or(a, b), out)


@lower(aten.sub.Tensor, aten.sub.Scalar)
def sub(a, b, alpha=1):
    (a, b), out = promote(a, b)
    if alpha is not None and not (isinstance(alpha, (int, float)) and alpha == 1):
        b = b * cast(alpha, b.dtype)
    return cast(a - b, out)


@lower(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(a, b, alpha=1):
    return sub(b, a, alpha)


binary(aten.mul, lambda a, b: jnp.logical_and(a, b) if a.dtype == jnp.bool_ else a * b)
binary(aten.div, lambda a, b: a / b, INT_TO_FLOAT)


@lower(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(a, b, rounding_mode=None):
    if rounding_mode is None:
        (a, b), out = promote(a, b, kind=INT_TO_FLOAT)
        return cast(a / b, out)
    (a, b), out = promote(a, b)
    if rounding_mode == "trunc":
        if jnp.issubdtype(a.dtype, jnp.integer):
            return cast(lax.div(a, jnp.where(b == 0, 1, b)), out)
        return cast(jnp.trunc(a / b), out)
    if rounding_mode == "floor":
        if jnp.issubdtype(a.dtype, jnp.integer):
            return cast(jnp.floor_divide(a, jnp.where(b == 0, 1, b)), out)
        return cast(_float_floor_divide(a, b), out)
    raise ValueError(f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '{rounding_mode}'")


def _float_floor_divide(a, b):
    # PyTorch's floor division for floats: computed from fmod so that (a // b) * b + a % b == a
    mod = jnp.fmod(a, b)
    div = (a - mod) / b
    div = jnp.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
    floor = jnp.floor(div)
    floor = jnp.where(div - floor > 0.5, floor + 1, floor)
    return jnp.where(b == 0, a / b, jnp.where(div == 0, jnp.copysign(jnp.zeros_like(div), a / b), floor))


binary(
    aten.floor_divide,
    lambda a, b: jnp.floor_divide(a, b) if jnp.issubdtype(a.dtype, jnp.integer) else _float_floor_divide(a, b),
    overloads=("default", "Scalar"),
)
binary(aten.remainder, lambda a, b: jnp.remainder(a, b))
binary(aten.fmod, lambda a, b: jnp.fmod(a, b))
binary(aten.maximum, jnp.maximum, overloads=("default",))
binary(aten.minimum, jnp.minimum, overloads=("default",))
binary(aten.fmax, jnp.fmax, overloads=("default",))
binary(aten.fmin, jnp.fmin, overloads=("default",))
binary(aten.atan2, jnp.arctan2, INT_TO_FLOAT, overloads=("default",))
binary(aten.hypot, jnp.hypot, overloads=("default",))
binary(aten.copysign, jnp.copysign, INT_TO_FLOAT, overloads=("Tensor", "Scalar"))
binary(aten.nextafter, jnp.nextafter, overloads=("default",))
binary(aten.logaddexp, jnp.logaddexp, overloads=("default",))
binary(aten.logaddexp2, jnp.logaddexp2, overloads=("default",))
binary(
    aten.xlogy,
    lambda a, b: jax.scipy.special.xlogy(a, b),
    INT_TO_FLOAT,
    overloads=("Tensor", "Scalar_Other", "Scalar_Self"),
)


@lower(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar, static=("exponent",))
def pow_(a, b):
    (a2, b2), out = promote(a, b)
    if isinstance(b, (int, float)) and not isinstance(b, bool) and float(b).is_integer() and abs(b) <= 64:
        if b >= 0 or jnp.issubdtype(a2.dtype, jnp.inexact):
            return cast(lax.integer_pow(a2, int(b)), out)
    if isinstance(b, float) and b == 0.5 and jnp.issubdtype(a2.dtype, jnp.inexact):
        return cast(jnp.sqrt(a2), out)
    return cast(jnp.power(a2, b2), out)


# ---- bitwise and logical ----
binary(aten.bitwise_and, lambda a, b: a & b)
binary(aten.bitwise_or, lambda a, b: a | b)
binary(aten.bitwise_xor, lambda a, b: a ^ b)
binary(aten.logical_and, jnp.logical_and, ALWAYS_BOOL, overloads=("default",))
binary(aten.logical_or, jnp.logical_or, ALWAYS_BOOL, overloads=("default",))
binary(aten.logical_xor, jnp.logical_xor, ALWAYS_BOOL, overloads=("default",))

# ---- comparisons ----
for _name, _fn in [
    ("eq", jnp.equal),
    ("ne", jnp.not_equal),
    ("lt", jnp.less),
    ("le", jnp.less_equal),
    ("gt", jnp.greater),
    ("ge", jnp.greater_equal),
]:
    binary(getattr(aten, _name), _fn, ALWAYS_BOOL)


@lower(aten.where.self)
def where_self(cond, a, b):
    (a, b), out = promote(a, b)
    return cast(jnp.where(cond.astype(bool), a, b), out)


@lower(aten.clamp.default, aten.clamp.Tensor)
def clamp(x, lo=None, hi=None):
    (x, lo, hi), out = promote(x, lo, hi)
    if lo is not None:
        x = (
            jnp.maximum(x, lo)
            if not jnp.issubdtype(x.dtype, jnp.floating)
            else jnp.where(jnp.isnan(lo), lo, jnp.where(x < lo, lo, x))
        )
    if hi is not None:
        x = (
            jnp.minimum(x, hi)
            if not jnp.issubdtype(x.dtype, jnp.floating)
            else jnp.where(jnp.isnan(hi), hi, jnp.where(x > hi, hi, x))
        )
    return cast(x, out)


@lower(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(x, lo):
    return clamp(x, lo, None)


@lower(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(x, hi):
    return clamp(x, None, hi)


@lower(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(a, b, w):
    (a, b, w), out = promote(a, b, w)
    return cast(jnp.where(jnp.abs(w) < 0.5, a + w * (b - a), b - (b - a) * (1 - w)), out)


@lower(aten.addcmul.default)
def addcmul(x, t1, t2, value=1):
    (x, t1, t2), out = promote(x, t1, t2)
    return cast(x + cast(value, x.dtype) * t1 * t2, out)


@lower(aten.addcdiv.default)
def addcdiv(x, t1, t2, value=1):
    (x, t1, t2), out = promote(x, t1, t2)
    return cast(x + cast(value, x.dtype) * (t1 / t2), out)
