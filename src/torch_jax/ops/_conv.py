"""Convolutions (1d/2d/3d, strided, dilated, grouped, transposed) and pooling, with
their backward ops. Backward convolutions are the JAX transposes of the forward
(``jax.vjp``), which XLA lowers to its own backward convolutions."""

from __future__ import annotations

import itertools

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
    acc = jnp.float32 if x.dtype in _LOW else None
    precision = _PRECISION[torch.get_float32_matmul_precision()]
    dn = _dimension_numbers(nd)
    if not transposed:
        y = lax.conv_general_dilated(
            x, w, window_strides=stride, padding=[(p, p) for p in padding], rhs_dilation=dilation,
            dimension_numbers=dn, feature_group_count=groups, precision=precision, preferred_element_type=acc,
        )
        return y.astype(x.dtype)
    # transposed: weight is (C_in, C_out / groups, k...); convolve the stride-dilated
    # input with the flipped kernel, in/out channels swapped within each group
    c_in, c_out_g = w.shape[0], w.shape[1]
    k = w.shape[2:]
    wt = w.reshape((groups, c_in // groups, c_out_g) + k)
    wt = jnp.swapaxes(wt, 1, 2).reshape((groups * c_out_g, c_in // groups) + k)
    wt = jnp.flip(wt, axis=tuple(range(2, 2 + nd)))
    pads = [
        (d * (kk - 1) - p, d * (kk - 1) - p + op)
        for kk, p, d, op in zip(k, padding, dilation, output_padding)
    ]
    y = lax.conv_general_dilated(
        x, wt, window_strides=[1] * nd, padding=pads, lhs_dilation=stride, rhs_dilation=dilation,
        dimension_numbers=dn, feature_group_count=groups, precision=precision, preferred_element_type=acc,
    )
    return y.astype(x.dtype)


@lower(aten.convolution_overrideable.default)
def convolution_overrideable(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    y = conv(x, w, stride, padding, dilation, transposed, output_padding, groups)
    if bias is not None:
        y = y + bias.reshape((1, -1) + (1,) * (y.ndim - 2)).astype(y.dtype)
    return y


@lower(aten.convolution_backward_overrideable.default)
def convolution_backward_overrideable(g, x, w, stride, padding, dilation, transposed, output_padding, groups, output_mask):
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


def _windows(x, k, s, p, d, out, fill):
    """Stack every window tap: (prod(k), *batch, *out) plus the flat input index of
    each tap (for max-pool indices), built from strided slices of the padded input."""
    nd = len(k)
    spatial = x.shape[-nd:]
    hi = [max((o - 1) * ss + dd * (kk - 1) + 1 - n - pp, 0) for o, ss, dd, kk, n, pp in zip(out, s, d, k, spatial, p)]
    xp = jnp.pad(x, [(0, 0)] * (x.ndim - nd) + list(zip(p, hi)), constant_values=fill)
    taps, flat = [], []
    strides = np.cumprod((1,) + tuple(reversed(spatial)))[::-1][1:]
    for offs in itertools.product(*[range(kk) for kk in k]):
        start = [0] * (x.ndim - nd) + [o * dd for o, dd in zip(offs, d)]
        limit = [xp.shape[i] for i in range(x.ndim - nd)] + [
            o * dd + (oo - 1) * ss + 1 for o, dd, oo, ss in zip(offs, d, out, s)
        ]
        step = [1] * (x.ndim - nd) + list(s)
        taps.append(lax.slice(xp, start, limit, step))
        idx = 0
        for axis, (o, dd, ss, pp) in enumerate(zip(offs, d, s, p)):
            pos = jnp.arange(out[axis]) * ss + o * dd - pp
            shape = [1] * nd
            shape[axis] = out[axis]
            idx = idx + pos.reshape(shape) * int(strides[axis])
        flat.append(jnp.broadcast_to(idx, out))
    return jnp.stack(taps), jnp.stack(flat)


def _min_value(dtype):
    if jnp.issubdtype(dtype, jnp.floating):
        return -jnp.inf
    return jnp.iinfo(dtype).min


def _max_pool(x, kernel_size, stride, padding, dilation, ceil_mode, nd):
    k, s, p, d, out = _pool_geometry(x, _expand(kernel_size, nd), stride, padding, dilation, ceil_mode)
    taps, flat = _windows(x, k, s, p, d, out, _min_value(x.dtype))
    if jnp.issubdtype(x.dtype, jnp.floating):  # NaN wins, as in PyTorch
        nan = jnp.isnan(taps)
        choice = jnp.where(jnp.any(nan, axis=0), jnp.argmax(nan, axis=0), jnp.argmax(taps, axis=0))
    else:
        choice = jnp.argmax(taps, axis=0)
    vals = jnp.take_along_axis(taps, choice[None], axis=0)[0]
    flat = jnp.broadcast_to(flat.reshape(flat.shape[:1] + (1,) * (x.ndim - nd) + flat.shape[1:]), taps.shape)
    idx = jnp.take_along_axis(flat, choice[None], axis=0)[0]
    return vals, idx.astype(jnp.int64)


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
    taps, flat = _windows(xf, k, s, p, d, out, 0)
    total = jnp.sum(taps, axis=0)
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
    _, vjp = jax.vjp(lambda x_: _avg_pool(x_, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 2), x)
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
