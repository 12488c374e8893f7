"""Convolutions (1d/2d/3d, strided, dilated, grouped, transposed), with their backward
ops (pooling is in _pool). Backward convolutions are the JAX transposes of the forward
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
