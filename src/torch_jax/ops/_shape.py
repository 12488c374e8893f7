"""Ops that move data around: cat, constant padding, flips, triangles, repeats, sorting, and
the backward ops of views (select/slice/diagonal/unfold). Gathers, scatters and advanced
indexing live in _indexing."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from torch_jax.ops import _context, _sort
from torch_jax.ops._promote import cast
from torch_jax.ops._registry import aten, lower
from torch_jax.tensor import _strided


@lower(aten.cat.default)
def cat(tensors, dim=0):
    out = _context.out_dtype()
    plan = _context.current().bucket
    if plan is not None:
        return _cat_into_bucket(tensors, plan[1], plan[2], out)
    # legacy: 1-D empty tensors are skipped whatever their dim
    parts = [cast(t, out) for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not parts:
        return jnp.zeros((0,), out)
    return jnp.concatenate(parts, axis=dim % parts[0].ndim)


def _cat_into_bucket(tensors, d: int, bucket: int, dtype):
    """cat along ``d`` into an array of ``bucket`` positions (NOTE [Buckets] in
    runtime/_buckets): each input at its offset, the first one possibly padded."""
    first = tensors[0]
    shape = list((first.arr if isinstance(first, _context.PaddedValue) else first).shape)
    shape[d] = bucket
    if isinstance(first, _context.PaddedValue) and first.arr.shape[d] == bucket:
        buf, at, rest = cast(first.arr, dtype), first.length, tensors[1:]
    else:
        buf, at, rest = jnp.full(shape, _context.pad_fill(dtype), dtype), 0, tensors
    for t in rest:
        if isinstance(t, _context.PaddedValue):
            buf = lax.dynamic_update_slice_in_dim(buf, cast(t.arr, dtype), at, d)
            at = at + t.length
        else:
            buf = lax.dynamic_update_slice_in_dim(buf, cast(t, dtype), at, d)
            at = at + t.shape[d]
    return _context.PaddedValue(buf, d)


@lower(aten.tril.default)
def tril(x, diagonal=0):
    return jnp.tril(x, diagonal)


@lower(aten.triu.default)
def triu(x, diagonal=0):
    return jnp.triu(x, diagonal)


@lower(aten.flip.default)
def flip(x, dims):
    return jnp.flip(x, axis=tuple(d % x.ndim for d in dims)) if x.ndim else x


@lower(aten.roll.default)
def roll(x, shifts, dims=()):
    if not dims:
        return jnp.roll(x.reshape(-1), shifts[0]).reshape(x.shape)
    return jnp.roll(x, tuple(shifts), axis=tuple(dims))


@lower(aten.constant_pad_nd.default)
def constant_pad_nd(x, pad, value=0):
    pairs = [(0, 0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        d = x.ndim - 1 - i
        pairs[d] = (pad[2 * i], pad[2 * i + 1], 0)
    return lax.pad(x, cast(value, x.dtype), pairs)


@lower(aten.repeat.default)
def repeat(x, repeats):
    x = x.reshape((1,) * (len(repeats) - x.ndim) + x.shape)
    return jnp.tile(x, tuple(repeats))


@lower(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(x, mask, value):
    return jnp.where(mask, cast(value, x.dtype), x)


@lower(aten.narrow_copy.default)
def narrow_copy(x, dim, start, length):
    d = dim % x.ndim
    start = start + x.shape[d] if start < 0 else start
    return lax.slice_in_dim(x, start, start + length, axis=d)


@lower(aten.channel_shuffle.default)
def channel_shuffle(x, groups):
    n, c = x.shape[:2]
    y = x.reshape((n, groups, c // groups) + x.shape[2:])  # (N, g, C/g, *)
    return jnp.swapaxes(y, 1, 2).reshape(x.shape)


def _tri_indices(row, col, offset, upper: bool):
    """Row-major (row, col) coordinates of the upper (lower) triangle, as a (2, n) array."""
    r, c = np.indices((row, col)).reshape(2, -1)
    keep = (c - r >= offset) if upper else (c - r <= offset)
    return jnp.asarray(np.stack([r[keep], c[keep]]), _context.out_dtype())


@lower(aten.triu_indices.default)
def triu_indices(row, col, offset=0, dtype=None, layout=None, device=None, pin_memory=None):
    return _tri_indices(row, col, offset, True)


@lower(aten.tril_indices.default)
def tril_indices(row, col, offset=0, dtype=None, layout=None, device=None, pin_memory=None):
    return _tri_indices(row, col, offset, False)


# ---------------------------------------------------------------- im2col / col2im


def _patch_slices(out_hw, kernel_size, dilation, stride):
    """For each kernel offset (row-major), the strided window of the padded image it reads."""
    (oh, ow), (kh, kw), (dh, dw), (sh, sw) = out_hw, kernel_size, dilation, stride
    for i in range(kh):
        for j in range(kw):
            yield (slice(i * dh, i * dh + sh * (oh - 1) + 1, sh), slice(j * dw, j * dw + sw * (ow - 1) + 1, sw))


def _blocks(hw, kernel_size, dilation, padding, stride):
    return tuple(
        (n + 2 * p - d * (k - 1) - 1) // s + 1 for n, k, d, p, s in zip(hw, kernel_size, dilation, padding, stride)
    )


@lower(aten.im2col.default)
def im2col(x, kernel_size, dilation, padding, stride):
    batched = x.ndim == 4
    x = x if batched else x[None]
    n, c = x.shape[:2]
    out_hw = _blocks(x.shape[2:], kernel_size, dilation, padding, stride)
    kk = kernel_size[0] * kernel_size[1]
    if min(out_hw) <= 0 or x.size == 0:
        out = jnp.zeros((n, c * kk, max(out_hw[0], 0) * max(out_hw[1], 0)), x.dtype)
        return out if batched else out[0]
    (ph, pw) = padding
    xp = jnp.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    cols = [xp[:, :, rows, cols] for rows, cols in _patch_slices(out_hw, kernel_size, dilation, stride)]
    out = jnp.stack(cols, axis=2).reshape(n, c * kk, out_hw[0] * out_hw[1])  # (N, C*kh*kw, L)
    return out if batched else out[0]


@lower(aten.col2im.default)
def col2im(cols, output_size, kernel_size, dilation, padding, stride):
    batched = cols.ndim == 3
    cols = cols if batched else cols[None]
    n = cols.shape[0]
    kk = kernel_size[0] * kernel_size[1]
    out_hw = _blocks(output_size, kernel_size, dilation, padding, stride)
    c = cols.shape[1] // kk
    (ph, pw), (h, w) = padding, output_size
    out = jnp.zeros((n, c, h + 2 * ph, w + 2 * pw), cols.dtype)
    if min(out_hw) <= 0 or cols.size == 0:
        out = out[:, :, ph : ph + h, pw : pw + w]
        return out if batched else out[0]
    cols = cols.reshape(n, c, kk, *out_hw)  # (N, C, kh*kw, oh, ow)
    for k, (rows, cs) in enumerate(_patch_slices(out_hw, kernel_size, dilation, stride)):
        out = out.at[:, :, rows, cs].add(cols[:, :, k])
    out = out[:, :, ph : ph + h, pw : pw + w]
    return out if batched else out[0]


# ---------------------------------------------------------------- backward ops of views


@lower(aten.select_backward.default)
def select_backward(g, input_sizes, dim, index):
    return jnp.zeros(tuple(input_sizes), g.dtype).at[(slice(None),) * (dim % len(input_sizes)) + (index,)].set(g)


@lower(aten.slice_backward.default)
def slice_backward(g, input_sizes, dim, start, end, step):
    d = dim % len(input_sizes)
    n = input_sizes[d]
    sl = slice(*slice(start, end, step).indices(n))
    return jnp.zeros(tuple(input_sizes), g.dtype).at[(slice(None),) * d + (sl,)].set(g)


def _diag_index(shape, offset, dim1, dim2):
    d1, d2 = dim1 % len(shape), dim2 % len(shape)
    n = max(0, min(shape[d1] + min(offset, 0), shape[d2] - max(offset, 0)))
    i = np.arange(n)
    rows, cols = i - min(offset, 0), i + max(offset, 0)
    return d1, d2, rows, cols


@lower(aten.diagonal_backward.default)
def diagonal_backward(g, input_sizes, offset, dim1, dim2):
    return diagonal_scatter(jnp.zeros(tuple(input_sizes), g.dtype), g, offset, dim1, dim2)


@lower(aten.unfold_backward.default)
def unfold_backward(g, input_sizes, dim, size, step):
    if not input_sizes:  # unfolding a 0-dim tensor gives one window of size 1
        return g.reshape(())
    d = dim % len(input_sizes)
    n = g.shape[d]  # number of windows
    pos = np.arange(n)[:, None] * step + np.arange(size)[None, :]  # (windows, size)
    g = jnp.moveaxis(g, -1, d + 1)  # (..., windows, size, ...)
    out = jnp.zeros(tuple(input_sizes), g.dtype)
    return out.at[(slice(None),) * d + (pos,)].add(g)


@lower(aten.diagonal_scatter.default)
def diagonal_scatter(x, src, offset=0, dim1=0, dim2=1):
    d1, d2, rows, cols = _diag_index(x.shape, offset, dim1, dim2)
    moved = jnp.moveaxis(x, (d1, d2), (-2, -1))
    moved = moved.at[..., rows, cols].set(cast(src, x.dtype))
    return jnp.moveaxis(moved, (-2, -1), (d1, d2))


@lower(aten.select_scatter.default)
def select_scatter(x, src, dim, index):
    d = dim % x.ndim
    return x.at[(slice(None),) * d + (index,)].set(cast(src, x.dtype))


@lower(aten.slice_scatter.default)
def slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    d = dim % x.ndim
    sl = slice(*slice(start, end, step).indices(x.shape[d]))
    return x.at[(slice(None),) * d + (sl,)].set(cast(src, x.dtype))


@lower(aten.as_strided_scatter.default)
def as_strided_scatter(x, src, size, stride, storage_offset=None):
    flat = _strided.write_strided(x.reshape(-1), tuple(size), tuple(stride), storage_offset or 0, cast(src, x.dtype))
    return flat.reshape(x.shape)


# ---------------------------------------------------------------- sorting


@lower(aten.sort.stable)
def sort_stable(x, stable=None, dim=-1, descending=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    # NaN sorts as the largest value, -0.0 ties with 0.0, no negation (which wraps integers)
    return _sort.stable_sort(x, dim % x.ndim, descending)


@lower(aten.topk.default)
def topk(x, k, dim=-1, largest=True, sorted=True):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    d = dim % x.ndim
    vals, idx = sort_stable(x, True, d, largest)
    return lax.slice_in_dim(vals, 0, k, axis=d), lax.slice_in_dim(idx, 0, k, axis=d)
