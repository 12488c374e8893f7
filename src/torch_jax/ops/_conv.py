"""Convolutions (1d/2d/3d, strided, dilated, grouped, transposed), with their backward
ops (pooling is in _pool). Backward convolutions are the JAX transposes of the forward
(``jax.vjp``), which XLA lowers to its own backward convolutions."""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import torch
from jax import lax

from torch_jax.ops._matmul import _PRECISION
from torch_jax.ops._promote import LOW_PRECISION as _LOW
from torch_jax.ops._registry import aten, lower

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
    precision = _PRECISION[torch.get_float32_matmul_precision()]
    acc = jnp.float32 if x.dtype in _LOW else None
    if not transposed and groups == 1 and _tiny_output(x.shape[2:], w.shape[2:], stride, padding, dilation):
        return _patches_conv(x, w, stride, padding, dilation, precision, acc).astype(x.dtype)
    y = lax.conv_general_dilated(
        lhs,
        rhs,
        window_strides=window_strides,
        padding=pads,
        lhs_dilation=lhs_dilation,
        rhs_dilation=dilation,
        dimension_numbers=_dimension_numbers(nd),
        feature_group_count=groups,
        precision=precision,
        preferred_element_type=acc,
    )
    return y.astype(x.dtype)


def _out_sizes(size, k, stride, padding, dilation):
    return [(n + 2 * p - d * (kk - 1) - 1) // s + 1 for n, kk, s, p, d in zip(size, k, stride, padding, dilation)]


def _tiny_output(size, k, stride, padding, dilation) -> bool:
    """NOTE [Convolutions with tiny outputs]: XLA's CPU convolution runs at about 1-6
    GFLOP/s when the output has at most 2x2 positions (the last ResNet stage on 64x64
    images: 130 ms for what a matmul does in 3 ms). Such convolutions are a handful of
    shifted slices and one contraction instead."""
    return math.prod(_out_sizes(size, k, stride, padding, dilation)) <= 4


def _patches_conv(x, w, stride, padding, dilation, precision, acc):
    """A convolution as sum over kernel offsets of (strided slice of x) x (weight tap):
    one einsum over the stacked slices."""
    nd = x.ndim - 2
    k = w.shape[2:]
    out = _out_sizes(x.shape[2:], k, stride, padding, dilation)
    xp = jnp.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in padding])
    taps = []
    for offs in itertools.product(*(range(kk) for kk in k)):
        start = [0, 0] + [o * d for o, d in zip(offs, dilation)]
        limit = list(xp.shape[:2]) + [st + (n - 1) * s + 1 for st, n, s in zip(start[2:], out, stride)]
        taps.append(lax.slice(xp, start, limit, [1, 1] + list(stride)))
    cols = jnp.stack(taps, axis=2)  # (N, C, K, out...)
    wk = w.reshape(w.shape[:2] + (-1,))  # (O, C, K)
    sp = "".join(chr(ord("a") + i) for i in range(nd))
    return jnp.einsum(f"nck{sp},ock->no{sp}", cols, wk, precision=precision, preferred_element_type=acc)


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
