"""Ops whose output shape depends on values: nonzero, masked_select, and indexing
with boolean masks.

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


def index_put(self, indices, values, accumulate=False):
    return index_put_(self.clone(), indices, values, accumulate)


def kernels():
    return [
        (aten.nonzero.default, nonzero),
        (aten.masked_select.default, masked_select),
        (aten.index.Tensor, index),
        (aten.index_put_.default, index_put_),
        (aten.index_put.default, index_put),
    ]
