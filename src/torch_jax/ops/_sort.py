"""Sorting, selection and counting: kthvalue/median/mode, isin, searchsorted/bucketize,
histograms, nonzero_static. (sort and topk live in _shape.)

NOTE [Sort keys]: PyTorch sorts NaN as the largest value and treats -0.0 and 0.0 as
equal (a stable sort keeps their order), while XLA's sort orders floats totally
(-0.0 < 0.0). So floats sort on two keys, (is NaN, value with -0.0 made 0.0); a
descending sort negates the keys (``~x`` for integers, which cannot overflow), so
that a stable sort keeps equal elements in their original order either way.

NOTE [Ties in selection]: the CPU's kthvalue (a quickselect) and median (std::nth_element)
return the index of *some* element equal to the result; which one depends on the
partitioning, not on a rule. Here it is always the stable rank: the (k-1)-th element of
a stable sort. Values always match the CPU; indices match where the values are distinct.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from torch_jax.ops import _context
from torch_jax.ops._promote import cast, is_weak, result_dtype
from torch_jax.ops._registry import aten, lower


def sort_keys(x, descending: bool = False):
    """Sort keys for ``lax.sort`` that order ``x`` as PyTorch does (NOTE [Sort keys])."""
    if jnp.issubdtype(x.dtype, jnp.floating):
        nan = jnp.isnan(x)
        v = jnp.where(nan | (x == 0), jnp.zeros((), x.dtype), x)
        return [~nan, -v] if descending else [nan, v]
    if descending:
        return [~x]
    return [x]


def stable_sort(x, axis: int, descending: bool = False):
    """(sorted values, int64 permutation) of ``x`` along ``axis``, stable."""
    keys = sort_keys(x, descending)
    perm = lax.broadcasted_iota(jnp.int64, x.shape, axis)
    *_, perm = lax.sort((*keys, perm), dimension=axis, is_stable=True, num_keys=len(keys))
    return jnp.take_along_axis(x, perm, axis=axis), perm


def _pick(vals, perm, k, axis, keepdim):
    """Element ``k`` (a static int or an array broadcastable to the kept dims) along ``axis``."""
    k = jnp.broadcast_to(jnp.asarray(k, jnp.int64), vals.shape[:axis] + (1,) + vals.shape[axis + 1 :])
    v = jnp.take_along_axis(vals, k, axis=axis)
    i = jnp.take_along_axis(perm, k, axis=axis)
    if not keepdim:
        v, i = jnp.squeeze(v, axis), jnp.squeeze(i, axis)
    return v, i


@lower(aten.kthvalue.default)
def kthvalue(x, k, dim=-1, keepdim=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    d = dim % x.ndim
    vals, perm = stable_sort(x, d)
    return _pick(vals, perm, k - 1, d, keepdim)


def _median(x, d, keepdim, ignore_nan: bool):
    """Lower median along ``d`` and its index (NOTE [Ties in selection])."""
    n = x.shape[d]
    vals, perm = stable_sort(x, d)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return _pick(vals, perm, (n - 1) // 2, d, keepdim)
    nan = jnp.isnan(x)
    if ignore_nan:
        # the median of the non-NaN values; all NaN: the first of the sorted NaNs (C's (-1)/2 == 0)
        valid = jnp.sum(~nan, axis=d, keepdims=True)
        return _pick(vals, perm, jnp.maximum(valid - 1, 0) // 2, d, keepdim)
    v, i = _pick(vals, perm, (n - 1) // 2, d, keepdim)
    # torch.median returns the first NaN of a slice that has one
    has_nan = jnp.any(nan, axis=d, keepdims=keepdim)
    first_nan = jnp.argmax(nan, axis=d, keepdims=keepdim).astype(jnp.int64)
    return jnp.where(has_nan, jnp.nan, v).astype(x.dtype), jnp.where(has_nan, first_nan, i)


@lower(aten.median.dim)
def median_dim(x, dim, keepdim=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    return _median(x, dim % x.ndim, keepdim, False)


@lower(aten.nanmedian.dim)
def nanmedian_dim(x, dim, keepdim=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    return _median(x, dim % x.ndim, keepdim, True)


def _median_all(x, ignore_nan):
    if x.size == 0:  # the CPU returns NaN for an empty input
        return jnp.full((), jnp.nan, x.dtype) if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.zeros((), x.dtype)
    return _median(x.reshape(-1), 0, False, ignore_nan)[0]


@lower(aten.median.default)
def median(x):
    return _median_all(x, False)


@lower(aten.nanmedian.default)
def nanmedian(x):
    return _median_all(x, True)


@lower(aten.mode.default)
def mode(x, dim=-1, keepdim=False):
    """The most frequent value (the smallest among equally frequent ones) and the index of
    its last occurrence (the CPU's insertion sort for short slices keeps equal values in
    order and takes the last one)."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    d = dim % x.ndim
    n = x.shape[d]
    if n == 0:
        shape = x.shape[:d] + ((1,) if keepdim else ()) + x.shape[d + 1 :]
        return jnp.zeros(shape, x.dtype), jnp.zeros(shape, jnp.int64)
    vals, perm = stable_sort(x, d)
    pos = lax.broadcasted_iota(jnp.int64, x.shape, d)
    prev = jnp.concatenate([lax.slice_in_dim(vals, 0, 1, axis=d), lax.slice_in_dim(vals, 0, n - 1, axis=d)], axis=d)
    nxt = jnp.concatenate([lax.slice_in_dim(vals, 1, n, axis=d), lax.slice_in_dim(vals, n - 1, n, axis=d)], axis=d)
    starts = (pos == 0) | (vals != prev)
    ends = (pos == n - 1) | (vals != nxt)
    run_start = lax.cummax(jnp.where(starts, pos, 0), axis=d)
    count = jnp.where(ends, pos - run_start + 1, 0)  # (..., n, ...): run length at each run's last element
    best = jnp.argmax(count, axis=d, keepdims=True)  # the first (smallest) of the most frequent
    v = jnp.take_along_axis(vals, best, axis=d)
    i = jnp.take_along_axis(perm, best, axis=d)
    if not keepdim:
        v, i = jnp.squeeze(v, d), jnp.squeeze(i, d)
    return v, i


# ---------------------------------------------------------------- searching


def lower_bound(seq, vals, right: bool, sorter=None):
    """Per element of ``vals`` the insertion point into ``seq`` (sorted along its last
    axis; 1-D, or with the leading dims of ``vals``), found by the CPU's binary search
    with its own comparisons, so that NaN (in ``vals`` or ``seq``) lands where it does
    on the CPU."""
    n = seq.shape[-1]
    if seq.ndim == 1:
        seq = jnp.broadcast_to(seq, vals.shape[:-1] + (n,)) if vals.ndim else seq
        if sorter is not None:
            sorter = jnp.broadcast_to(sorter, seq.shape)
    flat_vals = vals if vals.ndim else vals.reshape(1)
    lo = jnp.zeros(flat_vals.shape, jnp.int64)
    hi = jnp.full(flat_vals.shape, n, jnp.int64)
    for _ in range(max(n, 1).bit_length()):
        mid = (lo + hi) // 2
        at = jnp.clip(mid, 0, max(n - 1, 0))
        if sorter is not None:
            at = jnp.take_along_axis(sorter.astype(jnp.int64), at, axis=-1)
        mv = jnp.take_along_axis(seq, at, axis=-1) if n else jnp.zeros_like(flat_vals)
        go_right = ~(mv > flat_vals) if right else ~(mv >= flat_vals)
        active = lo < hi
        lo = jnp.where(active & go_right, mid + 1, lo)
        hi = jnp.where(active & ~go_right, mid, hi)
    return lo.reshape(vals.shape)


def _search_dtype(a, b):
    """searchsorted promotes with ``promoteTypes``: a Python scalar counts as int64 or double."""

    def dt(x):
        if is_weak(x):
            kind = np.dtype(x.dtype).kind if hasattr(x, "dtype") else np.dtype(type(x)).kind
            return {"b": jnp.bool_, "i": jnp.int64, "u": jnp.int64, "f": jnp.float64}[kind]
        return x.dtype

    return jnp.promote_types(dt(a), dt(b))


def _searchsorted(seq, x, out_int32, right, side, sorter):
    if side is not None:
        right = side == "right"
    dt = _search_dtype(seq, x)
    x = cast(x, dt)
    return lower_bound(cast(seq, dt), x, right, sorter)


@lower(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def searchsorted(seq, x, out_int32=False, right=False, side=None, sorter=None):
    return _searchsorted(seq, x, out_int32, right, side, sorter)


@lower(aten.bucketize.Tensor, aten.bucketize.Scalar)
def bucketize(x, boundaries, out_int32=False, right=False):
    return _searchsorted(boundaries, x, out_int32, right, None, None)


@lower(aten.isin.Tensor_Tensor, aten.isin.Tensor_Scalar, aten.isin.Scalar_Tensor)
def isin(elements, test, assume_unique=False, invert=False):
    dt = result_dtype(elements, test)
    e, t = cast(elements, dt), cast(test, dt).reshape(-1)
    if t.size == 0:
        found = jnp.zeros(e.shape, jnp.bool_)
    else:
        t = jnp.sort(jnp.where(t == 0, jnp.zeros((), dt), t))  # -0.0 as 0.0; NaN last, never found
        keys = jnp.where(jnp.isnan(t), jnp.inf, t) if jnp.issubdtype(dt, jnp.floating) else t
        pos = jnp.clip(lower_bound(keys, e.reshape(-1), False), 0, t.size - 1)
        found = (t[pos] == e.reshape(-1)).reshape(e.shape)
    return found != invert


# ---------------------------------------------------------------- histograms


def _linspace(lo, hi, steps: int, dtype):
    """PyTorch's CPU linspace in ``dtype`` arithmetic: the first half counts up from
    ``lo``, the second half down from ``hi``."""
    lo, hi = jnp.asarray(lo, dtype), jnp.asarray(hi, dtype)
    if steps == 1:
        return lo.reshape(1)
    step = (hi - lo) / jnp.asarray(steps - 1, dtype)
    i = jnp.arange(steps)
    up = lo + step * i.astype(dtype)
    down = hi - step * (steps - 1 - i).astype(dtype)
    return jnp.where(i < steps // 2, up, down)


def _bin_index(x, lo, hi, edges, nbins: int, local_search: bool):
    """The CPU's histogram bin of each element: linear interpolation (then a look at
    the neighbouring edges for ``histogram``); -1 where the element is outside [lo, hi]."""
    pos = jnp.trunc((x - lo) * jnp.asarray(nbins, x.dtype) / (hi - lo)).astype(jnp.int64)
    inside = (x >= lo) & (x <= hi)
    pos = jnp.where(inside, pos, 0)
    if local_search:
        # upper_bound over edges[pos-1 : pos+2]
        base = jnp.maximum(pos - 1, 0)
        stop = jnp.minimum(pos + 2, nbins + 1)
        p = base
        for j in range(3):
            e = edges[jnp.clip(base + j, 0, nbins)]
            p = jnp.where((base + j < stop) & (e <= x), base + j + 1, p)
        pos = p - 1
    pos = jnp.where(pos == nbins, nbins - 1, pos)
    return jnp.where(inside, pos, -1)


def _count(bins, nbins: int, weight, dtype):
    """Histogram of bin indices (-1: skipped)."""
    w = jnp.ones(bins.shape, dtype) if weight is None else weight.astype(dtype)
    w = jnp.where(bins >= 0, w, jnp.zeros((), dtype))
    return jnp.zeros((nbins,), dtype).at[jnp.clip(bins, 0, nbins - 1)].add(w)


def _extrema(x, lo, hi, widen: float, from_data: bool):
    """Outer edges: ``lo``/``hi``, or the data's min and max (``from_data``); widened by
    ``widen`` when equal. Checked to be finite, as on the CPU. With no data, [0, 1] (the
    CPU's choice, and NumPy's)."""
    if from_data:
        lo, hi = (jnp.min(x), jnp.max(x)) if x.size else (0.0, 1.0)
    lo, hi = jnp.asarray(lo, x.dtype), jnp.asarray(hi, x.dtype)
    same = lo == hi
    lo, hi = jnp.where(same, lo - widen, lo), jnp.where(same, hi + widen, hi)
    _context.check(
        ~(jnp.isfinite(lo) & jnp.isfinite(hi)), RuntimeError, "histogram: the range of the bins is not finite"
    )
    return lo, hi


@lower(aten.histc.default, static=("min", "max"))
def histc(x, bins=100, min=0, max=0):
    x = x.reshape(-1)
    _context.check(jnp.asarray(min > max), RuntimeError, "torch.histc: max must be larger than min")
    lo, hi = _extrema(x, float(min), float(max), 1.0, min == max)
    return _count(_bin_index(x, lo, hi, None, bins, False), bins, None, x.dtype)


def _density(hist, edges_list):
    """Divide by the total and by each bin's volume."""
    total = jnp.sum(hist)
    hist = hist / total
    for d, e in enumerate(edges_list):
        width = e[1:] - e[:-1]
        shape = [1] * hist.ndim
        shape[d] = width.shape[0]
        hist = hist / width.reshape(shape)
    return hist


def _bin_ct_edges(x, bins, rng):
    """Edges of each of the D dims of ``x`` (N, D) for integer bin counts."""
    edges = []
    for d, nb in enumerate(bins):
        col = x[:, d]
        lo, hi = (rng[2 * d], rng[2 * d + 1]) if rng is not None else (0.0, 0.0)
        lo, hi = _extrema(col, lo, hi, 0.5, rng is None)
        edges.append(_linspace(lo, hi, nb + 1, x.dtype))
    return edges


def _hist_dd(x, edge_list, bins, weight, density, linear: bool):
    """Histogram of ``x`` (N, D) over the given edges (linear: bins of equal width)."""
    x = x.reshape(-1, len(bins))
    flat = jnp.zeros(x.shape[:1], jnp.int64)
    skip = jnp.zeros(x.shape[:1], jnp.bool_)
    for d, (e, nb) in enumerate(zip(edge_list, bins)):
        col = x[:, d]
        if linear:
            b = _bin_index(col, e[0], e[-1], e, nb, True)
        else:
            b = lower_bound(e, col, True) - 1
            b = jnp.where(b == nb, nb - 1, b)
            b = jnp.where((col >= e[0]) & (col <= e[-1]), b, -1)
        skip = skip | (b < 0)
        flat = flat * nb + jnp.maximum(b, 0)
    total = int(np.prod(bins))
    w = None if weight is None else weight.reshape(-1)
    hist = _count(jnp.where(skip, -1, flat), total, w, x.dtype).reshape(tuple(bins))
    return _density(hist, edge_list) if density else hist


@lower(aten._histogramdd_bin_edges.default)
def histogramdd_bin_edges(x, bins, range=None, weight=None, density=False):
    return _bin_ct_edges(x.reshape(-1, x.shape[-1]), bins, range)


@lower(aten._histogramdd_from_bin_cts.default)
def histogramdd_from_bin_cts(x, bins, range=None, weight=None, density=False):
    x2 = x.reshape(-1, x.shape[-1])
    return _hist_dd(x2, _bin_ct_edges(x2, bins, range), list(bins), weight, density, True)


@lower(aten._histogramdd_from_bin_tensors.default)
def histogramdd_from_bin_tensors(x, bins, weight=None, density=False):
    return _hist_dd(x.reshape(-1, x.shape[-1]), bins, [b.shape[0] - 1 for b in bins], weight, density, False)


@lower(aten.histogram.bin_ct)
def histogram_bin_ct(x, bins=100, range=None, weight=None, density=False):
    x2 = x.reshape(-1, 1)
    edges = _bin_ct_edges(x2, [bins], range)
    return _hist_dd(x2, edges, [bins], weight, density, True), edges[0]


@lower(aten.histogram.bins_tensor)
def histogram_bins_tensor(x, bins, weight=None, density=False):
    return _hist_dd(x.reshape(-1, 1), [bins], [bins.shape[0] - 1], weight, density, False), bins


# ---------------------------------------------------------------- selection


@lower(aten.nonzero_static.default)
def nonzero_static(x, size, fill_value=-1):
    if x.ndim == 0:
        idx = jnp.zeros((size, 0), jnp.int64)
        return idx
    if x.size == 0:  # (jnp.nonzero pads an empty input with 0, not fill_value)
        return jnp.full((size, x.ndim), fill_value, jnp.int64)
    cols = jnp.nonzero(x, size=size, fill_value=fill_value)
    return jnp.stack(cols, axis=1).astype(jnp.int64)


@lower(aten.masked_scatter.default)
def masked_scatter(x, mask, source):
    """The k-th True of ``mask`` (row-major) takes the k-th element of ``source``."""
    shape = jnp.broadcast_shapes(x.shape, mask.shape)  # out-of-place: x and mask broadcast together
    x = jnp.broadcast_to(x, shape)
    m = jnp.broadcast_to(mask, shape).reshape(-1)
    k = jnp.cumsum(m) - 1
    src = source.reshape(-1)
    _context.check(
        jnp.sum(m) > src.shape[0],
        RuntimeError,
        "masked_scatter: expected source to have at least as many elements as ones in mask",
    )
    if src.shape[0] == 0:
        return x
    vals = src[jnp.clip(k, 0, src.shape[0] - 1)].astype(x.dtype)
    return jnp.where(m, vals, x.reshape(-1)).reshape(x.shape)
