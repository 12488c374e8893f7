"""Ops that read or write at computed positions: gather/scatter (and their reductions),
advanced indexing, index_* along a dim, take/put, masked_scatter.

Out-of-range indices raise the CPU's error through :func:`_context.check` (the flag is
computed on the device and raised on the host); the JAX scatter itself then drops or
clips them, so nothing reads outside the array. Boolean masks never reach these
lowerings (runtime/_dynamic turns them into long indices first).

NOTE [Bool accumulation]: PyTorch adds bools as a logical or and multiplies them as a
logical and; XLA has no add on booleans, so bool accumulations run as max / min.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from torch_jax.ops import _context
from torch_jax.ops._promote import cast
from torch_jax.ops._registry import aten, lower


def _first_bad(bad, idx):
    """The first offending index (for the message), 0 when there is none."""
    if not idx.size:
        return 0
    return jnp.where(jnp.any(bad), idx.reshape(-1)[jnp.argmax(bad.reshape(-1))], 0)


def check_bounds(idx, size: int, dim: int):
    """PyTorch's IndexError for an index outside [-size, size)."""
    bad = (idx < -size) | (idx >= size)
    msg = "index {value} is out of bounds for dimension " + f"{dim} with size {size}"
    _context.check(jnp.any(bad), IndexError, msg, _first_bad(bad, idx))


def _check_in_range(index, n: int, dim: int):
    """gather/scatter's error for an index outside [0, n) (no negative indices)."""
    bad = (index < 0) | (index >= n)
    msg = f"index {{value}} is out of bounds for dimension {dim} with size {n}"
    _context.check(jnp.any(bad), RuntimeError, msg, _first_bad(bad, index))


def _check_self_range(index, n: int):
    """index_select/index_reduce's error: indices in [0, n)."""
    _context.check(jnp.any((index < 0) | (index >= n)), IndexError, "index out of range in self")


def wrap_index(idx, size: int):
    idx = idx.astype(jnp.int64)
    return jnp.where(idx < 0, idx + size, idx)


def _is_bool(x) -> bool:
    return x.dtype == jnp.bool_


def _reduce_at(x, idx, src, reduce: str, include_self: bool = True):
    """``x`` with ``src`` reduced into the positions ``x[idx]`` (a numpy-style index).

    ``reduce`` is one of sum, prod, mean, amax, amin (add/multiply are the legacy
    names). Without ``include_self`` the old values at the written positions do not
    take part. Mean divides by the number of contributions (floor division for
    integers, as on CPU); positions nobody writes keep their value."""
    reduce = {"add": "sum", "multiply": "prod"}.get(reduce, reduce)
    if _is_bool(x):  # NOTE [Bool accumulation]
        reduce = {"sum": "amax", "prod": "amin"}.get(reduce, reduce)
        out = _reduce_at(x.astype(jnp.uint8), idx, src.astype(jnp.uint8), reduce, include_self)
        return out.astype(jnp.bool_)
    src = cast(src, x.dtype)
    if not include_self:
        x = x.at[idx].set(_identity(reduce, x.dtype))
    at = x.at[idx]
    if reduce == "sum":
        return at.add(src)
    if reduce == "prod":
        return at.multiply(src)
    if reduce == "amax":
        return at.max(src)
    if reduce == "amin":
        return at.min(src)
    if reduce == "mean":
        total = at.add(src)
        count = jnp.ones(x.shape, jnp.int64) if include_self else jnp.zeros(x.shape, jnp.int64)
        count = count.at[idx].add(jnp.ones(src.shape, jnp.int64))
        count = jnp.maximum(count, 1)
        if jnp.issubdtype(x.dtype, jnp.inexact):
            return total / count.astype(x.dtype)
        return jnp.floor_divide(total, count.astype(x.dtype))
    raise RuntimeError(f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce}")


def _identity(reduce: str, dtype):
    """The value a reduction starts from when the old value does not take part."""
    if reduce in ("sum", "mean"):
        return jnp.zeros((), dtype)
    if reduce == "prod":
        return jnp.ones((), dtype)
    if jnp.issubdtype(dtype, jnp.inexact):
        return jnp.asarray(-jnp.inf if reduce == "amax" else jnp.inf, dtype)
    info = jnp.iinfo(dtype)
    return jnp.asarray(info.min if reduce == "amax" else info.max, dtype)


# ---------------------------------------------------------------- gather / scatter


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


def _scatter(x, dim, index, src, reduce=None, include_self=True):
    if x.ndim == 0:
        x = x.reshape(1)
        index, src = index.reshape(-1), jnp.broadcast_to(src, (index.size,))
        return _scatter(x, 0, index, src, reduce, include_self).reshape(())
    dim = dim % x.ndim
    n = x.shape[dim]
    _check_in_range(index, n, dim)
    if index.size == 0:
        return x
    # src may be larger than index: only its leading index.shape block is used
    src = jnp.broadcast_to(src, index.shape) if jnp.ndim(src) == 0 else src[tuple(slice(0, s) for s in index.shape)]
    idx = _dim_grid(index.astype(jnp.int64), dim)
    if reduce is None:
        return x.at[idx].set(cast(src, x.dtype))
    return _reduce_at(x, idx, src, reduce, include_self)


@lower(aten.scatter.src, aten.scatter.value)
def scatter(x, dim, index, src):
    return _scatter(x, dim, index, src)


@lower(aten.scatter.reduce, aten.scatter.value_reduce)
def scatter_reduce_legacy(x, dim, index, src, reduce):
    return _scatter(x, dim, index, src, reduce)


@lower(aten.scatter_add.default)
def scatter_add(x, dim, index, src):
    return _scatter(x, dim, index, src, "sum")


@lower(aten.scatter_reduce.two)
def scatter_reduce(x, dim, index, src, reduce, include_self=True):
    return _scatter(x, dim, index, src, reduce, include_self)


# ---------------------------------------------------------------- advanced indexing


def _advanced_index(x, indices):
    """A numpy-style index tuple for ``x[indices]`` (None entries are full slices)."""
    out = []
    # the CPU kernel checks indices as it visits the result's elements: none, none checked
    picked = jnp.broadcast_shapes(*[i.shape for i in indices if i is not None])
    kept = [n for d, n in enumerate(x.shape) if d >= len(indices) or indices[d] is None]
    visits = math.prod(picked) * math.prod(kept) != 0
    for d, i in enumerate(indices):
        if i is None:
            out.append(slice(None))
        else:
            if i.dtype == jnp.bool_ or i.dtype == jnp.uint8:
                raise RuntimeError("torch_jax internal error: boolean index reached the lowering")
            if x.shape[d] == 0 and i.size:
                # the CPU refuses any index into an empty dim, visited or not
                _context.check(True, IndexError, "index is out of bounds for dimension with size 0")
            elif visits:
                check_bounds(i, x.shape[d], d)
            out.append(wrap_index(i, x.shape[d]))
    return tuple(out)


@lower(aten.index.Tensor)
def index(x, indices):
    return x[_advanced_index(x, indices)]


@lower(aten.index_put.default)
def index_put(x, indices, values, accumulate=False):
    idx = _advanced_index(x, indices)
    if accumulate:
        return _reduce_at(x, idx, values, "sum")
    return x.at[idx].set(cast(values, x.dtype))


# ---------------------------------------------------------------- index_* along one dim


def _along(x, dim, index):
    """The numpy-style index of ``index`` (wrapped) along ``dim``."""
    idx = [slice(None)] * x.ndim
    idx[dim] = wrap_index(index, x.shape[dim])
    return tuple(idx)


# A 0-dim index keeps its dim (size 1) on CPU, where the Meta kernel drops it.
@lower(aten.index_select.default, trust_meta=False)
def index_select(x, dim, index):
    n = x.shape[dim] if x.ndim else 1
    _check_self_range(index, n)
    if x.ndim == 0:  # a 0-dim result whatever the index's shape, as on CPU
        return x
    return jnp.take(x, index.astype(jnp.int64).reshape(-1), axis=dim, mode="clip")


@lower(aten.index_add.default)
def index_add(x, dim, index, source, alpha=1):
    n = x.shape[dim] if x.ndim else 1
    check_bounds(index, n, dim)
    source = source & cast(alpha, jnp.bool_) if _is_bool(x) else source * alpha
    if x.ndim == 0:
        return _reduce_at(x.reshape(1), (wrap_index(index.reshape(-1), 1),), source.reshape(-1), "sum").reshape(())
    return _reduce_at(x, _along(x, dim, index.reshape(-1)), source, "sum")


@lower(aten.index_copy.default)
def index_copy(x, dim, index, source):
    n = x.shape[dim] if x.ndim else 1
    check_bounds(index, n, dim)
    if x.ndim == 0:
        return jnp.reshape(source, ())
    return x.at[_along(x, dim, index)].set(cast(source, x.dtype))


@lower(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def index_fill(x, dim, index, value):
    n = x.shape[dim] if x.ndim else 1
    check_bounds(index, n, dim)
    if x.ndim == 0:
        return jnp.where(index.size > 0, cast(value, x.dtype), x)
    return x.at[_along(x, dim, index)].set(cast(value, x.dtype))


@lower(aten.index_reduce.default)
def index_reduce(x, dim, index, source, reduce, include_self=True):
    n = x.shape[dim] if x.ndim else 1
    _check_self_range(index, n)
    if x.ndim == 0:
        idx = (index.reshape(-1).astype(jnp.int64),)
        return _reduce_at(x.reshape(1), idx, source.reshape(-1), reduce, include_self).reshape(())
    return _reduce_at(x, _along(x, dim, index.reshape(-1)), source, reduce, include_self)


# ---------------------------------------------------------------- flat indices


def _check_flat(index, n: int):
    if n == 0 and index.size:
        _context.check(jnp.asarray(True), IndexError, "take(): tried to take from an empty tensor")
        return
    bad = (index < -n) | (index >= n)
    msg = "out of range: tried to access index {value} on a tensor of " + f"{n} elements."
    _context.check(jnp.any(bad), IndexError, msg, _first_bad(bad, index))


@lower(aten.take.default)
def take(x, index):
    _check_flat(index, x.size)
    if x.size == 0:
        return jnp.zeros(index.shape, x.dtype)
    return jnp.take(x.reshape(-1), wrap_index(index, x.size), mode="clip")


@lower(aten.put.default)
def put(x, index, source, accumulate=False):
    _check_flat(index, x.size)
    if index.size == 0:
        return x
    idx = (wrap_index(index.reshape(-1), x.size),)
    flat, src = x.reshape(-1), source.reshape(-1)
    out = _reduce_at(flat, idx, src, "sum") if accumulate else flat.at[idx].set(cast(src, x.dtype))
    return out.reshape(x.shape)


# ---------------------------------------------------------------- masked_scatter


def _mask_slots(mask):
    """For each True element of ``mask`` (flattened), its rank among the True ones."""
    flat = mask.reshape(-1)
    return flat, jnp.cumsum(flat.astype(jnp.int64)) - 1


# masked_scatter itself is lowered in _sort (next to nonzero_static).


@lower(aten.masked_scatter_backward.default)
def masked_scatter_backward(g, mask, sizes):
    n = 1
    for s in sizes:
        n *= s
    flat, slot = _mask_slots(jnp.broadcast_to(mask, g.shape))
    # elements outside the mask go to position n, which the scatter drops
    pos = jnp.where(flat, slot, n)
    return jnp.zeros((n,), g.dtype).at[pos].add(g.reshape(-1), mode="drop").reshape(tuple(sizes))
