"""Kernels that only touch tensor metadata: allocation, views, set_ and resize_.

NOTE [Views through Meta redispatch]: only six view ops have no composite kernel
(as_strided, view, _reshape_alias, unfold, view_as_real, view_as_complex, plus the
dtype overload of view). Each redispatches to the op's Meta kernel, which builds a new
TensorImpl on the same StorageImpl, with the same key set and device, and without
touching data. PyTorch's ADInplaceOrView layer above tracks ``_base`` and ``_version``.
Every other view (select, slice, transpose, expand, diagonal, ...) decomposes into
these.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch

from torch_jax.device import _state as _devices
from torch_jax.tensor import _dtypes, _storage

aten = torch.ops.aten
META = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)
# set_ on a device storage: the CPU kernel only updates metadata when the storage is
# large enough (we check that first); the Meta kernel would try to resize it.
_SET_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


def _meta_view(op):
    handle = op._handle

    def kernel(*args):
        return handle.redispatch_boxed(META, *args)

    kernel.__name__ = f"meta_view_{op._schema.name.split('::')[1]}"
    return kernel


_as_strided_meta = aten.as_strided.default._handle.redispatch_boxed


def as_strided(self, size, stride, storage_offset=None):
    # the Meta kernel does not check the view against the storage (it has no data)
    offset = self.storage_offset() if storage_offset is None else storage_offset
    needed = _storage.storage_numel(size, stride, offset) * self.element_size()
    nbytes = self.untyped_storage().nbytes()
    if needed > nbytes:
        raise RuntimeError(
            f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset {offset}, and itemsize "
            f"{self.element_size()} requiring a storage size of {needed} are out of bounds for storage of size {nbytes}"
        )
    return _as_strided_meta(META, self, size, stride, storage_offset)


VIEW_OPS = [
    aten.view.default,
    aten.view.dtype,
    aten._reshape_alias.default,
    aten.unfold.default,
    aten.view_as_real.default,
    aten.view_as_complex.default,
]


def _check_dtype_and_layout(dtype, layout, op: str):
    if layout is not None and layout != torch.strided:
        raise RuntimeError(f"torch_jax: {op}: only torch.strided tensors are supported on jax, got {layout}")
    if dtype not in _dtypes.TO_NP:
        raise _dtypes.unsupported(dtype, op)


def _check_sizes(size, op: str):
    for s in size:
        if s < 0:
            raise RuntimeError(f"Trying to create tensor with negative dimension {s}: {list(size)}")


def empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    dtype = dtype or torch.get_default_dtype()
    _check_dtype_and_layout(dtype, layout, "empty")
    _check_sizes(size, "empty")
    index = _devices.index_of(device)
    _devices.device(index)
    stride = None
    if memory_format not in (None, torch.contiguous_format, torch.preserve_format):
        stride = torch.empty(size, dtype=dtype, device="meta", memory_format=memory_format).stride()
    return _storage.new_tensor(size, dtype, index, None, stride)


def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = dtype or torch.get_default_dtype()
    _check_dtype_and_layout(dtype, layout, "empty_strided")
    _check_sizes(size, "empty_strided")
    index = _devices.index_of(device)
    _devices.device(index)
    return _storage.new_tensor(size, dtype, index, None, stride)


def _storage_of(source):
    if isinstance(source, torch.Tensor):
        return source.untyped_storage()
    if isinstance(source, torch.TypedStorage):
        return source._untyped_storage
    return source


def set_source_storage_offset(self, source, storage_offset=0, size=(), stride=()):
    storage = _storage_of(source)
    if storage.device.type != self.device.type:
        raise RuntimeError(
            f'Attempted to set the storage of a tensor on device "{self.device}" to a storage on '
            f'different device "{storage.device}".  This is no longer allowed; the devices must match.'
        )
    stride = list(stride) if stride else _storage.contiguous_strides(size)
    needed = _storage.storage_numel(size, stride, storage_offset) * self.element_size()
    if needed > storage.nbytes():
        raise RuntimeError(
            f"setStorage: sizes {list(size)}, strides {stride}, storage offset {storage_offset}, "
            f"and itemsize {self.element_size()} requiring a storage size of {needed} are out of "
            f"bounds for storage of size {storage.nbytes()}"
        )
    return aten.set_.source_Storage_storage_offset.redispatch(_SET_KEYS, self, storage, storage_offset, size, stride)


def set_source_storage(self, source):
    storage = _storage_of(source)
    n = storage.nbytes() // self.element_size()
    return set_source_storage_offset(self, storage, 0, [n], [1])


def set_source_tensor(self, source):
    return set_source_storage_offset(
        self, source.untyped_storage(), source.storage_offset(), list(source.shape), list(source.stride())
    )


def set_default(self):
    fresh = _storage.new_tensor([0], self.dtype, _storage.box_of(self).index)
    return set_source_storage_offset(self, fresh.untyped_storage(), 0, [0], [1])


def resize_(self, size, memory_format=None):
    _check_sizes(size, "resize_")
    if memory_format not in (None, torch.contiguous_format, torch.preserve_format):
        stride = list(torch.empty(size, device="meta", memory_format=memory_format).stride())
    else:
        stride = _storage.contiguous_strides(size)
    offset = self.storage_offset()
    needed = _storage.storage_numel(size, stride, offset)
    storage = self.untyped_storage()
    box = _storage.box_of(self)
    if needed * self.element_size() <= storage.nbytes():
        aten.set_.source_Storage_storage_offset.redispatch(_SET_KEYS, self, storage, offset, size, stride)
        return self
    # NOTE [Growing a storage]: device storages have a fixed size (they are DLPack
    # imports), so growing moves the tensor onto a new, larger storage holding the old
    # contents; other tensors viewing the old storage keep it (CPU would grow in place).
    if self.dtype != box.dtype:
        raise RuntimeError(f"torch_jax: resize_ cannot grow a {self.dtype} view of a {box.dtype} storage")
    old = None if box.arr is None else _storage.array(box, "resize")
    if old is None:
        arr = None
    else:
        tail = jnp.zeros((needed - box.numel,), old.dtype)
        arr = jnp.concatenate([old.reshape(-1), tail])
    fresh = _storage.new_tensor([needed], box.dtype, box.index, arr)
    aten.set_.source_Storage_storage_offset.redispatch(_SET_KEYS, self, fresh.untyped_storage(), offset, size, stride)
    return self


def kernels():
    """(op, kernel) pairs of this module."""
    pairs = [(op, _meta_view(op)) for op in VIEW_OPS]
    pairs += [
        (aten.as_strided.default, as_strided),
        (aten.empty.memory_format, empty_memory_format),
        (aten.empty_strided.default, empty_strided),
        (aten.set_.source_Storage_storage_offset, set_source_storage_offset),
        (aten.set_.source_Storage, set_source_storage),
        (aten.set_.source_Tensor, set_source_tensor),
        (aten.set_.default, set_default),
        (aten.resize_.default, resize_),
    ]
    return pairs
