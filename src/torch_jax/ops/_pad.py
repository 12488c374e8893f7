"""Padding modes (reflection, replication) and their backward ops. Constant padding is
``constant_pad_nd`` in _shape; circular padding decomposes (``_pad_circular``) into
slices and cat.

Each padded dim is an index map, output position -> input position, built with numpy
at trace time: a gather forward, a scatter-add of the gradient backward (exactly the
transpose, so positions read twice get both contributions). Negative padding crops,
which the same map expresses.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from torch_jax.ops._registry import aten, lower


def _reflect(n: int, before: int, after: int):
    j = np.abs(np.arange(-before, n + after))
    return np.where(j >= n, 2 * (n - 1) - j, j)


def _replicate(n: int, before: int, after: int):
    return np.clip(np.arange(-before, n + after), 0, n - 1)


def _maps(shape, padding, index_map):
    """(axis, index map) for each padded dim; ``padding`` pairs start at the last dim."""
    for i in range(len(padding) // 2):
        d = len(shape) - 1 - i
        yield d, index_map(shape[d], padding[2 * i], padding[2 * i + 1])


def _pad(x, padding, index_map):
    for d, idx in _maps(x.shape, padding, index_map):
        x = jnp.take(x, idx, axis=d)
    return x


def _pad_backward(g, x, padding, index_map):
    maps = list(_maps(x.shape, padding, index_map))
    for d, idx in reversed(maps):  # undo the gathers in reverse order
        shape = g.shape[:d] + (x.shape[d],) + g.shape[d + 1 :]
        g = jnp.zeros(shape, g.dtype).at[(slice(None),) * d + (idx,)].add(g)
    return g


def _family(kind: str, index_map):
    for n in (1, 2, 3):
        forward = getattr(aten, f"{kind}_pad{n}d").default
        backward = getattr(aten, f"{kind}_pad{n}d_backward").default
        lower(forward)(lambda x, padding, _m=index_map: _pad(x, padding, _m))
        lower(backward)(lambda g, x, padding, _m=index_map: _pad_backward(g, x, padding, _m))


_family("reflection", _reflect)
_family("replication", _replicate)
