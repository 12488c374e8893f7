"""Copies, casts and fills: the ops every tensor program runs."""

from __future__ import annotations

import jax.numpy as jnp

from torch_jax.ops import _context
from torch_jax.ops._promote import cast
from torch_jax.ops._registry import aten, lower


@lower(aten.clone.default)
def clone(x, memory_format=None):
    return x


@lower(aten.copy.default)
def copy(self, src, non_blocking=False):
    return jnp.broadcast_to(cast(src, self.dtype), self.shape)


@lower(aten._to_copy.default)
def to_copy(x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    return cast(x, _context.out_dtype())


@lower(aten.fill.Scalar, aten.fill.Tensor)
def fill(self, value):
    if jnp.ndim(value):  # (torch 2.13's Meta kernel says so; earlier ones leave it to the CPU's)
        raise RuntimeError(
            f"fill_ only supports 0-dimension value tensor but got tensor with {jnp.ndim(value)} dimensions."
        )
    return jnp.full(self.shape, cast(value, self.dtype), self.dtype)


@lower(aten.zero.default)
def zero(self):
    return jnp.zeros(self.shape, self.dtype)
