"""Reductions: sum, mean, prod, min/max (with indices), var/std, any/all, norms,
logsumexp, cumulative ops.

Floating reductions of float16/bfloat16 accumulate in float32, as PyTorch does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from torch_jax.ops import _context
from torch_jax.ops._promote import cast
from torch_jax.ops._registry import aten, lower

_LOW = (np.dtype(jnp.float16), np.dtype(jnp.bfloat16))


def axes(x, dim):
    """Normalized reduction axes; None or [] means all dims."""
    if dim is None:
        return tuple(range(x.ndim))
    if isinstance(dim, int):
        dim = [dim]
    if len(dim) == 0:
        return tuple(range(x.ndim))
    n = max(x.ndim, 1)
    return tuple(sorted({d % n for d in dim})) if x.ndim else ()


def _acc(x, out: np.dtype):
    """``x`` in the dtype to accumulate an ``out``-typed reduction in."""
    if out in _LOW:
        return x.astype(jnp.float32)
    return cast(x, out)


@lower(aten.sum.dim_IntList)
def sum_dim(x, dim, keepdim=False, dtype=None):
    out = _context.out_dtype()
    return cast(jnp.sum(_acc(x, out), axis=axes(x, dim), keepdims=keepdim), out)


@lower(aten.sum.default)
def sum_all(x, dtype=None):
    return sum_dim(x, None, False, dtype)


@lower(aten.mean.dim)
def mean_dim(x, dim, keepdim=False, dtype=None):
    out = _context.out_dtype()
    return cast(jnp.mean(_acc(x, out), axis=axes(x, dim), keepdims=keepdim), out)


@lower(aten.mean.default)
def mean_all(x, dtype=None):
    return mean_dim(x, None, False, dtype)


@lower(aten.prod.dim_int)
def prod_dim(x, dim, keepdim=False, dtype=None):
    out = _context.out_dtype()
    return cast(jnp.prod(_acc(x, out), axis=axes(x, dim), keepdims=keepdim), out)


@lower(aten.prod.default)
def prod_all(x, dtype=None):
    out = _context.out_dtype()
    return cast(jnp.prod(_acc(x, out)), out)


def _extreme(x, axis, keepdims, largest: bool):
    """max/min that propagate NaN, as PyTorch's do."""
    r = (jnp.max if largest else jnp.min)(x, axis=axis, keepdims=keepdims)
    if jnp.issubdtype(x.dtype, jnp.floating):
        r = jnp.where(jnp.any(jnp.isnan(x), axis=axis, keepdims=keepdims), jnp.nan, r)
    return r


def _nan_max(x, axis, keepdims):
    return _extreme(x, axis, keepdims, True)


def _nan_min(x, axis, keepdims):
    return _extreme(x, axis, keepdims, False)


@lower(aten.amax.default)
def amax(x, dim=(), keepdim=False):
    return _nan_max(x, axes(x, dim), keepdim)


@lower(aten.amin.default)
def amin(x, dim=(), keepdim=False):
    return _nan_min(x, axes(x, dim), keepdim)


@lower(aten.max.default)
def max_all(x):
    return _nan_max(x, None, False)


@lower(aten.min.default)
def min_all(x):
    return _nan_min(x, None, False)


def _arg_extreme(x, dim, keepdim, largest: bool):
    """Index of the first max/min along dim (NaN counts as the extreme, as in PyTorch)."""
    if x.ndim == 0:
        return jnp.zeros((), jnp.int64)
    if dim is None:
        flat = x.reshape(-1)
        idx = _arg_extreme(flat, 0, False, largest)
        return idx.reshape((1,) * x.ndim) if keepdim else idx
    d = dim % x.ndim
    if jnp.issubdtype(x.dtype, jnp.floating):
        nan = jnp.isnan(x)
        has_nan = jnp.any(nan, axis=d, keepdims=True)
        idx = jnp.argmax(x, axis=d, keepdims=True) if largest else jnp.argmin(x, axis=d, keepdims=True)
        idx = jnp.where(has_nan, jnp.argmax(nan, axis=d, keepdims=True), idx)
    elif x.dtype == jnp.bool_:
        idx = jnp.argmax(x if largest else ~x, axis=d, keepdims=True)
    else:
        idx = jnp.argmax(x, axis=d, keepdims=True) if largest else jnp.argmin(x, axis=d, keepdims=True)
    idx = idx.astype(jnp.int64)
    return idx if keepdim else jnp.squeeze(idx, d)


@lower(aten.argmax.default)
def argmax(x, dim=None, keepdim=False):
    return _arg_extreme(x, dim, keepdim, True)


@lower(aten.argmin.default)
def argmin(x, dim=None, keepdim=False):
    return _arg_extreme(x, dim, keepdim, False)


def _extreme_dim(x, dim, keepdim, largest: bool):
    idx = _arg_extreme(x, dim, True, largest)
    if x.ndim == 0:
        return x, idx
    d = dim % x.ndim
    vals = jnp.take_along_axis(x, idx, axis=d)
    if not keepdim:
        vals, idx = jnp.squeeze(vals, d), jnp.squeeze(idx, d)
    return vals, idx


@lower(aten.max.dim)
def max_dim(x, dim, keepdim=False):
    return _extreme_dim(x, dim, keepdim, True)


@lower(aten.min.dim)
def min_dim(x, dim, keepdim=False):
    return _extreme_dim(x, dim, keepdim, False)


@lower(aten.var.correction)
def var_correction(x, dim=None, correction=None, keepdim=False):
    out = _context.out_dtype()
    xa = _acc(x, np.dtype(jnp.float32) if x.dtype in _LOW else x.dtype)
    ax = axes(x, dim)
    n = 1
    for a in ax:
        n *= x.shape[a]
    c = 1 if correction is None else correction
    mean = jnp.mean(xa, axis=ax, keepdims=True)
    d = xa - mean
    sq = jnp.real(d * jnp.conj(d)) if jnp.iscomplexobj(d) else d * d
    v = jnp.sum(sq, axis=ax, keepdims=keepdim) / jnp.maximum(n - c, 0)
    return cast(v, out)


@lower(aten.std.correction)
def std_correction(x, dim=None, correction=None, keepdim=False):
    return jnp.sqrt(var_correction(x, dim, correction, keepdim))


@lower(aten.var_mean.correction)
def var_mean_correction(x, dim=None, correction=None, keepdim=False):
    v = var_correction(x, dim, correction, keepdim)
    out = _context.out_dtype(1)
    m = jnp.mean(_acc(x, out), axis=axes(x, dim), keepdims=keepdim)
    return v, cast(m, out)


@lower(aten.std_mean.correction)
def std_mean_correction(x, dim=None, correction=None, keepdim=False):
    v, m = var_mean_correction(x, dim, correction, keepdim)
    return jnp.sqrt(v), m


@lower(aten.any.default)
def any_all(x):
    return jnp.any(x != 0)


@lower(aten.any.dim, aten.any.dims)
def any_dim(x, dim=None, keepdim=False):
    return jnp.any(x != 0, axis=axes(x, dim), keepdims=keepdim)


@lower(aten.all.default)
def all_all(x):
    return jnp.all(x != 0)


@lower(aten.all.dim, aten.all.dims)
def all_dim(x, dim=None, keepdim=False):
    return jnp.all(x != 0, axis=axes(x, dim), keepdims=keepdim)


@lower(aten.logsumexp.default)
def logsumexp(x, dim, keepdim=False):
    out = _context.out_dtype()
    xa = _acc(x, out)
    return cast(jax.nn.logsumexp(xa, axis=axes(x, dim), keepdims=keepdim), out)


@lower(aten.linalg_vector_norm.default, static=("ord",))
def linalg_vector_norm(x, ord=2, dim=None, keepdim=False, dtype=None):
    out = _context.out_dtype()
    xa = jnp.abs(_acc(x, np.dtype(jnp.float32) if x.dtype in _LOW else x.dtype))
    ax = axes(x, dim)
    if ord == float("inf"):
        r = jnp.max(xa, axis=ax, keepdims=keepdim)
    elif ord == float("-inf"):
        r = jnp.min(xa, axis=ax, keepdims=keepdim)
    elif ord == 0:
        r = jnp.sum((xa != 0).astype(xa.dtype), axis=ax, keepdims=keepdim)
    elif ord == 1:
        r = jnp.sum(xa, axis=ax, keepdims=keepdim)
    elif ord == 2:
        r = jnp.sqrt(jnp.sum(xa * xa, axis=ax, keepdims=keepdim))
    else:
        r = jnp.sum(xa**ord, axis=ax, keepdims=keepdim) ** (1.0 / ord)
    return cast(r, out)


@lower(aten.cumsum.default)
def cumsum(x, dim, dtype=None):
    out = _context.out_dtype()
    if x.ndim == 0:
        return cast(x, out)
    return cast(jnp.cumsum(_acc(x, out), axis=dim % x.ndim), out)


@lower(aten.cumprod.default)
def cumprod(x, dim, dtype=None):
    out = _context.out_dtype()
    if x.ndim == 0:
        return cast(x, out)
    return cast(jnp.cumprod(_acc(x, out), axis=dim % x.ndim), out)


def _cum_extreme(x, dim, largest: bool):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    d = dim % x.ndim
    n = x.shape[d]
    idx = lax.broadcasted_iota(jnp.int64, x.shape, d)

    def combine(a, b):
        va, ia = a
        vb, ib = b
        if jnp.issubdtype(va.dtype, jnp.floating):
            take_b = (vb >= va) if largest else (vb <= va)
            take_b = (take_b | jnp.isnan(vb)) & ~jnp.isnan(va)
        else:
            take_b = (vb >= va) if largest else (vb <= va)
        return jnp.where(take_b, vb, va), jnp.where(take_b, ib, ia)

    del n
    return lax.associative_scan(combine, (x, idx), axis=d)


@lower(aten.cummax.default)
def cummax(x, dim):
    return _cum_extreme(x, dim, True)


@lower(aten.cummin.default)
def cummin(x, dim):
    return _cum_extreme(x, dim, False)
