"""Elementwise ops: unary math, binary arithmetic, comparisons, logic, where/clamp.

Families are one line each: ``unary(aten.exp, jnp.exp, INT_TO_FLOAT)`` lowers the
functional overload and the executor derives ``exp_`` and ``exp.out``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from torch_jax.ops._context import check
from torch_jax.ops._promote import (
    ALWAYS_BOOL,
    COMPLEX_TO_FLOAT,
    DEFAULT,
    INT_TO_FLOAT,
    cast,
    in_opmath,
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


def _rounded(x):
    """``x`` rounded to its dtype: XLA may compute half-type intermediates in float32."""
    if x.dtype in (jnp.float16, jnp.bfloat16):
        info = jnp.finfo(x.dtype)
        return lax.reduce_precision(x, info.nexp, info.nmant)
    return x


def _sgn(x):
    if jnp.iscomplexobj(x):  # (the parts divided by the real |x|, as c10::complex / T does)
        r = jnp.abs(x)
        return jnp.where(x == 0, jnp.zeros_like(x), lax.complex(jnp.real(x) / r, jnp.imag(x) / r))
    return _sign(x)


def _sign(x):
    """PyTorch's ``(0 < x) - (x < 0)``: NaN and -0.0 give +0.0 (jnp.sign keeps them)."""
    return (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)


def _sinc(x):
    px = x * jnp.pi
    return jnp.where(x == 0, jnp.ones_like(x), jnp.sin(px) / jnp.where(x == 0, jnp.ones_like(px), px))


def _logaddexp_complex(a, b):
    # PyTorch's ordering: the operand with the larger real part factors out
    a_first = jnp.real(a) < jnp.real(b)
    lo, hi = jnp.where(a_first, a, b), jnp.where(a_first, b, a)
    nan = jnp.isnan(a) | jnp.isnan(b)
    both_inf = ~jnp.isfinite(jnp.real(lo)) & (jnp.real(lo) == jnp.real(hi))
    inf_case = jnp.where(jnp.real(lo) < 0, lo, jnp.log(jnp.exp(lo) + jnp.exp(hi)))
    out = jnp.where(both_inf, inf_case, jnp.log1p(jnp.exp(lo - hi)) + hi)
    return jnp.where(nan, jnp.full_like(out, complex(jnp.nan, jnp.nan)), out)


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
unary(aten.reciprocal, lambda x: true_divide(jnp.ones((), x.dtype), x), INT_TO_FLOAT)
unary(aten.sign, lambda x: x if x.dtype == jnp.bool_ else _sign(x))
unary(aten.sgn, lambda x: x if x.dtype == jnp.bool_ else _sgn(x))
unary(aten._conj_physical, lambda x: jnp.conj(x) if jnp.iscomplexobj(x) else x)
# conj_physical_ has no functional twin of its name (conj_physical is composite): it
# returns the new value of self
lower(aten.conj_physical_.default)(lambda x: jnp.conj(x) if jnp.iscomplexobj(x) else x)
unary(aten.sinc, lambda x: in_opmath(_sinc, x), INT_TO_FLOAT)
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
unary(
    aten.angle,
    lambda x: (
        jnp.angle(x)
        if jnp.iscomplexobj(x)
        else jnp.where(jnp.isnan(x), x, jnp.where(x < 0, jnp.pi, 0.0).astype(x.dtype))
    ),
    INT_TO_FLOAT,
)
# the CPU's ``x < 0 ? 0 : x``: NaN and -0.0 pass through (jnp.maximum(-0.0, 0) is +0.0)
unary(aten.relu, lambda x: jnp.where(x < 0, jnp.zeros((), x.dtype), x) if x.dtype != jnp.bool_ else x)


@lower(aten.round.decimals, static=("decimals",))
def round_decimals(x, decimals=0):
    (x,), out = promote(x)
    scale = 10.0**decimals
    return cast(jnp.round(x * scale) / scale, out)


# ---- binary arithmetic ----


def scaled(value, t):
    """``value * t`` for a scalar ``value`` (None: 1) as PyTorch's kernels compute it.

    NOTE [Complex scaling]: PyTorch's add, sub, addcmul and addcdiv multiply by their
    scalar (``alpha``, ``value``) with a full complex product even when it is 1, so
    (1 + 0j) * (0 + inf j) is nan + inf j there (0 * inf); XLA folds a product by the
    constant 1 + 0j away. For complex ``t`` the product is written out by parts."""
    value = cast(1 if value is None else value, t.dtype)
    if not jnp.iscomplexobj(t):
        return value * t
    value = jnp.asarray(value)
    vr, vi, tr, ti = jnp.real(value), jnp.imag(value), jnp.real(t), jnp.imag(t)
    return lax.complex(vr * tr - vi * ti, vr * ti + vi * tr)


@lower(aten.add.Tensor, aten.add.Scalar)
def add(a, b, alpha=1):
    (a, b), out = promote(a, b)
    if jnp.iscomplexobj(b) or (alpha is not None and not (isinstance(alpha, (int, float)) and alpha == 1)):
        b = scaled(alpha, b) if b.dtype != jnp.bool_ else jnp.logical_and(b, alpha)
    return cast(a + b if a.dtype != jnp.bool_ else jnp.logical_or(a, b), out)


@lower(aten.sub.Tensor, aten.sub.Scalar)
def sub(a, b, alpha=1):
    if any(isinstance(v, bool) or getattr(v, "dtype", None) == jnp.bool_ for v in (a, b)):
        # PyTorch refuses bool subtraction; raising here makes the executor replay the op
        # on the CPU, which raises its own message
        raise RuntimeError("Subtraction, the `-` operator, with a bool tensor is not supported.")
    (a, b), out = promote(a, b)
    if jnp.iscomplexobj(b) or (alpha is not None and not (isinstance(alpha, (int, float)) and alpha == 1)):
        b = scaled(alpha, b)
    return cast(a - b, out)


@lower(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(a, b, alpha=1):
    return sub(b, a, alpha)


@lower(aten.mul.Tensor, aten.mul.Scalar)
def mul(a, b):
    bools = [getattr(v, "dtype", None) == jnp.bool_ for v in (a, b)]
    (a, b), out = promote(a, b)
    if a.dtype == jnp.bool_:
        return cast(jnp.logical_and(a, b), out)
    if any(bools) and jnp.issubdtype(a.dtype, jnp.inexact):
        # XLA rewrites float(bool) * x as select(bool, x, 0), which loses 0 * inf = nan;
        # the barrier keeps the multiplication
        a, b = (lax.optimization_barrier(v) if is_bool else v for v, is_bool in zip((a, b), bools))
    return cast(a * b, out)


def true_divide(a, b):
    """``a / b``; for complex operands the way PyTorch's ``c10::complex`` divides.

    NOTE [Complex division]: PyTorch's CPU (and CUDA) kernels divide complex numbers with
    numpy's algorithm (Smith's: scale by the larger part of the divisor), which has no
    special cases for infinities: (inf + inf j) / -1 is nan + nan j, 0 / (inf + inf j) is
    nan + nan j. XLA's complex division handles infinities and zeros as C99's Annex G
    does (-inf - inf j, 0), so complex division is written out here, operation for
    operation as in c10/util/complex.h (torch/headeronly/util/complex.h)."""
    if not (jnp.iscomplexobj(a) or jnp.iscomplexobj(b)):
        return a / b
    dtype = jnp.result_type(a, b)
    a, b = jnp.broadcast_arrays(jnp.asarray(a, dtype), jnp.asarray(b, dtype))
    x, y, c, d = jnp.real(a), jnp.imag(a), jnp.real(b), jnp.imag(b)
    abs_c, abs_d = jnp.abs(c), jnp.abs(d)
    rat = d / c  # |c| >= |d|
    scl = 1 / (c + d * rat)
    re, im = (x + y * rat) * scl, (y - x * rat) * scl
    zero = (abs_c == 0) & (abs_d == 0)  # a complex inf or nan
    re, im = jnp.where(zero, x / abs_c, re), jnp.where(zero, y / abs_d, im)
    rat2 = c / d  # |c| < |d|
    scl2 = 1 / (d + c * rat2)
    first = abs_c >= abs_d
    re = jnp.where(first, re, (x * rat2 + y) * scl2)
    im = jnp.where(first, im, (y * rat2 - x) * scl2)
    return lax.complex(re, im)


binary(aten.div, true_divide, INT_TO_FLOAT)


def _check_int_divisor(a, b):
    # PyTorch's CPU kernels raise on an integer division by zero (CUDA returns garbage),
    # of the elements they divide: none of an empty result
    if not jnp.issubdtype(b.dtype, jnp.inexact) and math.prod(jnp.broadcast_shapes(jnp.shape(a), b.shape)):
        check(jnp.any(b == 0), RuntimeError, "ZeroDivisionError")


def _int_divisor(a, b):
    """``b`` with zeros replaced by ones, so that XLA's division does not trap (the
    zeros themselves were reported by :func:`_check_int_divisor`)."""
    _check_int_divisor(a, b)
    return jnp.where(b == 0, jnp.ones_like(b), b)


@lower(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(a, b, rounding_mode=None):
    if rounding_mode is None:
        (a, b), out = promote(a, b, kind=INT_TO_FLOAT)
        return cast(true_divide(a, b), out)
    (a, b), out = promote(a, b)
    if rounding_mode == "trunc":
        if jnp.issubdtype(a.dtype, jnp.integer):
            return cast(lax.div(*jnp.broadcast_arrays(a, _int_divisor(a, b))), out)
        return cast(jnp.trunc(a / b), out)
    if rounding_mode == "floor":
        return cast(_floor_divide(a, b), out)
    raise ValueError(f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '{rounding_mode}'")


def _floor_divide(a, b):
    if jnp.issubdtype(a.dtype, jnp.integer):
        return jnp.floor_divide(a, _int_divisor(a, b))
    # PyTorch's floor division for floats: computed from fmod so that (a // b) * b + a % b == a
    mod = jnp.fmod(a, b)
    div = (a - mod) / b
    div = jnp.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
    floor = jnp.floor(div)
    floor = jnp.where(div - floor > 0.5, floor + 1, floor)
    return jnp.where(b == 0, a / b, jnp.where(div == 0, jnp.copysign(jnp.zeros_like(div), a / b), floor))


def _remainder(a, b):
    if jnp.issubdtype(a.dtype, jnp.integer):
        return jnp.remainder(a, _int_divisor(a, b))
    return jnp.remainder(a, b)


def _fmod(a, b):
    if jnp.issubdtype(a.dtype, jnp.integer):
        return lax.rem(*jnp.broadcast_arrays(a, _int_divisor(a, b)))
    return jnp.fmod(a, b)


binary(aten.floor_divide, _floor_divide, overloads=("default", "Scalar"))


# floor_divide_.Tensor pairs with floor_divide.default (not .Tensor), so the executor
# cannot derive it: it returns the new value of self
@lower(aten.floor_divide_.Tensor)
def floor_divide__tensor(a, b):
    (a2, b2), _ = promote(a, b)
    return cast(_floor_divide(a2, b2), a.dtype)


binary(aten.remainder, _remainder, overloads=("Tensor", "Scalar", "Scalar_Tensor"))
binary(aten.fmod, _fmod)
binary(aten.maximum, jnp.maximum, overloads=("default",))
binary(aten.minimum, jnp.minimum, overloads=("default",))
binary(aten.fmax, jnp.fmax, overloads=("default",))
binary(aten.fmin, jnp.fmin, overloads=("default",))
binary(aten.atan2, jnp.arctan2, INT_TO_FLOAT, overloads=("default",))
binary(aten.hypot, jnp.hypot, overloads=("default",))
binary(aten.copysign, jnp.copysign, INT_TO_FLOAT, overloads=("Tensor", "Scalar"))
binary(aten.nextafter, jnp.nextafter, overloads=("default",))
binary(
    aten.logaddexp,
    lambda a, b: _logaddexp_complex(a, b) if jnp.iscomplexobj(a) else jnp.logaddexp(a, b),
    overloads=("default",),
)
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
    if type(b) is int and b < 0 and jnp.issubdtype(a2.dtype, jnp.integer) and not isinstance(a, (int, float)):
        check(True, RuntimeError, "Integers to negative integer powers are not allowed.")
    if isinstance(b, (int, float)) and not isinstance(b, bool) and float(b).is_integer() and abs(b) <= 64:
        if b >= 0 or jnp.issubdtype(a2.dtype, jnp.inexact):
            return cast(lax.integer_pow(a2, int(b)), out)
    if isinstance(b, float) and b == 0.5 and jnp.issubdtype(a2.dtype, jnp.inexact):
        return cast(jnp.sqrt(a2), out)
    if jnp.issubdtype(a2.dtype, jnp.integer):
        return cast(_int_pow(a2, b2), out)
    if a2.dtype == jnp.complex64:
        # computed in double: the CPU's single-precision result is within 1.4e-6 of the
        # exact one, jnp.power's in single precision is further off
        return cast(jnp.power(a2.astype(jnp.complex128), b2.astype(jnp.complex128)), out)
    return cast(jnp.power(a2, b2), out)


def _int_pow(a, b):
    """Integer power with PyTorch's semantics: wraps on overflow; a negative exponent
    gives 0 except for the bases 1 and -1."""
    b = jnp.broadcast_to(b, jnp.broadcast_shapes(jnp.shape(a), jnp.shape(b)))
    e = jnp.where(b < 0, jnp.zeros_like(b), b)

    def step(_, carry):  # square-and-multiply over the exponent's bits
        result, base, e = carry
        result = jnp.where((e & 1) == 1, result * base, result)
        return result, base * base, e >> 1

    one = jnp.ones_like(a * b)
    result, _, _ = lax.fori_loop(0, jnp.iinfo(a.dtype).bits, step, (one, a * one, e))
    if jnp.issubdtype(b.dtype, jnp.signedinteger):
        neg = jnp.where(a == 1, one, jnp.where(a == -1, jnp.where((b & 1) == 1, -one, one), 0 * one))
        result = jnp.where(b < 0, neg, result)
    return result


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
    return cast(x + scaled(value, t1) * t2, out)  # (in PyTorch's order; NOTE [Complex scaling])


@lower(aten.addcdiv.default)
def addcdiv(x, t1, t2, value=1):
    (x, t1, t2), out = promote(x, t1, t2)
    # (in PyTorch's order; NOTE [Complex scaling], NOTE [Complex division])
    return cast(x + true_divide(scaled(value, t1), t2), out)


# ---- integer bit manipulation ----


def _shift_left(a, b):
    bits = jnp.iinfo(a.dtype).bits
    ok = (b >= 0) & (b < bits)
    return jnp.where(ok, lax.shift_left(a, jnp.where(ok, b, 0)), jnp.zeros_like(a))


def _shift_right(a, b):
    # shifts by a negative amount or by the width fill with the sign bit, as on CPU
    bits = jnp.iinfo(a.dtype).bits
    ok = (b >= 0) & (b < bits)
    if jnp.issubdtype(a.dtype, jnp.signedinteger):
        return lax.shift_right_arithmetic(a, jnp.where(ok, b, bits - 1))
    return jnp.where(ok, lax.shift_right_logical(a, jnp.where(ok, b, 0)), jnp.zeros_like(a))


_SHIFTS = ("Tensor", "Tensor_Scalar", "Scalar_Tensor")
binary(aten.bitwise_left_shift, lambda a, b: _shift_left(*jnp.broadcast_arrays(a, b)), overloads=_SHIFTS)
binary(aten.bitwise_right_shift, lambda a, b: _shift_right(*jnp.broadcast_arrays(a, b)), overloads=_SHIFTS)


def _gcd(a, b):
    # Euclid's algorithm on |a|, |b| (|INT_MIN| stays negative, as on CPU)
    a, b = jnp.broadcast_arrays(jnp.abs(a), jnp.abs(b))

    def step(carry):
        a, b = carry
        nz = a != 0
        return jnp.where(nz, lax.rem(b, jnp.where(nz, a, 1)), a), jnp.where(nz, a, b)

    _, g = lax.while_loop(lambda c: jnp.any(c[0] != 0), step, (a, b))
    return g


def _lcm(a, b):
    g = _gcd(a, b)
    return jnp.abs(jnp.where(g == 0, jnp.zeros_like(g), lax.div(a, jnp.where(g == 0, 1, g)) * b))


binary(aten.gcd, _gcd, overloads=("default",))
binary(aten.lcm, _lcm, overloads=("default",))


@lower(aten.frexp.Tensor)
def frexp_tensor(x):
    """Mantissa in [0.5, 1) and exponent, from the bits (XLA flushes subnormals to zero
    in arithmetic, so they cannot be rescaled first)."""
    info = jnp.finfo(x.dtype)
    nmant, width = info.nmant, info.bits
    uint = {16: jnp.uint16, 32: jnp.uint32, 64: jnp.uint64}[width]
    bias = info.maxexp - 1
    u = lax.bitcast_convert_type(x, uint)
    sign = u & uint(1 << (width - 1))
    field = (u >> nmant) & uint((1 << (width - 1 - nmant)) - 1)
    frac = u & uint((1 << nmant) - 1)
    # a subnormal: normalise the fraction so that its leading one sits at bit nmant
    lead = width - 1 - lax.clz(frac).astype(jnp.int32)  # position of the leading one
    sub = (field == 0) & (frac != 0)
    shift = jnp.where(sub, nmant - lead, 0).astype(uint)
    frac = jnp.where(sub, (frac << shift) & uint((1 << nmant) - 1), frac)
    exp = jnp.where(sub, lead + 2 - bias - nmant, field.astype(jnp.int32) - bias + 1)
    mant = lax.bitcast_convert_type(sign | (uint(bias - 1) << nmant) | frac, x.dtype)
    special = (x == 0) & ~sub | ~jnp.isfinite(x)
    return jnp.where(special, x, mant), jnp.where(special, 0, exp).astype(jnp.int32)


# ---- irregular unary and binary ops ----


@lower(aten.heaviside.default)
def heaviside(x, values):
    (x, values), out = promote(x, values)
    return cast(jnp.where(x == 0, values, (x > 0).astype(x.dtype)), out)


@lower(aten.nan_to_num.default)
def nan_to_num(x, nan=None, posinf=None, neginf=None):
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        return x
    if jnp.iscomplexobj(x):
        return lax.complex(nan_to_num(jnp.real(x), nan, posinf, neginf), nan_to_num(jnp.imag(x), nan, posinf, neginf))
    info = jnp.finfo(x.dtype)
    x = jnp.where(jnp.isnan(x), jnp.asarray(0.0 if nan is None else nan, x.dtype), x)
    x = jnp.where(jnp.isposinf(x), jnp.asarray(info.max if posinf is None else posinf, x.dtype), x)
    return jnp.where(jnp.isneginf(x), jnp.asarray(info.min if neginf is None else neginf, x.dtype), x)


def _clamp_eps(x, eps):
    if eps is None:
        return x
    lo, hi = jnp.asarray(eps, x.dtype), jnp.asarray(1 - eps, x.dtype)
    return jnp.where(x < lo, lo, jnp.where(x > hi, hi, x))


@lower(aten.logit.default)
def logit(x, eps=None):
    (x,), out = promote(x, kind=INT_TO_FLOAT)
    # in the result dtype (not float32 for the half types), rounded at each step, as on CPU
    x = _clamp_eps(cast(x, out), eps)
    return jnp.log(_rounded(x / _rounded(1 - x)))


@lower(aten.logit_backward.default)
def logit_backward(grad, x, eps=None):
    (grad, x), out = promote(grad, x)
    g = grad / (x * (1 - x))
    if eps is None:
        return cast(jnp.where((x < 0) | (x > 1), jnp.nan, g), out)
    return cast(jnp.where((x < eps) | (x > 1 - eps), 0, g), out)


@lower(aten.complex.default)
def complex_(real, imag):
    (real, imag), _ = promote(real, imag)
    return lax.complex(*jnp.broadcast_arrays(real, imag))


@lower(aten.polar.default)
def polar(abs_, angle):
    (abs_, angle), _ = promote(abs_, angle)
    return lax.complex(abs_ * jnp.cos(angle), abs_ * jnp.sin(angle))
