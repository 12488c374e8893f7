"""Reading and writing a strided view of a storage, as pure JAX functions.

A view is (size, stride, offset, dtype) over a storage array. Everything here runs
at trace time with static metadata, inside the one XLA computation of the op that
reads or writes the view, so XLA fuses the view with the op.

NOTE [Strided views as slices]: a view whose dims, sorted by decreasing stride, nest
(each stride divides the one before, and a dim's extent fits inside the stride before
it) is a chain of reshape + prefix-slice steps on a window of the storage: transposes,
row and column slices, step slices, selects, diagonals and dtype views all are. Such
views read and write without gather or scatter. Anything else (overlapping windows
from ``unfold``, strides that do not nest) uses an iota-computed gather/scatter.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax

_BOOL = np.dtype(np.bool_)


def _float_of_size(nbytes: int) -> np.dtype:
    return np.dtype({2: np.float16, 4: np.float32, 8: np.float64}[nbytes])


def bitcast(flat, dst: np.dtype):
    """Reinterpret the bytes of a 1-D array as ``dst`` elements (1-D result)."""
    src = np.dtype(flat.dtype)
    dst = np.dtype(dst)
    if src == dst:
        return flat
    if src == _BOOL:
        return bitcast(flat.astype(np.uint8), dst)
    if dst == _BOOL:
        return bitcast(flat, np.dtype(np.uint8)) != 0
    if src.kind == "c":
        parts = jnp.stack([jnp.real(flat), jnp.imag(flat)], axis=-1).reshape(-1)
        return bitcast(parts, dst)
    if dst.kind == "c":
        half = _float_of_size(dst.itemsize // 2)
        pairs = bitcast(flat, half).reshape(-1, 2)
        return lax.complex(pairs[:, 0], pairs[:, 1])
    if src.itemsize == dst.itemsize:
        return lax.bitcast_convert_type(flat, dst)
    if src.itemsize > dst.itemsize:
        return lax.bitcast_convert_type(flat, dst).reshape(-1)
    ratio = dst.itemsize // src.itemsize
    return lax.bitcast_convert_type(flat.reshape(-1, ratio), dst)


def _plan(size, stride):
    """Dims that matter (size > 1, stride > 0) sorted by decreasing stride, and
    whether they nest as a chain (NOTE [Strided views as slices])."""
    dims = [d for d in range(len(size)) if size[d] > 1 and stride[d] != 0]
    order = sorted(dims, key=lambda d: -stride[d])
    chain = all(
        stride[prev] % stride[cur] == 0 and size[cur] * stride[cur] <= stride[prev]
        for prev, cur in zip(order, order[1:])
    )
    return order, chain


def _is_block(order, size, stride) -> bool:
    """The sorted dims are one contiguous block of memory."""
    if not order:
        return True
    if stride[order[-1]] != 1:
        return False
    return all(size[cur] * stride[cur] == stride[prev] for prev, cur in zip(order, order[1:]))


def _span(size, stride) -> int:
    """Elements from a view's first element to its last, inclusive."""
    return 1 + sum((n - 1) * s for n, s in zip(size, stride) if n > 1)


def _window(flat, offset, span: int, extent: int):
    """The ``span`` elements of ``flat`` from ``offset`` on (``offset`` may be traced),
    zero-padded to ``extent``."""
    win = lax.dynamic_slice(flat, (offset,), (span,))
    if extent > span:
        win = jnp.concatenate([win, jnp.zeros((extent - span,), flat.dtype)])
    return win


def _to_logical(block, order, size):
    """``block`` has the sorted dims' sizes; put them back in logical order, add size-1
    dims and broadcast stride-0 dims."""
    if len(order) > 1:
        block = jnp.transpose(block, np.argsort(order))
    kept = set(order)
    block = block.reshape([size[d] if d in kept else 1 for d in range(len(size))])
    return jnp.broadcast_to(block, tuple(size))


def _linear_index(size, stride, offset: int):
    idx = jnp.full(tuple(size), offset, dtype=jnp.int64)
    for d, s in enumerate(stride):
        if size[d] > 1 and s != 0:
            idx = idx + lax.broadcasted_iota(jnp.int64, tuple(size), d) * s
    return idx


def slices_at(numel: int, size, stride, offset: int) -> bool:
    """Whether the view (size, stride) at ``offset`` is one slice of the storage (``numel``
    elements) seen as an array of the view's nested strides (NOTE [Views as slices of
    the storage's nested shape])."""
    dims = sorted(((stride[d], size[d]) for d in range(len(size)) if size[d] > 1 and stride[d] != 0), reverse=True)
    extent, rem = numel, offset  # (the span of the level around each dim, and the offset within it)
    for s, n in dims:
        if extent % s or rem // s + n > extent // s:
            return False
        extent, rem = s, rem % s
    return bool(dims)


def _as_slice(flat, size, stride, offset, aligned: bool) -> bool:
    """Whether to read or write the view as a slice of the nested shape: the op's key
    says so for a traced offset (``aligned``), :func:`slices_at` for a static one."""
    return aligned or (isinstance(offset, int) and slices_at(flat.shape[0], size, stride, offset))


def _nested(numel: int, strides, offset):
    """The storage's nested shape for a chain's sorted strides (NOTE [Views as slices of
    the storage's nested shape]) and ``offset`` (maybe traced) as start indices in it."""
    shape = [numel // strides[0]] + [a // b for a, b in zip(strides, strides[1:])] + [strides[-1]]
    starts, rem = [], offset
    for s in strides:
        starts.append(rem // s)
        rem = rem % s
    return shape, (*starts, rem)


def read_strided(flat, size, stride, offset, aligned=False):
    """The logical array of the view (size, stride, offset) of a 1-D array; ``offset``
    may be traced (NOTE [Dynamic storage offsets] in runtime/_executor.py), and then
    ``aligned`` says what :func:`slices_at` said of it."""
    size = tuple(size)
    if math.prod(size) == 0:
        return jnp.zeros(size, flat.dtype)
    order, chain = _plan(size, stride)
    if not chain:
        return flat[_linear_index(size, stride, offset)]
    sizes = [size[d] for d in order]
    strides = [stride[d] for d in order]
    if _is_block(order, size, stride):
        count = math.prod(sizes)
        block = lax.dynamic_slice(flat, (offset,), (count,)).reshape(sizes)
        return _to_logical(block, order, size)
    if _as_slice(flat, size, stride, offset, aligned):
        # NOTE [Views as slices of the storage's nested shape]: a chain view's storage,
        # reshaped to the chain's strides (rows of strides[0], each of strides[0] //
        # strides[1] blocks, ...), holds the view as one dynamic slice when the view's
        # offset, written in those digits, leaves room for each dim's size: the q, k and
        # v chunks of a split, a column block, x[i] of a batch of matrices. XLA fuses
        # that slice into what reads it; the window below is a copy of the whole span.
        # Which views slice is part of the op's key (runtime/_executor).
        shape, starts = _nested(flat.shape[0], strides, offset)
        block = lax.dynamic_slice(flat.reshape(shape), starts, (*sizes, 1))
        return _to_logical(block[..., 0], order, size)
    extent = sizes[0] * strides[0]
    block = _window(flat, offset, _span(size, stride), extent).reshape(sizes[0], strides[0])
    for n, s in zip(sizes[1:], strides[1:]):
        block = block[..., : n * s].reshape(*block.shape[:-1], n, s)
    return _to_logical(block[..., 0], order, size)


def has_internal_overlap(size, stride) -> bool:
    """PyTorch's MemOverlap::Yes: some element is reachable through two indices (an empty
    tensor has no elements to overlap)."""
    return math.prod(size) != 0 and any(n > 1 and s == 0 for n, s in zip(size, stride))


def write_strided(flat, size, stride, offset, value, aligned=False):
    """``flat`` with the view (size, stride, offset) replaced by ``value`` (broadcast);
    ``aligned`` as for :func:`read_strided`."""
    size = tuple(size)
    if math.prod(size) == 0:
        return flat
    value = jnp.broadcast_to(value.astype(flat.dtype), size)
    if has_internal_overlap(size, stride):
        # only fill_/zero_ write through an expanded view (every element gets one value):
        # write the first element of each repeated dim
        size = tuple(1 if s == 0 else n for n, s in zip(size, stride))
        value = value[tuple(slice(0, n) for n in size)]
    order, chain = _plan(size, stride)
    if not chain:
        idx = _linear_index(size, stride, offset).reshape(-1)
        return flat.at[idx].set(value.reshape(-1))
    sizes = [size[d] for d in order]
    strides = [stride[d] for d in order]
    # the values in sorted-dim order (drop size-1 dims; internal overlap was rejected)
    vals = value.reshape([size[d] for d in range(len(size)) if d in set(order)] or [1])
    if len(order) > 1:
        pos = {d: i for i, d in enumerate(sorted(order))}
        vals = jnp.transpose(vals, [pos[d] for d in order])
    if _is_block(order, size, stride):
        return lax.dynamic_update_slice(flat, vals.reshape(-1), (offset,))
    if _as_slice(flat, size, stride, offset, aligned):
        shape, starts = _nested(flat.shape[0], strides, offset)
        nested = lax.dynamic_update_slice(flat.reshape(shape), vals.reshape(*sizes, 1), starts)
        return nested.reshape(-1)
    # inverse of the read chain: pad each level out to the stride above it
    data = vals[..., None]
    mask = jnp.ones(data.shape, jnp.bool_)
    for k in range(len(sizes) - 1, -1, -1):
        pad = strides[k] - data.shape[-1]
        data = jnp.pad(data, [(0, 0)] * (data.ndim - 1) + [(0, pad)])
        mask = jnp.pad(mask, [(0, 0)] * (mask.ndim - 1) + [(0, pad)])
        if k > 0:
            lead = data.shape[:-2]
            data = data.reshape(*lead, sizes[k] * strides[k])
            mask = mask.reshape(*lead, sizes[k] * strides[k])
    extent = sizes[0] * strides[0]
    span = _span(size, stride)
    data = data.reshape(extent)
    mask = mask.reshape(extent)
    window = jnp.where(mask, data, _window(flat, offset, span, extent))
    return lax.dynamic_update_slice(flat, window[:span], (offset,))


def storage_in_units(arr, box_dtype: np.dtype, numel: int, dtype: np.dtype):
    """The storage as a 1-D array of ``dtype`` elements (zeros if uninitialized)."""
    flat = jnp.zeros((numel,), box_dtype) if arr is None else arr.reshape(-1)
    return bitcast(flat, dtype)


def read(arr, box_dtype, numel, view, aligned=False):
    """The logical array of ``view`` = (size, stride, offset, dtype) over a storage."""
    size, stride, offset, dtype = view
    return read_strided(storage_in_units(arr, box_dtype, numel, dtype), size, stride, offset, aligned)


def write(arr, box_dtype, numel, view, value, aligned=False):
    """The new storage array after writing ``value`` through ``view``; keeps arr's shape."""
    size, stride, offset, dtype = view
    units = storage_in_units(arr, box_dtype, numel, dtype)
    units = write_strided(units, size, stride, offset, value, aligned)
    flat = bitcast(units, box_dtype)
    return flat if arr is None else flat.reshape(arr.shape)
