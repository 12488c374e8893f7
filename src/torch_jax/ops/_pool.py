"""Pooling: max (with indices), average, adaptive, fractional, and max-unpooling, with
their backward ops. Windows of fixed size are lax.reduce_window; windows whose bounds vary
(adaptive, fractional) are gathered one spatial axis at a time."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from torch_jax.ops import _context
from torch_jax.ops._promote import LOW_PRECISION as _LOW
from torch_jax.ops._registry import aten, lower
from torch_jax.tensor import _storage


def _expand(v, nd):
    v = list(v)
    return v * nd if len(v) == 1 else v


def _pool_geometry(x, kernel_size, stride, padding, dilation, ceil_mode):
    nd = len(kernel_size)
    k = _expand(kernel_size, nd)
    s = _expand(stride, nd) if stride else k
    p = _expand(padding, nd)
    d = _expand(dilation, nd)
    spatial = x.shape[-nd:]
    out = []
    for n, kk, ss, pp, dd in zip(spatial, k, s, p, d):
        eff = dd * (kk - 1) + 1
        num = n + 2 * pp - eff
        o = (num + (ss - 1 if ceil_mode else 0)) // ss + 1
        if ceil_mode and (o - 1) * ss >= n + pp:
            o -= 1
        out.append(o)
    return k, s, p, d, out


def _window_args(x, k, s, p, d, out):
    """reduce_window arguments for a pooling window over the last len(k) dims, padded
    so that the output has PyTorch's size ``out`` (ceil_mode pads on the right)."""
    nd = len(k)
    batch = x.ndim - nd
    spatial = x.shape[batch:]
    hi = [max((o - 1) * ss + dd * (kk - 1) + 1 - n - pp, 0) for o, ss, dd, kk, n, pp in zip(out, s, d, k, spatial, p)]
    return dict(
        window_dimensions=(1,) * batch + tuple(k),
        window_strides=(1,) * batch + tuple(s),
        padding=((0, 0),) * batch + tuple(zip(p, hi)),
        window_dilation=(1,) * batch + tuple(d),
    )


def _crop(y, out):
    nd = len(out)
    return y[(Ellipsis,) + tuple(slice(0, o) for o in out)] if tuple(y.shape[-nd:]) != tuple(out) else y


def _min_value(dtype):
    if jnp.issubdtype(dtype, jnp.floating):
        return -jnp.inf
    return jnp.iinfo(dtype).min


def _argmax_pair(a, b):
    """Combine (value, index) pairs the way PyTorch's max-pool scans a window: the
    larger value wins, ties go to the first index, NaN beats numbers (the last NaN)."""
    av, ai = a
    bv, bi = b
    a_nan, b_nan = av != av, bv != bv
    take_b = jnp.where(
        a_nan | b_nan,
        b_nan & (~a_nan | (bi > ai)),
        (bv > av) | ((bv == av) & (bi < ai)),
    )
    return jnp.where(take_b, bv, av), jnp.where(take_b, bi, ai)


def _max_pool(x, kernel_size, stride, padding, dilation, ceil_mode, nd):
    k, s, p, d, out = _pool_geometry(x, _expand(kernel_size, nd), stride, padding, dilation, ceil_mode)
    if int(np.prod(k)) <= _SCANNED_WINDOWS:
        return _max_pool_scan(x, k, s, p, d, out)
    idx = _flat_plane(x.shape, nd)
    init = (jnp.asarray(_min_value(x.dtype), x.dtype), jnp.asarray(np.iinfo(np.int64).max, jnp.int64))
    vals, inds = lax.reduce_window((x, idx), init, _argmax_pair, **_window_args(x, k, s, p, d, out))
    return _crop(vals, out), _crop(inds, out)


# NOTE [Max pooling as a scan of its window]: a reduce_window over (value, index) pairs
# is XLA's generic variadic reduce_window, slow on XLA:CPU: ResNet's 3x3 stride-2 pool
# over 16x64x32x32 took 5.3-6.9 ms. A window of up to this many elements is instead
# scanned as PyTorch's kernel scans it: one strided slice of the padded input per window
# offset, in row-major order, each replacing the running maximum where it is larger or
# NaN; the running index starts at the window's first element inside the input (so an
# all -inf window points there) and its values are static. XLA fuses the scan into one
# loop: 1.9-2.3 ms for the same pool. Larger windows keep the reduce_window.
_SCANNED_WINDOWS = 64


def _max_pool_scan(x, k, s, p, d, out):
    nd = len(k)
    batch = x.ndim - nd
    spatial = x.shape[batch:]
    low = jnp.asarray(_min_value(x.dtype), x.dtype)
    if 0 in out:
        return jnp.full(x.shape[:batch] + tuple(out), low), jnp.zeros(x.shape[:batch] + tuple(out), jnp.int64)
    pads = _window_args(x, k, s, p, d, out)["padding"]
    xp = lax.pad(x, low, [(lo, hi, 0) for lo, hi in pads])
    flat = _storage.contiguous_strides(spatial)
    steps = []  # per window offset: (slice of xp, inside the input, flat input index)
    for off in itertools.product(*(range(kn) for kn in k)):
        inside = np.ones(out, bool)
        index = np.zeros(out, np.int64)
        for a in range(nd):
            c = (np.arange(out[a]) * s[a] + off[a] * d[a] - p[a]).reshape([-1 if b == a else 1 for b in range(nd)])
            inside = inside & (c >= 0) & (c < spatial[a])
            index = index + c * flat[a]
        start = [0] * batch + [o * dd for o, dd in zip(off, d)]
        limit = list(x.shape[:batch]) + [st + (o - 1) * ss + 1 for st, o, ss in zip(start[batch:], out, s)]
        steps.append((lax.slice(xp, start, limit, [1] * batch + list(s)), inside, index))
    first = np.full(out, -1, np.int64)
    for _, inside, index in steps:
        first = np.where((first < 0) & inside, index, first)
    vals = jnp.full(x.shape[:batch] + tuple(out), low)
    inds = jnp.broadcast_to(jnp.asarray(first), vals.shape)
    for v, inside, index in steps:
        larger = (v > vals) | (v != v) if jnp.issubdtype(x.dtype, jnp.inexact) else v > vals
        take = larger & inside
        vals, inds = jnp.where(take, v, vals), jnp.where(take, index, inds)
    return vals, inds


def _max_pool_backward(g, x, indices, nd):
    plane = int(np.prod(x.shape[-nd:]))
    rows = int(np.prod(x.shape[:-nd]))
    # in the gradient's dtype, each element's updates in output order: the CPU kernel's
    # sums, bit for bit also in bfloat16 and float16 (it adds into grad_input directly)
    gi = jnp.zeros((rows, plane), g.dtype)
    gi = gi.at[jnp.arange(rows)[:, None], indices.reshape(rows, -1)].add(g.reshape(rows, -1))
    return gi.reshape(x.shape)


@lower(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(x, kernel_size, stride, padding, dilation, ceil_mode, 2)


@lower(aten.max_pool3d_with_indices.default)
def max_pool3d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(x, kernel_size, stride, padding, dilation, ceil_mode, 3)


@lower(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_with_indices_backward(g, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _max_pool_backward(g, x, indices, 2)


@lower(aten.max_pool3d_with_indices_backward.default)
def max_pool3d_with_indices_backward(g, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _max_pool_backward(g, x, indices, 3)


def _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, nd):
    k, s, p, d, out = _pool_geometry(x, _expand(kernel_size, nd), stride, padding, [1] * nd, ceil_mode)
    xf = x.astype(jnp.float32) if x.dtype in _LOW else x
    # a concrete (numpy) init value: with a traced one, lax.reduce_window is the generic
    # reduction, which has no transpose rule (the backward is this function's vjp)
    zero = np.zeros((), xf.dtype)
    total = _crop(lax.reduce_window(xf, zero, lax.add, **_window_args(xf, k, s, p, d, out)), out)
    if divisor_override:
        return (total / divisor_override).astype(x.dtype)
    # window sizes: clipped to the padded input (count_include_pad) or to the input
    spatial = x.shape[-nd:]
    counts = np.ones(out, np.float64)
    for axis in range(nd):
        starts = np.arange(out[axis]) * s[axis] - p[axis]
        ends = np.minimum(starts + k[axis], spatial[axis] + p[axis])
        if not count_include_pad:
            starts, ends = np.maximum(starts, 0), np.minimum(ends, spatial[axis])
        shape = [1] * nd
        shape[axis] = out[axis]
        counts = counts * (ends - starts).reshape(shape)
    return (total / jnp.asarray(counts, total.dtype)).astype(x.dtype)


def _avg_pool_ops(nd: int, forward, backward):
    """avg_pool{nd}d and its backward (the vector-Jacobian product of the forward)."""

    def pool(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
        return _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, nd)

    def pool_backward(g, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
        _, vjp = jax.vjp(
            lambda x_: _avg_pool(x_, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, nd),
            x,
        )
        return vjp(g.astype(x.dtype))[0]

    lower(forward)(pool)
    lower(backward)(pool_backward)


_avg_pool_ops(2, aten.avg_pool2d.default, aten.avg_pool2d_backward.default)
_avg_pool_ops(3, aten.avg_pool3d.default, aten.avg_pool3d_backward.default)


def _adaptive_avg(x, output_size):
    nd = len(output_size)
    xf = x.astype(jnp.float32) if x.dtype in _LOW else x
    for axis, o in enumerate(output_size):
        ax = x.ndim - nd + axis
        n = x.shape[ax]
        pieces = []
        for i in range(o):
            start, end = (i * n) // o, -(-((i + 1) * n) // o)
            pieces.append(jnp.mean(lax.slice_in_dim(xf, start, end, axis=ax), axis=ax, keepdims=True))
        xf = jnp.concatenate(pieces, axis=ax)
    return xf.astype(x.dtype)


@lower(aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool3d.default)
def adaptive_avg_pool(x, output_size):
    return _adaptive_avg(x, list(output_size))


def _adaptive_avg_backward(nd: int):
    def backward(g, x):
        _, vjp = jax.vjp(lambda x_: _adaptive_avg(x_, list(g.shape[-nd:])), x)
        return vjp(g.astype(x.dtype))[0]

    return backward


lower(aten._adaptive_avg_pool2d_backward.default)(_adaptive_avg_backward(2))
lower(aten._adaptive_avg_pool3d_backward.default)(_adaptive_avg_backward(3))


# ---------------------------------------------------------------- windows of varying bounds


def _flat_plane(shape, nd):
    """Each element's flat index within its spatial plane (the last nd dims), as int64."""
    spatial = shape[-nd:]
    strides = _storage.contiguous_strides(spatial)
    plane = sum(lax.broadcasted_iota(jnp.int64, spatial, a) * strides[a] for a in range(nd))
    return jnp.broadcast_to(plane, shape)


def _window_max(x, windows):
    """Max and flat argmax over windows given per spatial axis: ``windows[i]`` is a pair
    (start, k) with start of shape lead + (o,) (lead: the batch dims or none), the window
    on that axis being start + [0, k). Reduced one axis at a time with PyTorch's
    tie/NaN rule (_argmax_pair), which makes the separable result equal the joint one."""
    nd = len(windows)
    vals, inds = x, _flat_plane(x.shape, nd)
    low = jnp.asarray(_min_value(x.dtype), x.dtype)
    top = jnp.asarray(np.iinfo(np.int64).max, jnp.int64)
    for i, (start, k, end) in enumerate(windows):
        ax = x.ndim - nd + i
        n = vals.shape[ax]
        o = start.shape[-1]
        pos = start[..., None] + jnp.arange(k)  # lead + (o, k)
        valid = pos < end[..., None]
        lead = start.ndim - 1
        shape = pos.shape[:-2] + (1,) * (ax - lead) + (o * k,) + (1,) * (vals.ndim - ax - 1)
        idx = jnp.clip(pos, 0, n - 1).reshape(shape)
        ok = valid.reshape(shape)
        flat = vals.shape[:ax] + (o * k,) + vals.shape[ax + 1 :]
        windowed = vals.shape[:ax] + (o, k) + vals.shape[ax + 1 :]
        gv = jnp.where(ok, jnp.take_along_axis(vals, idx, axis=ax), low)
        gi = jnp.where(ok, jnp.take_along_axis(inds, idx, axis=ax), top)
        gv = jnp.broadcast_to(gv, flat).reshape(windowed)
        gi = jnp.broadcast_to(gi, flat).reshape(windowed)
        vals, inds = lax.reduce((gv, gi), (low, top), _argmax_pair, (ax + 1,))
    return vals, inds


def _adaptive_windows(sizes, output_size):
    """PyTorch's adaptive windows: [floor(i n / o), ceil((i + 1) n / o))."""
    windows = []
    for n, o in zip(sizes, output_size):
        starts = np.array([(i * n) // o for i in range(o)], np.int64)
        ends = np.array([-(-((i + 1) * n) // o) for i in range(o)], np.int64)
        k = int(max(ends - starts, default=1)) if o else 1
        windows.append((jnp.asarray(starts), k, jnp.asarray(ends)))
    return windows


@lower(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)
def adaptive_max_pool(x, output_size):
    output_size = list(output_size)
    return _window_max(x, _adaptive_windows(x.shape[-len(output_size) :], output_size))


@lower(aten.adaptive_max_pool2d_backward.default)
def adaptive_max_pool2d_backward(g, x, indices):
    return _max_pool_backward(g, x, indices, 2)


@lower(aten.adaptive_max_pool3d_backward.default)
def adaptive_max_pool3d_backward(g, x, indices):
    return _max_pool_backward(g, x, indices, 3)


def _fractional_windows(x, kernel_size, output_size, samples):
    """PyTorch's pseudo-random window starts: for a sample u in [0, 1) and
    alpha = (n - k) / (o - 1), start_i = int((i + u) alpha) - int(u alpha), the last
    window ending at the input's end. ``samples`` is (N, C, nd), ordered (W, H) in 2-D
    but (T, H, W) in 3-D, as the CPU kernels read them; rows past the input's batch are
    not read (an input without a batch dim reads row 0)."""
    nd = len(kernel_size)
    lead = x.shape[:-nd]
    batch = lead[0] if len(lead) == 2 else 1
    samples = samples[:batch].reshape(lead + (nd,))
    windows = []
    for i, (n, k, o) in enumerate(zip(x.shape[-nd:], kernel_size, output_size)):
        u = samples[..., nd - 1 - i if nd == 2 else i][..., None]  # lead + (1,)
        if o > 1:
            alpha = jnp.asarray((n - k) / (o - 1), samples.dtype)
            j = jnp.arange(o, dtype=samples.dtype)
            starts = ((j + u) * alpha).astype(jnp.int64) - (u * alpha).astype(jnp.int64)
            starts = jnp.where(jnp.arange(o) == o - 1, n - k, starts)
        else:
            starts = jnp.full(lead + (o,), n - k, jnp.int64)
        windows.append((starts, k, starts + k))
    return windows


@lower(aten.fractional_max_pool2d.default, aten.fractional_max_pool3d.default)
def fractional_max_pool(x, kernel_size, output_size, random_samples):
    kernel_size, output_size = list(kernel_size), list(output_size)
    return _window_max(x, _fractional_windows(x, kernel_size, output_size, random_samples))


@lower(aten.fractional_max_pool2d_backward.default)
def fractional_max_pool2d_backward(g, x, kernel_size, output_size, indices):
    return _max_pool_backward(g, x, indices, 2)


@lower(aten.fractional_max_pool3d_backward.default)
def fractional_max_pool3d_backward(g, x, kernel_size, output_size, indices):
    return _max_pool_backward(g, x, indices, 3)


# ---------------------------------------------------------------- unpooling


def _max_unpool(x, indices, output_size):
    nd = len(output_size)
    plane = int(np.prod(output_size))
    lead = x.shape[: x.ndim - nd]
    rows = int(np.prod(lead))
    idx = indices.reshape(rows, -1).astype(jnp.int64)
    bad = (idx < 0) | (idx >= plane)
    _context.check(jnp.any(bad), RuntimeError, "Found an invalid max index: {value}", jnp.max(jnp.where(bad, idx, -1)))
    out = jnp.zeros((rows, plane), x.dtype).at[jnp.arange(rows)[:, None], idx].set(x.reshape(rows, -1), mode="drop")
    return out.reshape(lead + tuple(output_size))


@lower(aten.max_unpool2d.default)
def max_unpool2d(x, indices, output_size):
    return _max_unpool(x, indices, list(output_size))


@lower(aten.max_unpool3d.default)
def max_unpool3d(x, indices, output_size, stride, padding):
    return _max_unpool(x, indices, list(output_size))
