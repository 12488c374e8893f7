"""Convolutions (1d/2d/3d, strided, dilated, grouped, transposed), with their backward
ops (pooling is in _pool). Backward convolutions are the JAX transposes of the forward
(``jax.vjp``), which XLA lowers to its own backward convolutions; grouped ones on the
CPU are written out (NOTE [Grouped convolutions on XLA:CPU])."""

from __future__ import annotations

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import torch
from jax import lax

from torch_jax.ffi import _fusion_barrier
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
    if math.prod(rhs.shape[2:]) > math.prod(lhs.shape[2:]):  # (NOTE [Convolutions XLA would swap])
        config = [(lo, hi, d - 1) for (lo, hi), d in zip(pads, lhs_dilation or [1] * nd)]
        lhs = lax.pad(lhs, jnp.zeros((), lhs.dtype), [(0, 0, 0)] * 2 + config)
        pads, lhs_dilation = [(0, 0)] * nd, None
    native = functools.partial(
        lax.conv_general_dilated,
        window_strides=window_strides,
        padding=pads,
        lhs_dilation=lhs_dilation,
        rhs_dilation=dilation,
        dimension_numbers=_dimension_numbers(nd),
        feature_group_count=groups,
        precision=precision,
        preferred_element_type=acc,
    )
    if groups == 1:
        return native(lhs, rhs).astype(x.dtype)
    by_group = _depthwise if lhs.shape[1] == groups and math.prod(rhs.shape[2:]) <= _DEPTHWISE_TAPS else None
    if by_group is None and groups <= _SPLIT_GROUPS:
        by_group = _per_group
    if by_group is None:
        return native(lhs, rhs).astype(x.dtype)
    on_cpu = functools.partial(by_group, native=native, groups=groups, acc=acc)
    return lax.platform_dependent(lhs, rhs, cpu=on_cpu, default=native).astype(x.dtype)


# NOTE [Grouped convolutions on XLA:CPU]: XLA:CPU has no grouped convolution. It expands
# one into a dense convolution over all channels with a block-diagonal kernel (groups
# times the work), and its weight gradient (a convolution with batch_group_count) much
# worse. Forward, then input and weight gradient (each its own call, in ms; PyTorch's
# CPU in brackets), before -> after writing them out as below:
#   depthwise 3x3 over 16x64x32x32:  32 / 32 / 28 -> 2.8 / 1.3 / 3.5  (4.1 / 4.1 / 3.0)
#   4 groups, 3x3 over 16x64x32x32:  8 / 330 / 332 -> 3.0 / 3.8 / 3.9  (1.3 / 1.3 / 1.2)
#   ConvNeXt's depthwise 7x7, 8x96x32x32:  61 / 85 / 74 -> 1.5 / 2.3 / 10.7  (0.5 / 0.5 / 13.9)
#   Mamba's depthwise 1-d, kernel 4, 8x256x512:  31 / 1056 / 992 -> 0.8 / 0.7 / 2.0  (0.3 / 0.2 / 7.8)
# (a small HF ConvNeXt's training step: strict 95 -> 26-32 ms, fused 78 -> 40-49 ms, and
# 36-41 -> 26-31 ms once the sums below ended in fusion barriers).
# On the CPU a grouped convolution is therefore written out:
# - depthwise (one input channel a group, a kernel of at most _DEPTHWISE_TAPS taps): a
#   sum over the kernel's taps of the strided input slice times that tap's weight per
#   channel, which XLA fuses into one loop, with its transpose written the same way
#   (each sum ends in a fusion barrier, NOTE [Fusion barriers on XLA:CPU] in
#   ffi/_fusion_barrier, or a fused graph recomputes it in each reader); its
#   weight gradient is one reduction a tap (one small dense convolution a channel, the
#   batch as features, took 3.2 against 40 ms alone for ConvNeXt's, but its hundreds of
#   convolutions made the whole step no faster);
# - at most _SPLIT_GROUPS groups: one dense convolution a group, concatenated;
# - otherwise XLA's own. Other platforms have grouped convolutions of their own.
_DEPTHWISE_TAPS = 64
_SWAPPED_TAPS = 16  # (NOTE [Convolutions XLA would swap])
_SPLIT_GROUPS = 32


def _depthwise(lhs, rhs, native, groups, acc):
    """A depthwise convolution (lhs (N, G, ...), rhs (G*m, 1, k...)) as a sum over taps."""
    del groups
    p = native.keywords
    nd = lhs.ndim - 2
    n, g = lhs.shape[:2]
    m, k = rhs.shape[0] // g, rhs.shape[2:]
    lhs_dilation = p["lhs_dilation"] or (1,) * nd
    dtype = acc or lhs.dtype
    config = [(0, 0, 0), (0, 0, 0)] + [(lo, hi, d - 1) for (lo, hi), d in zip(p["padding"], lhs_dilation)]
    xp = lax.pad(lhs.astype(dtype), jnp.zeros((), dtype), config)
    y = _tap_sum(xp, rhs.astype(dtype).reshape((g, m) + k), tuple(p["window_strides"]), tuple(p["rhs_dilation"]))
    return y.reshape((n, g * m) + y.shape[3:])


def _taps(x, k, strides, dilation, out):
    """Each tap's strided slice of x (N, G, ...) over an output of `out` positions."""
    for offs in itertools.product(*(range(kk) for kk in k)):
        start = [0, 0] + [o * d for o, d in zip(offs, dilation)]
        limit = list(x.shape[:2]) + [st + (size - 1) * s + 1 for st, size, s in zip(start[2:], out, strides)]
        yield offs, lax.slice(x, start, limit, [1, 1] + list(strides))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _tap_sum(xp, w, strides, dilation):
    """y[n, g, j, o] = sum over taps t of xp[n, g, o * strides + t * dilation] * w[g, j, t]."""
    nd = xp.ndim - 2
    k = w.shape[2:]
    out = _out_sizes(xp.shape[2:], k, strides, [0] * nd, dilation)
    y = None
    for offs, tap in _taps(xp, k, strides, dilation, out):
        term = tap[:, :, None] * w[(...,) + offs].reshape(w.shape[:2] + (1,) * nd)
        y = term if y is None else y + term
    return _fusion_barrier.barrier(y)


def _tap_sum_fwd(xp, w, strides, dilation):
    return _tap_sum(xp, w, strides, dilation), (xp, w)


def _tap_sum_bwd(strides, dilation, res, gy):
    """The transpose: xp's gradient is itself a sum over taps, of the stride-dilated gy
    with the kernel flipped (jax's transpose of the slices would add one padded copy of
    the input a tap); the weight's is one reduction a tap."""
    xp, w = res
    nd = xp.ndim - 2
    k, out, size = w.shape[2:], gy.shape[3:], xp.shape[2:]
    config = [(0, 0, 0)] * 3 + [
        (d * (kk - 1), n - (o - 1) * s - 1, s - 1) for kk, o, n, s, d in zip(k, out, size, strides, dilation)
    ]
    z = lax.pad(gy, jnp.zeros((), gy.dtype), config)  # (N, G, m, ...)
    z = z.reshape((z.shape[0], -1) + z.shape[3:])
    wf = jnp.flip(w, axis=tuple(range(2, 2 + nd)))
    gxp = None
    for offs, tap in _taps(z, k, (1,) * nd, dilation, size):
        tap = tap.reshape(gy.shape[:3] + tuple(size))
        term = jnp.sum(tap * wf[(...,) + offs].reshape(w.shape[:2] + (1,) * nd), axis=2)
        gxp = term if gxp is None else gxp + term
    axes = (0,) + tuple(range(3, 3 + nd))
    gw = [jnp.sum(tap[:, :, None] * gy, axis=axes) for _, tap in _taps(xp, k, strides, dilation, out)]
    return _fusion_barrier.barrier(gxp), jnp.stack(gw, axis=-1).reshape(w.shape)


_tap_sum.defvjp(_tap_sum_fwd, _tap_sum_bwd)


def _per_group(lhs, rhs, native, groups, acc):
    """A grouped convolution as one dense convolution a group, concatenated."""
    del acc
    dense = functools.partial(native.func, **dict(native.keywords, feature_group_count=1))
    pairs = zip(jnp.split(lhs, groups, axis=1), jnp.split(rhs, groups, axis=0))
    return jnp.concatenate([dense(a, b) for a, b in pairs], axis=1)


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
    cols = jnp.stack([tap for _, tap in _taps(xp, k, stride, dilation, out)], axis=2)  # (N, C, K, out...)
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
    gy = g.astype(x.dtype)

    def conv_of(x_, w_, padding_=padding):
        return conv(x_, w_, stride, padding_, dilation, transposed, output_padding, groups)

    def grad(operand, of):
        return jax.vjp(of, operand)[1](gy)[0]

    # NOTE [Convolutions XLA would swap]: where a convolution's kernel is larger than its
    # input (their spatial sizes' products), XLA swaps the two operands and reverses the
    # window, and XLA:CPU runs a reversed window on its generic loop nest (about 5
    # GFLOP/s). jax's gradients are such convolutions whenever the output is longer than
    # the input (the weight gradient's kernel is gy: wav2vec2's even kernel of 128 with
    # padding 64) or shorter than the kernel (the input gradient's input is gy). One of
    # wav2vec2's 16 groups (2x48x200) took 41-44 ms for its weight gradient, 0.8 ms
    # with x padded first (its positional convolution, forward and backward: 690 ->
    # 42 ms, PyTorch's CPU 72 ms). So such a weight gradient is taken with x padded
    # first, such an input gradient is the transposed convolution of gy (which conv
    # pads first), and conv pads its input first where its kernel is the larger. The
    # transposed convolution multiplies the padding's zeros too: for small kernels XLA's
    # swapped form was the faster (ResNet-18's last stage at 64x64, 3x3 over 2x2: input
    # and weight gradients 2.4-2.7 against 4.3 ms, 1.7 against 4.0 with stride 2), for
    # long ones the transposed (kernel 64 over 40: 0.6 against 7-11 ms); so only kernels
    # of at least _SWAPPED_TAPS taps take it.
    nd = x.ndim - 2
    stride, pads, dilation = _expand(stride, nd), _expand(padding, nd), _expand(dilation, nd)
    size, k = x.shape[2:], w.shape[2:]
    out = gy.shape[2:]
    # (the gradients not asked for are undefined, as on the CPU, and not computed)
    gx = gw = None
    if output_mask[0]:
        if not transposed and math.prod(k) > max(math.prod(out), _SWAPPED_TAPS - 1):
            spans = [(o - 1) * s - 2 * p + d * (kk - 1) + 1 for o, s, p, d, kk in zip(out, stride, pads, dilation, k)]
            extra = [n - span for n, span in zip(size, spans)]
            gx = conv(gy, w, stride, pads, dilation, True, extra, groups)
        else:
            gx = grad(x, lambda x_: conv_of(x_, w))
    if output_mask[1]:
        if not transposed and math.prod(out) > math.prod(size):
            xp = jnp.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in pads])
            gw = grad(w, lambda w_: conv_of(xp, w_, [0]))
        else:
            gw = grad(w, lambda w_: conv_of(x, w_))
    gb = jnp.sum(g, axis=(0,) + tuple(range(2, g.ndim))).astype(g.dtype) if output_mask[2] else None
    return gx, gw, gb
