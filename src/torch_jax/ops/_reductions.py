"""Reductions: sum, mean, prod, min/max (with indices), var/std, any/all, norms,
logsumexp, cumulative ops.

Floating reductions of float16/bfloat16 accumulate in float32, as PyTorch does.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from torch_jax.ops import _context
from torch_jax.ops._promote import LOW_PRECISION as _LOW
from torch_jax.ops._promote import cast
from torch_jax.ops._registry import aten, lower


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


# NOTE [Column sums on XLA:CPU]: XLA:CPU sums over leading axes (a Linear layer's bias
# gradient: the output's gradient summed over its rows) at under 1 GB/s once the kept
# trailing extent passes some 16K elements, against 13-17 GB/s below, and
# sequentially: measured on a 2-core Xeon, x.sum(0) of a (700, 33278) float32 array (the
# word language model's decoder bias) 214-229 ms against PyTorch's 7.5 ms, 5.6x its
# error against a float64 sum (1.0e-4 against 1.9e-5); (700, 32768) 113 ms, (100,
# 33278) 31 ms, (8, 2.9M) 174 ms, where (700, 8192) takes 1.3 ms. So on the CPU such a sum
# adds halves of the rows, a pairwise tree: each level a contiguous elementwise add.
# (700, 33278): 24 ms, its error 1.3e-5; (100000, 64), below the threshold, keeps XLA's.
_WIDE = 16384


def _leading_sum(x, reduced: int):
    """The sum of ``x`` over its first ``reduced`` axes (its leading axes)."""
    kept = x.shape[reduced:]
    n = math.prod(x.shape[:reduced])
    if n == 0 or math.prod(kept) < _WIDE:
        return jnp.sum(x, axis=tuple(range(reduced)))
    rows = x.reshape(n, *kept)

    def pairwise(rows):
        extra = None
        while rows.shape[0] > 1:
            half = rows.shape[0] // 2
            if rows.shape[0] % 2:
                extra = rows[-1] if extra is None else extra + rows[-1]
            rows = rows[:half] + rows[half : 2 * half]
        total = rows[0] if extra is None else rows[0] + extra
        return jnp.where(total == 0, jnp.zeros((), total.dtype), total)  # (a sum of -0.0s is +0.0, as in PyTorch)

    return lax.platform_dependent(rows, cpu=pairwise, default=lambda rows: jnp.sum(rows, axis=0))


def _sum(x, axis, keepdims):
    """``jnp.sum``, with sums over leading axes of a wide array as NOTE [Column sums on
    XLA:CPU] says."""
    reduced = len(axis)
    if not reduced or axis != tuple(range(reduced)) or reduced == x.ndim or jnp.iscomplexobj(x):
        return jnp.sum(x, axis=axis, keepdims=keepdims)
    total = _leading_sum(x, reduced)
    return total.reshape((1,) * reduced + total.shape) if keepdims else total


@lower(aten.sum.dim_IntList)
def sum_dim(x, dim, keepdim=False, dtype=None):
    out = _context.out_dtype()
    x = _acc(x, out)
    return cast(_sum(x, axes(x, dim), keepdim), out)


@lower(aten.sum.default)
def sum_all(x, dtype=None):
    return sum_dim(x, None, False, dtype)


@lower(aten.mean.dim)
def mean_dim(x, dim, keepdim=False, dtype=None):
    out = _context.out_dtype()
    x = _acc(x, out)
    if jnp.iscomplexobj(x):
        # the CPU multiplies the sum by the complex number 1/n + 0j, so an infinite real
        # part gives a NaN imaginary part (inf * 0), even for n = 1
        total = jnp.sum(x, axis=axes(x, dim), keepdims=keepdim)
        n = max(x.size // max(total.size, 1), 1) if x.size else 0
        c = jnp.asarray(1 / n if n else jnp.nan, total.real.dtype)
        zero = jnp.zeros((), total.real.dtype)
        mean = lax.complex(total.real * c - total.imag * zero, total.real * zero + total.imag * c)
        return cast(mean, out)
    return cast(jnp.mean(x, axis=axes(x, dim), keepdims=keepdim), out)


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


def p_norm(xa, ord, ax, keepdim=False):
    """The ``ord``-norm of the absolute values ``xa`` over axes ``ax``, as torch.linalg.vector_norm."""
    if ord == float("inf"):
        return jnp.max(xa, axis=ax, keepdims=keepdim)
    if ord == float("-inf"):
        return jnp.min(xa, axis=ax, keepdims=keepdim)
    if ord == 0:
        return jnp.sum((xa != 0).astype(xa.dtype), axis=ax, keepdims=keepdim)
    if ord == 1:
        return jnp.sum(xa, axis=ax, keepdims=keepdim)
    if ord == 2:
        return jnp.sqrt(jnp.sum(xa * xa, axis=ax, keepdims=keepdim))
    return jnp.sum(xa**ord, axis=ax, keepdims=keepdim) ** (1.0 / ord)


@lower(aten.linalg_vector_norm.default, static=("ord",))
def linalg_vector_norm(x, ord=2, dim=None, keepdim=False, dtype=None):
    out = _context.out_dtype()
    xa = jnp.abs(_acc(x, np.dtype(jnp.float32) if x.dtype in _LOW else x.dtype))
    return cast(p_norm(xa, ord, axes(x, dim), keepdim), out)


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


@lower(aten.aminmax.default)
def aminmax(x, dim=None, keepdim=False):
    ax = axes(x, dim)
    if dim is None and keepdim:  # every dim reduced and kept
        return _nan_min(x, ax, True), _nan_max(x, ax, True)
    return _nan_min(x, ax, keepdim), _nan_max(x, ax, keepdim)


@lower(aten.count_nonzero.dim_IntList)
def count_nonzero(x, dim):
    return jnp.sum(x != 0, axis=axes(x, dim), dtype=jnp.int64)


@lower(aten.nansum.default)
def nansum(x, dim=None, keepdim=False, dtype=None):
    out = _context.out_dtype()
    xa = _acc(x, out)
    if jnp.issubdtype(xa.dtype, jnp.inexact):
        xa = jnp.where(jnp.isnan(xa), jnp.zeros((), xa.dtype), xa)
    return cast(jnp.sum(xa, axis=axes(x, dim), keepdims=keepdim), out)


def _log_add_exp(a, b):
    """The CPU's logcumsumexp step: log(exp(a) + exp(b)), exact for equal infinities."""
    if jnp.iscomplexobj(a):
        return _log_add_exp_complex(a, b)
    lo = jnp.where(jnp.isnan(b), b, jnp.minimum(a, b))
    hi = jnp.where(jnp.isnan(b), b, jnp.maximum(a, b))
    general = jnp.log1p(jnp.exp(lo - hi)) + hi
    return jnp.where((lo != hi) | jnp.isfinite(lo), general, a)


def _log_add_exp_complex(a, b):
    # ordered by real part; NaN anywhere gives NaN; equal infinite real parts are special
    a_nan = jnp.isnan(a.real) | jnp.isnan(a.imag)
    b_nan = jnp.isnan(b.real) | jnp.isnan(b.imag)
    swap = b.real < a.real
    lo, hi = jnp.where(swap, b, a), jnp.where(swap, a, b)
    nan = jnp.asarray(complex(np.nan, np.nan), a.dtype)
    both_inf = ~jnp.isfinite(lo.real) & (lo.real == hi.real)
    general = jnp.log1p(jnp.exp(lo - hi)) + hi
    inf_case = jnp.where(lo.real < 0, lo, jnp.log(jnp.exp(lo) + jnp.exp(hi)))
    return jnp.where(a_nan | b_nan, nan, jnp.where(both_inf, inf_case, general))


@lower(aten._logcumsumexp.default)
def logcumsumexp(x, dim):
    if x.ndim == 0:
        return x
    # the CPU accumulates in its accumulate type: double for float, float for half
    wide = _CPU_ACC.get(np.dtype(x.dtype), x.dtype)
    return cast(lax.associative_scan(_log_add_exp, x.astype(wide), axis=dim % x.ndim), x.dtype)


_CPU_ACC = {
    np.dtype(jnp.float16): jnp.float32,
    np.dtype(jnp.bfloat16): jnp.float32,
    np.dtype(jnp.float32): jnp.float64,
    np.dtype(jnp.complex64): jnp.complex128,
}


def axes_except(x, dim):
    """Every axis of x but `dim` (any sign)."""
    d = dim % max(x.ndim, 1)
    return tuple(i for i in range(x.ndim) if i != d)


@lower(aten.renorm.default, static=("p", "maxnorm"))
def renorm(x, p, dim, maxnorm):
    others = axes_except(x, dim)
    xa = x.astype(jnp.float32) if x.dtype in _LOW else x
    a = jnp.abs(xa)
    if p == float("inf"):
        norm = jnp.max(a, axis=others, keepdims=True, initial=0)
    elif p == 0:
        norm = jnp.sum((a != 0).astype(a.dtype), axis=others, keepdims=True)
    else:
        norm = jnp.sum(a**p, axis=others, keepdims=True) ** (1.0 / p)
    # the CPU compares and divides in double: maxnorm / (norm + eps)
    factor = jnp.where(norm > maxnorm, maxnorm / (norm + jnp.asarray(1e-7, norm.dtype)).astype(jnp.float64), 1.0)
    real = jnp.real(x).dtype
    return x * factor.astype(real)


# ---------------------------------------------------------------- segment reductions


def _segments(data, lengths, offsets, axis):
    """Start and end (exclusive) of every segment, (lead..., S), from lengths or offsets."""
    if offsets is None:
        lengths = lengths.astype(jnp.int64)
        ends = jnp.cumsum(lengths, axis=-1)
        return ends - lengths, ends
    offsets = offsets.astype(jnp.int64)
    return offsets[..., :-1], offsets[..., 1:]


def _segment_mask(data, starts, ends, axis):
    """(lead..., S, N): element n of the reduced axis belongs to segment s."""
    n = data.shape[axis]
    pos = jnp.arange(n, dtype=jnp.int64)
    return (pos >= starts[..., None]) & (pos < ends[..., None])


def _expand(mask, data, axis):
    """The (lead..., S, N) mask broadcast against data (lead..., N, inner...) as
    (lead..., S, N, inner...)."""
    inner = data.ndim - axis - 1
    return mask.reshape(mask.shape + (1,) * inner)


_SEGMENT_NAMES = {"amax": "max", "amin": "min"}  # (PyTorch's reduction names: the same reductions)


@lower(aten.segment_reduce.default, static=("initial",))
def segment_reduce(data, reduce, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None):
    ax = axis % data.ndim
    dt = data.dtype
    reduce = _SEGMENT_NAMES.get(reduce, reduce)
    xa = data.astype(jnp.float32) if dt in _LOW else data
    starts, ends = _segments(data, lengths, offsets, ax)
    m = _expand(_segment_mask(data, starts, ends, ax), data, ax)  # (lead..., S, N, inner...)
    x = jnp.expand_dims(xa, ax)  # (lead..., 1, N, inner...)
    red = ax + 1
    if reduce in ("max", "min"):
        fill = -jnp.inf if reduce == "max" else jnp.inf
        r = (jnp.max if reduce == "max" else jnp.min)(jnp.where(m, x, fill), axis=red)
        r = jnp.where(jnp.any(m & jnp.isnan(x), axis=red), jnp.nan, r)
        if initial is not None:
            r = jnp.maximum(r, initial) if reduce == "max" else jnp.minimum(r, initial)
    elif reduce == "prod":
        r = jnp.prod(jnp.where(m, x, 1), axis=red) * (1 if initial is None else initial)
    else:  # sum, mean
        r = jnp.sum(jnp.where(m, x, 0), axis=red) + (0 if initial is None else initial)
        if reduce == "mean":
            count = (ends - starts).reshape((ends - starts).shape + (1,) * (data.ndim - ax - 1)).astype(r.dtype)
            empty = jnp.nan if initial is None else initial
            r = jnp.where(count > 0, r / jnp.maximum(count, 1), empty)
    return r.astype(dt)


@lower(aten._segment_reduce_backward.default, static=("initial",))
def segment_reduce_backward(grad, output, data, reduce, lengths=None, offsets=None, axis=0, initial=None):
    ax = axis % data.ndim
    dt = data.dtype
    reduce = _SEGMENT_NAMES.get(reduce, reduce)
    f = (lambda t: t.astype(jnp.float32)) if dt in _LOW else (lambda t: t)
    g, out, x = f(grad), f(output), f(data)
    starts, ends = _segments(data, lengths, offsets, ax)
    m = _expand(_segment_mask(data, starts, ends, ax), data, ax)  # (lead..., S, N, inner...)
    red = ax  # the segment axis of the (lead..., S, N, inner...) layout
    xe = jnp.expand_dims(x, ax)  # (lead..., 1, N, inner...)
    ge, oe = jnp.expand_dims(g, ax + 1), jnp.expand_dims(out, ax + 1)  # (lead..., S, 1, inner...)
    zero = jnp.zeros((), x.dtype)
    if reduce in ("max", "min"):
        hit = m & jnp.where(jnp.isnan(oe), jnp.isnan(xe), xe == oe)
        count = jnp.sum(hit, axis=ax + 1, keepdims=True)
        # the CPU splits the gradient among tied extremes only where it is positive
        share = jnp.where((count >= 2) & (ge > 0), ge / count, ge)
        gi = jnp.sum(jnp.where(hit, share, zero), axis=red)
    elif reduce in ("sum", "mean"):
        share = ge
        if reduce == "mean":
            n = (ends - starts).reshape((ends - starts).shape + (1,) * (data.ndim - ax)).astype(x.dtype)
            share = ge / jnp.maximum(n, 1)
        gi = jnp.sum(jnp.where(m, share, zero), axis=red)
    else:  # prod: grad * out / x, or the product of the others where x is 0 or NaN
        special = jnp.isnan(xe) | (xe == 0)
        others = jnp.where(m & ~special, xe, 1)
        p_rest = jnp.prod(others, axis=ax + 1, keepdims=True) * (1 if initial is None else initial)
        n_zero = jnp.sum(m & (xe == 0), axis=ax + 1, keepdims=True)
        n_nan = jnp.sum(m & jnp.isnan(xe), axis=ax + 1, keepdims=True)
        own_nan, own_zero = jnp.isnan(xe), xe == 0
        other_nan = (n_nan - own_nan) > 0
        other_zero = (n_zero - own_zero) > 0
        excl = jnp.where(other_nan, jnp.nan, jnp.where(other_zero, zero, p_rest))
        share = jnp.where(special, ge * excl, ge * oe / xe)
        gi = jnp.sum(jnp.where(m, share, zero), axis=red)
    return gi.astype(dt)


@lower(aten.hash_tensor.default)
def hash_tensor(x, dim=(), keepdim=False, mode=0):
    """xor of the elements' 64-bit patterns (floats as double, integers as int64)."""
    if jnp.issubdtype(x.dtype, jnp.floating):
        wide = x.astype(jnp.float64)
    else:
        wide = x.astype(jnp.int64)
    bits = lax.bitcast_convert_type(wide, jnp.uint64)
    ax = axes(x, dim)
    r = lax.reduce(bits, np.uint64(0), lax.bitwise_xor, ax)
    return jnp.expand_dims(r, ax) if keepdim else r
