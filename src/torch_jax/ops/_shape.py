"""Ops that move data around: cat, padding, flips, triangles, gathers and scatters,
advanced indexing, sorting, and the backward ops of views (select/slice/diagonal)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from torch_jax.ops import _context
from torch_jax.ops._promote import cast
from torch_jax.ops._registry import aten, lower
from torch_jax.tensor import _strided


def check_bounds(idx, size: int, dim: int):
    """PyTorch's IndexError for an index outside [-size, size)."""
    bad = (idx < -size) | (idx >= size)
    first = jnp.where(jnp.any(bad), idx.reshape(-1)[jnp.argmax(bad.reshape(-1))], 0) if idx.size else 0
    _context.check(
        jnp.any(bad), IndexError, "index {value} is out of bounds for dimension " + f"{dim} with size {size}", first
    )


def wrap_index(idx, size: int):
    idx = idx.astype(jnp.int64)
    return jnp.where(idx < 0, idx + size, idx)


@lower(aten.cat.default)
def cat(tensors, dim=0):
    out = _context.out_dtype()
    # legacy: 1-D empty tensors are skipped whatever their dim
    parts = [cast(t, out) for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not parts:
        return jnp.zeros((0,), out)
    return jnp.concatenate(parts, axis=dim % parts[0].ndim)


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


# A 0-dim index keeps its dim (size 1) on CPU, where the Meta kernel drops it.
@lower(aten.index_select.default, trust_meta=False)
def index_select(x, dim, index):
    n = x.shape[dim] if x.ndim else 1
    bad = (index < 0) | (index >= n)
    _context.check(jnp.any(bad), IndexError, "index out of range in self")
    if x.ndim == 0:  # a 0-dim result whatever the index's shape, as on CPU
        return x
    return jnp.take(x, index.astype(jnp.int64).reshape(-1), axis=dim, mode="clip")


def _check_in_range(index, n: int, dim: int):
    """gather/scatter's error for an index outside [0, n) (no negative indices)."""
    bad = (index < 0) | (index >= n)
    first = jnp.where(jnp.any(bad), index.reshape(-1)[jnp.argmax(bad.reshape(-1))], 0) if index.size else 0
    _context.check(
        jnp.any(bad), RuntimeError, f"index {{value}} is out of bounds for dimension {dim} with size {n}", first
    )


def _dim_grid(index, dim):
    """Full index grids for gather/scatter: the index along ``dim``, iota elsewhere."""
    grids = []
    for d in range(index.ndim):
        grids.append(index if d == dim else lax.broadcasted_iota(jnp.int64, index.shape, d))
    return tuple(grids)


@lower(aten.gather.default)
def gather(x, dim, index, sparse_grad=False):
    if x.ndim == 0:
        return jnp.broadcast_to(x, index.shape)
    dim = dim % x.ndim
    n = x.shape[dim]
    _check_in_range(index, n, dim)
    idx = index.astype(jnp.int64)
    return x[_dim_grid(idx, dim)] if idx.size else jnp.zeros(idx.shape, x.dtype)


def _scatter(x, dim, index, src, reduce=None):
    if x.ndim == 0:
        x = x.reshape(1)
        index, src = index.reshape(-1), jnp.broadcast_to(src, (index.size,))
        return _scatter(x, 0, index, src, reduce).reshape(())
    dim = dim % x.ndim
    n = x.shape[dim]
    _check_in_range(index, n, dim)
    if index.size == 0:
        return x
    src = jnp.broadcast_to(src, index.shape) if jnp.ndim(src) == 0 else src[tuple(slice(0, s) for s in index.shape)]
    src = cast(src, x.dtype)
    at = x.at[_dim_grid(index.astype(jnp.int64), dim)]
    if reduce is None:
        return at.set(src)
    if reduce in ("add", "sum"):
        return at.add(src)
    if reduce in ("multiply", "prod"):
        return at.multiply(src)
    if reduce == "amax":
        return at.max(src)
    if reduce == "amin":
        return at.min(src)
    raise ValueError(f"reduce argument must be either add or multiply, got {reduce}")


@lower(aten.scatter.src, aten.scatter.value)
def scatter(x, dim, index, src):
    return _scatter(x, dim, index, src)


@lower(aten.scatter.reduce, aten.scatter.value_reduce)
def scatter_reduce_legacy(x, dim, index, src, reduce):
    return _scatter(x, dim, index, src, reduce)


@lower(aten.scatter_add.default)
def scatter_add(x, dim, index, src):
    return _scatter(x, dim, index, src, "add")


def _advanced_index(x, indices):
    """A numpy-style index tuple for ``x[indices]`` (None entries are full slices)."""
    out = []
    for d, i in enumerate(indices):
        if i is None:
            out.append(slice(None))
        else:
            if i.dtype == jnp.bool_ or i.dtype == jnp.uint8:
                raise RuntimeError("torch_jax internal error: boolean index reached the lowering")
            check_bounds(i, x.shape[d], d)
            out.append(wrap_index(i, x.shape[d]))
    return tuple(out)


@lower(aten.index.Tensor)
def index(x, indices):
    return x[_advanced_index(x, indices)]


@lower(aten.index_put.default)
def index_put(x, indices, values, accumulate=False):
    idx = _advanced_index(x, indices)
    values = cast(values, x.dtype)
    return x.at[idx].add(values) if accumulate else x.at[idx].set(values)


@lower(aten.index_add.default)
def index_add(x, dim, index, source, alpha=1):
    n = x.shape[dim] if x.ndim else 1
    check_bounds(index, n, dim)
    if x.ndim == 0:
        return x + jnp.sum(source) * alpha
    idx = [slice(None)] * x.ndim
    idx[dim] = wrap_index(index, n)
    return x.at[tuple(idx)].add(cast(source * alpha, x.dtype))


@lower(aten.index_copy.default)
def index_copy(x, dim, index, source):
    n = x.shape[dim] if x.ndim else 1
    check_bounds(index, n, dim)
    if x.ndim == 0:
        return jnp.reshape(source, ())
    idx = [slice(None)] * x.ndim
    idx[dim] = wrap_index(index, n)
    return x.at[tuple(idx)].set(cast(source, x.dtype))


@lower(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def index_fill(x, dim, index, value):
    n = x.shape[dim] if x.ndim else 1
    check_bounds(index, n, dim)
    if x.ndim == 0:
        return jnp.where(index.size > 0, cast(value, x.dtype), x)
    idx = [slice(None)] * x.ndim
    idx[dim] = wrap_index(index, n)
    return x.at[tuple(idx)].set(cast(value, x.dtype))


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
    d = dim % x.ndim
    keys = -x if descending and x.dtype != jnp.bool_ else x
    if descending and x.dtype == jnp.bool_:
        keys = ~x
    if jnp.issubdtype(x.dtype, jnp.floating):
        # NaN sorts as the largest value
        nan = jnp.isnan(x)
        keys = jnp.where(nan, jnp.inf if not descending else -jnp.inf, keys)
        order = jnp.argsort(keys, axis=d, stable=True)
        if descending:
            nan_first = jnp.argsort(~jnp.take_along_axis(nan, order, axis=d), axis=d, stable=True)
            order = jnp.take_along_axis(order, nan_first, axis=d)
        else:
            nan_last = jnp.argsort(jnp.take_along_axis(nan, order, axis=d), axis=d, stable=True)
            order = jnp.take_along_axis(order, nan_last, axis=d)
    else:
        order = jnp.argsort(keys, axis=d, stable=True)
    return jnp.take_along_axis(x, order, axis=d), order.astype(jnp.int64)


@lower(aten.topk.default)
def topk(x, k, dim=-1, largest=True, sorted=True):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    d = dim % x.ndim
    vals, idx = sort_stable(x, True, d, largest)
    return lax.slice_in_dim(vals, 0, k, axis=d), lax.slice_in_dim(idx, 0, k, axis=d)
