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
    return jnp.full(self.shape, cast(value, self.dtype), self.dtype)


@lower(aten.zero.default)
def zero(self):
    return jnp.zeros(self.shape, self.dtype)
