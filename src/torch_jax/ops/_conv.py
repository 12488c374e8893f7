"""Convolutions (1d/2d/3d, strided, dilated, grouped, transposed) and pooling, with
their backward ops. Backward convolutions are the JAX transposes of the forward
(``jax.vjp``), which XLA lowers to its own backward convolutions."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from torch_jax.ops._matmul import _PRECISION
from torch_jax.ops._registry import aten, lower

_LOW = (np.dtype(jnp.float16), np.dtype(jnp.bfloat16))
_SPATIAL = "DHW"


def _dimension_numbers(nd: int):
    sp = _SPATIAL[-nd:] if nd <= 3 else "".join(chr(ord("a") + i) for i in range(nd))
    return ("NC" + sp, "OI" + sp, "NC" + sp)


def _expand(v, nd):
    v = list(v)
    return v * nd if len(v) == 1 else v


def conv(x, w, stride, padding, dilation, transposed, output_padding, groups):
    """PyTorch's convolution (without bias) as one lax.conv_general_dilated."""
    nd = x.ndim - 2
    stride, padding = _expand(stride, nd), _expand(padding, nd)
    dilation, output_padding = _expand(dilation, nd), _expand(output_padding, nd)
    if not transposed:
        lhs, rhs, window_strides, pads, lhs_dilation = x, w, stride, [(p, p) for p in padding], None
    else:
        # weight is (C_in, C_out / groups, k...): convolve the stride-dilated input with
        # the flipped kernel, in/out channels swapped within each group
        c_in, c_out_g = w.shape[0], w.shape[1]
        k = w.shape[2:]
        rhs = w.reshape((groups, c_in // groups, c_out_g) + k)
        rhs = jnp.swapaxes(rhs, 1, 2).reshape((groups * c_out_g, c_in // groups) + k)
        rhs = jnp.flip(rhs, axis=tuple(range(2, 2 + nd)))
        lhs, window_strides, lhs_dilation = x, [1] * nd, stride
        pads = [(d * (kk - 1) - p, d * (kk - 1) - p + op) for kk, p, d, op in zip(k, padding, dilation, output_padding)]
    y = lax.conv_general_dilated(
        lhs,
        rhs,
        window_strides=window_strides,
        padding=pads,
        lhs_dilation=lhs_dilation,
        rhs_dilation=dilation,
        dimension_numbers=_dimension_numbers(nd),
        feature_group_count=groups,
        precision=_PRECISION[torch.get_float32_matmul_precision()],
        preferred_element_type=jnp.float32 if x.dtype in _LOW else None,
    )
    return y.astype(x.dtype)


@lower(aten.convolution_overrideable.default)
def convolution_overrideable(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    y = conv(x, w, stride, padding, dilation, transposed, output_padding, groups)
    if bias is not None:
        y = y + bias.reshape((1, -1) + (1,) * (y.ndim - 2)).astype(y.dtype)
    return y


@lower(aten.convolution_backward_overrideable.default)
def convolution_backward_overrideable(
    g, x, w, stride, padding, dilation, transposed, output_padding, groups, output_mask
):
    def f(x_, w_):
        return conv(x_, w_, stride, padding, dilation, transposed, output_padding, groups)

    _, vjp = jax.vjp(f, x, w)
    gx, gw = vjp(g.astype(x.dtype))
    gb = jnp.sum(g, axis=(0,) + tuple(range(2, g.ndim))).astype(g.dtype)
    return gx, gw, gb


# ---------------------------------------------------------------- pooling


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
    spatial = x.shape[-nd:]
    plane = lax.broadcasted_iota(jnp.int64, spatial, 0) * 0
    strides = np.cumprod((1,) + tuple(reversed(spatial)))[::-1][1:]
    for axis in range(nd):
        plane = plane + lax.broadcasted_iota(jnp.int64, spatial, axis) * int(strides[axis])
    idx = jnp.broadcast_to(plane, x.shape)
    init = (jnp.asarray(_min_value(x.dtype), x.dtype), jnp.asarray(np.iinfo(np.int64).max, jnp.int64))
    vals, inds = lax.reduce_window((x, idx), init, _argmax_pair, **_window_args(x, k, s, p, d, out))
    return _crop(vals, out), _crop(inds, out)


def _max_pool_backward(g, x, indices, nd):
    plane = int(np.prod(x.shape[-nd:]))
    rows = int(np.prod(x.shape[:-nd]))
    gi = jnp.zeros((rows, plane), jnp.float32 if g.dtype in _LOW else g.dtype)
    gi = gi.at[jnp.arange(rows)[:, None], indices.reshape(rows, -1)].add(g.reshape(rows, -1).astype(gi.dtype))
    return gi.reshape(x.shape).astype(g.dtype)


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
    total = _crop(lax.reduce_window(xf, jnp.zeros((), xf.dtype), lax.add, **_window_args(xf, k, s, p, d, out)), out)
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


@lower(aten.avg_pool2d.default)
def avg_pool2d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    return _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 2)


@lower(aten.avg_pool2d_backward.default)
def avg_pool2d_backward(g, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    _, vjp = jax.vjp(
        lambda x_: _avg_pool(x_, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 2), x
    )
    return vjp(g.astype(x.dtype))[0]


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


@lower(aten._adaptive_avg_pool2d_backward.default)
def adaptive_avg_pool2d_backward(g, x):
    _, vjp = jax.vjp(lambda x_: _adaptive_avg(x_, list(g.shape[-2:])), x)
    return vjp(g.astype(x.dtype))[0]


@lower(aten._adaptive_avg_pool3d_backward.default)
def adaptive_avg_pool3d_backward(g, x):
    _, vjp = jax.vjp(lambda x_: _adaptive_avg(x_, list(g.shape[-3:])), x)
    return vjp(g.astype(x.dtype))[0]
