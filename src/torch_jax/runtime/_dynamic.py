"""Ops whose output shape depends on values: nonzero, masked_select, indexing with
boolean masks, unique/unique_consecutive, bincount, repeat_interleave with a tensor of
repeats, and equal (a host bool).

NOTE [Data-dependent shapes]: XLA computations have static shapes, so these ops count
first (one small computation and a read of one integer back to the host), then run a
computation compiled for that count. Setting through a boolean mask that covers the
leading dims with a value that broadcasts (``x[x > 0] = 0``) needs no count: it is a
``where``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch

from torch_jax.ops._sort import sort_keys
from torch_jax.runtime import _copy, _executor
from torch_jax.tensor import _storage

aten = torch.ops.aten


@jax.jit
def _count(x):
    return jnp.count_nonzero(x)


@functools.partial(jax.jit, static_argnums=1)
def _nonzero(x, size):
    if x.ndim == 0:
        return jnp.zeros((size, 0), jnp.int64)
    return jnp.stack(jnp.nonzero(x, size=size), axis=1).astype(jnp.int64)


@functools.partial(jax.jit, static_argnums=2)
def _masked_select(x, mask, size):
    shape = jnp.broadcast_shapes(x.shape, mask.shape)
    x, mask = jnp.broadcast_to(x, shape), jnp.broadcast_to(mask, shape)
    return x.reshape(-1)[jnp.nonzero(mask.reshape(-1), size=size)[0]]


def _count_of(arr) -> int:
    return int(_copy.to_numpy(_count(arr)))


def _bucket(n: int) -> int:
    """Counts are padded to a power of two so that changing counts reuse a few
    compiled computations; the padding is sliced off."""
    return 1 << max(n - 1, 0).bit_length()


def _index_of(t: torch.Tensor) -> int:
    return _storage.box_of(t).index


def nonzero(self):
    arr = _copy.logical_array(self)
    n = _count_of(arr)
    out = _nonzero(arr, _bucket(n))[:n]
    return _storage.new_tensor(out.shape, torch.int64, _index_of(self), out)


def masked_select(self, mask):
    if mask.dtype != torch.bool:
        raise RuntimeError(f"masked_select: expected BoolTensor for mask, got {mask.dtype}")
    x, m = _copy.logical_array(self), _copy.logical_array(mask)
    n = _count_of(jnp.broadcast_to(m, jnp.broadcast_shapes(x.shape, m.shape)))
    out = _masked_select(x, m, _bucket(n))[:n]
    return _storage.new_tensor(out.shape, self.dtype, _index_of(self), out)


def _has_mask(indices) -> bool:
    return any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices)


def _expand_masks(self, indices):
    """Boolean masks in an index list become the long indices of their True entries."""
    out = []
    dim = 0
    for i in indices:
        if i is None or i.dtype not in (torch.bool, torch.uint8):
            out.append(i)
            dim += 1
            continue
        if i.dtype == torch.uint8:
            i = i.to(torch.bool)
        for k in range(i.dim()):
            if dim + k >= self.dim() or i.shape[k] != self.shape[dim + k]:
                raise IndexError(
                    f"The shape of the mask {list(i.shape)} at index {k} does not match the shape of the "
                    f"indexed tensor {list(self.shape)} at index {dim + k}"
                )
        cols = nonzero(i) if i.dim() else None
        if i.dim() == 0:  # a 0-dim mask adds a dim of size 1 or 0
            raise NotImplementedError("torch_jax: indexing with a 0-dim boolean mask is not supported")
        out.extend(cols.select(1, k) for k in range(i.dim()))
        dim += i.dim()
    return out


def _on_device(self, indices):
    """Index tensors may be on the CPU (as with CUDA): they move to ``self``'s device."""
    return [i.to(self.device) if i is not None and i.is_cpu else i for i in indices]


def index(self, indices):
    indices = _on_device(self, indices)
    if _has_mask(indices):
        indices = _expand_masks(self, indices)
    return _executor.run(_executor.SPECS[aten.index.Tensor], (self, list(indices)))


def _where_fast(self, indices, values) -> bool:
    """``x[mask] = v`` as a where: one leading mask, v broadcasting to one element."""
    if len(indices) != 1 or indices[0] is None or indices[0].dtype != torch.bool:
        return False
    mask = indices[0]
    return mask.shape == self.shape[: mask.dim()] and values.numel() == 1


def index_put_(self, indices, values, accumulate=False):
    indices = _on_device(self, indices)
    if _has_mask(indices):
        if not accumulate and _where_fast(self, indices, values):
            mask = indices[0].reshape(tuple(indices[0].shape) + (1,) * (self.dim() - indices[0].dim()))
            return self.copy_(torch.where(mask, values.reshape(()).to(self.dtype), self))
        indices = _expand_masks(self, indices)
    return _executor.run(_executor.SPECS[aten.index_put_.default], (self, list(indices), values, accumulate))


def _index_put_impl_(self, indices, values, accumulate=False, unsafe=False):
    # what autograd's backward of indexing calls (with the forward's indices, masks included)
    return index_put_(self, indices, values, accumulate)


def index_put(self, indices, values, accumulate=False):
    return index_put_(self.clone(), indices, values, accumulate)


# ---------------------------------------------------------------- unique

# NOTE [Unique on device]: one computation sorts (stably, with PyTorch's order, NOTE
# [Sort keys]) and flags the first element of each group, and returns the number of
# groups; after reading that count, a second computation, compiled for the bucketed
# count, gathers the values, counts and inverse indices. Groups compare with ``!=``, as
# on the CPU: -0.0 joins 0.0 (the first in sorted order is kept), every NaN is its own.


def _rows_sort(rows):
    """(sorted rows, permutation): ``rows`` (N, M) in lexicographic order, stable."""
    keys = [k for j in range(rows.shape[1]) for k in sort_keys(rows[:, j])]
    perm = jnp.arange(rows.shape[0], dtype=jnp.int64)
    if keys:
        *_, perm = jax.lax.sort((*keys, perm), dimension=0, is_stable=True, num_keys=len(keys))
    return rows[perm], perm


@functools.partial(jax.jit, static_argnums=1)
def _groups(rows, consecutive: bool):
    """rows (N, M): (grouped rows, permutation, first-of-group flags, number of groups)."""
    if consecutive:
        vals, perm = rows, jnp.arange(rows.shape[0], dtype=jnp.int64)
    else:
        vals, perm = _rows_sort(rows)
    differs = jnp.any(vals[1:] != vals[:-1], axis=1)
    new = jnp.concatenate([jnp.ones((1,), jnp.bool_), differs])
    return vals, perm, new, jnp.sum(new)


@functools.partial(jax.jit, static_argnums=3)
def _gather_groups(vals, perm, new, size):
    gid = jnp.cumsum(new) - 1  # (N,) group of each sorted row
    first = jnp.nonzero(new, size=size)[0]
    uniq = vals[first]  # (size, M)
    counts = jnp.zeros((size,), jnp.int64).at[gid].add(1)
    inverse = jnp.zeros(perm.shape, jnp.int64).at[perm].set(gid)
    return uniq, inverse, counts


def _unique_rows(self, dim, consecutive: bool):
    """Unique slices of ``self`` along ``dim`` (None: of the elements): values, inverse, counts."""
    arr = _copy.logical_array(self)
    if dim is None:
        rows = arr.reshape(-1, 1)
    else:
        rows = jnp.moveaxis(arr, dim, 0)
        rows = rows.reshape(rows.shape[0], -1)
    vals, perm, new, count = _groups(rows, consecutive)
    n = int(_copy.to_numpy(count))
    uniq, inverse, counts = _gather_groups(vals, perm, new, _bucket(n))
    uniq, counts = uniq[:n], counts[:n]
    if dim is None:
        uniq = uniq.reshape(n)
        inverse = inverse.reshape(arr.shape)
    else:
        rest = jnp.moveaxis(arr, dim, 0).shape[1:]
        uniq = jnp.moveaxis(uniq.reshape((n,) + rest), 0, dim)
    i = _index_of(self)
    return (
        _storage.new_tensor(uniq.shape, self.dtype, i, uniq),
        _storage.new_tensor(inverse.shape, torch.int64, i, inverse),
        _storage.new_tensor(counts.shape, torch.int64, i, counts),
    )


def _on_cpu(op, self, *args):
    """Empty inputs (nothing to compute; PyTorch's special cases and errors) run on the CPU."""
    out = op(self.cpu(), *args)
    return tuple(o.to(self.device) for o in out)


def _empty_index(self):
    return torch.empty((0,), dtype=torch.int64, device=self.device)


def unique2(self, sorted=True, return_inverse=False, return_counts=False):
    # the CPU sorts whatever ``sorted`` says
    if self.numel() == 0:
        return _on_cpu(aten._unique2.default, self, sorted, return_inverse, return_counts)
    uniq, inverse, counts = _unique_rows(self, None, False)
    return uniq, inverse if return_inverse else _empty_index(self), counts if return_counts else _empty_index(self)


def unique(self, sorted=True, return_inverse=False):
    uniq, inverse, _ = unique2(self, sorted, return_inverse, False)
    return uniq, inverse


def unique_consecutive(self, return_inverse=False, return_counts=False, dim=None):
    if dim is not None:
        return unique_dim_consecutive(self, dim, return_inverse, return_counts)
    if self.numel() == 0:
        return _on_cpu(aten.unique_consecutive.default, self, return_inverse, return_counts, None)
    uniq, inverse, counts = _unique_rows(self, None, True)
    return uniq, inverse if return_inverse else _empty_index(self), counts if return_counts else _empty_index(self)


def _unique_dim(self, dim, consecutive, op, *args):
    if self.numel() == 0 or self.dim() == 0:
        return _on_cpu(op, self, dim, *args)
    # inverse and counts come back whether asked for or not, as on the CPU
    return _unique_rows(self, dim % self.dim(), consecutive)


def unique_dim(self, dim, sorted=True, return_inverse=False, return_counts=False):
    return _unique_dim(self, dim, False, aten.unique_dim.default, sorted, return_inverse, return_counts)


def unique_dim_consecutive(self, dim, return_inverse=False, return_counts=False):
    return _unique_dim(self, dim, True, aten.unique_dim_consecutive.default, return_inverse, return_counts)


# ---------------------------------------------------------------- bincount


@jax.jit
def _max_or_neg(x):
    return jnp.max(x.astype(jnp.int64), initial=-1), jnp.min(x.astype(jnp.int64), initial=0)


@functools.partial(jax.jit, static_argnums=(2, 3))
def _bincount(x, w, size, dtype):
    ones = jnp.ones(x.shape, dtype) if w is None else w.astype(dtype)
    return jnp.zeros((size,), dtype).at[x].add(ones)


def bincount(self, weights=None, minlength=0):
    if self.dim() != 1 or self.dtype.is_floating_point or self.dtype.is_complex or self.dtype == torch.bool:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if weights is not None and (weights.dim() != 1 or weights.shape[0] != self.shape[0]):
        raise RuntimeError("weights should be 1-d and have the same length as input")
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    arr = _copy.logical_array(self)
    hi, lo = (int(v) for v in _copy.to_numpy(jnp.stack(_max_or_neg(arr))))
    if lo < 0:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    size = max(hi + 1, minlength)
    # the CPU counts float weights in float, any other weights in double
    dtype = (
        torch.int64
        if weights is None
        else weights.dtype
        if weights.dtype in (torch.float32, torch.float64)
        else torch.float64
    )
    w = None if weights is None else _copy.logical_array(weights)
    np_dtype = (
        jnp.dtype(jnp.int64) if weights is None else jnp.dtype(jnp.float32 if dtype == torch.float32 else jnp.float64)
    )
    out = _bincount(arr, w, size, np_dtype)
    return _storage.new_tensor(out.shape, dtype, _index_of(self), out)


# ---------------------------------------------------------------- repeat_interleave


@jax.jit
def _total_and_min(repeats):
    return jnp.stack([jnp.sum(repeats.astype(jnp.int64)), jnp.min(repeats.astype(jnp.int64), initial=0)])


@functools.partial(jax.jit, static_argnums=1)
def _repeat_index(repeats, size):
    return jnp.repeat(jnp.arange(repeats.shape[0], dtype=repeats.dtype), repeats, total_repeat_length=size)


def repeat_interleave(repeats, output_size=None):
    """``repeat_interleave(repeats)``: index i repeated repeats[i] times (what
    ``x.repeat_interleave(tensor, dim)`` gathers with). The total is read from the device."""
    if repeats.dim() != 1:
        raise RuntimeError("repeat_interleave only accept 1D vector as repeat")
    if repeats.dtype not in (torch.int32, torch.int64):
        from torch_jax.runtime._install import _dtype_name

        raise NotImplementedError(f"\"repeat_interleave_cpu\" not implemented for '{_dtype_name(repeats.dtype)}'")
    arr = _copy.logical_array(repeats)
    total, low = (int(v) for v in _copy.to_numpy(_total_and_min(arr)))
    if low < 0:
        raise RuntimeError("repeats can not be negative")
    if output_size is not None and output_size != total:
        raise RuntimeError("allocated size does not match required size")
    out = _repeat_index(arr, _bucket(total))[:total] if total else jnp.zeros((0,), arr.dtype)
    return _storage.new_tensor(out.shape, repeats.dtype, _index_of(repeats), out)


# ---------------------------------------------------------------- equal


def equal(self, other):
    if self.shape != other.shape:
        return False
    if self.numel() == 0:
        return True
    return bool(torch.eq(self, other).all().item())


def _out_kernel(fn, names):
    """The ``out=`` overload of a kernel above: run it, then resize and copy into the outs."""

    def kernel(*args, **kwargs):
        from torch_jax.runtime._install import write_out

        n_pos = len(names) - sum(1 for n in names if n in kwargs)
        outs = list(args[len(args) - n_pos :]) if n_pos else []
        args = args[: len(args) - n_pos]
        outs += [kwargs.pop(n) for n in names if n in kwargs]
        result = fn(*args, **kwargs)
        if isinstance(result, tuple) and len(outs) < len(result):
            result = result[: len(outs)]
        return write_out(result, tuple(outs))

    kernel.__name__ = fn.__name__ + "_out"
    return kernel


_OUT1, _OUT2, _OUT3 = ("out",), ("out0", "out1"), ("out0", "out1", "out2")


def kernels():
    return [
        (aten.nonzero.default, nonzero),
        (aten.masked_select.default, masked_select),
        (aten.index.Tensor, index),
        (aten.index_put_.default, index_put_),
        (aten.index_put.default, index_put),
        (aten._index_put_impl_.default, _index_put_impl_),
        (aten._unique2.default, unique2),
        (aten._unique.default, unique),
        (aten.unique_consecutive.default, unique_consecutive),
        (aten.unique_dim.default, unique_dim),
        (aten.unique_dim_consecutive.default, unique_dim_consecutive),
        (aten.bincount.default, bincount),
        (aten.equal.default, equal),
        (aten.repeat_interleave.Tensor, repeat_interleave),
        (aten.nonzero.out, _out_kernel(nonzero, _OUT1)),
        (aten.masked_select.out, _out_kernel(masked_select, _OUT1)),
        (aten._unique2.out, _out_kernel(unique2, _OUT3)),
        (aten._unique.out, _out_kernel(unique, _OUT2)),
        (aten.unique_consecutive.out, _out_kernel(unique_consecutive, _OUT3)),
        (aten.unique_dim.out, _out_kernel(unique_dim, _OUT3)),
        (aten.unique_dim_consecutive.out, _out_kernel(unique_dim_consecutive, _OUT3)),
        (aten.bincount.out, _out_kernel(bincount, _OUT1)),
        (aten.repeat_interleave.Tensor_out, _out_kernel(repeat_interleave, _OUT1)),
    ]
