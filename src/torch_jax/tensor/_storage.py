"""Device tensors: a PrivateUse1 TensorImpl whose storage carries a box with a JAX array.

NOTE [Views share the storage box]: the payload of a device tensor is a :class:`Box`
attached to the Python object of its StorageImpl (``t.untyped_storage()._box``),
never to the tensor. Views (select, slice, transpose, ...) are new TensorImpls on the
same StorageImpl, so they reach the same box; an in-place write through any of them
replaces ``box.arr`` and every other view sees it. Attributes on the tensor object
would be lost through ``detach``, ``nn.Parameter`` and tensors saved by autograd;
the storage object survives all of them (see ../shared/DESIGN.md).

NOTE [DLPack tensor creation]: a TensorImpl is made by handing PyTorch a DLPack
capsule with device type kDLExtDev, which PyTorch maps to PrivateUse1 with any device
index. The capsule's data pointer is a fake address, unique per storage and never
dereferenced, so that ``data_ptr()`` and the overlap checks that compare address
ranges behave as on CPU, and ``untyped_storage().nbytes()`` is right. PyTorch copies
what it needs out of the capsule when it imports it and later only calls the capsule's
deleter (with the capsule's address) when the storage dies. So the capsule header is
one buffer per thread, rewritten for each import and never freed, whose deleter is libc
``labs``: a C function that ignores its argument and touches no memory (a Python
callback as deleter crashes at interpreter exit; ``free`` would need a fresh malloc per
tensor).
"""

from __future__ import annotations

import ctypes
import struct
import threading

import torch

from torch_jax.device._memory import USAGE, Usage, usage  # noqa: F401 (NOTE [Memory accounting])
from torch_jax.tensor import _dtypes

_libc = ctypes.CDLL(None)
_NO_OP_DELETER = ctypes.cast(_libc.labs, ctypes.c_void_p).value
# (a prototype of our own: ctypes.pythonapi.PyCapsule_New is one object shared by the
# process, whose argtypes others set, jax.ffi.pycapsule among them)
capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi)
)
_from_dlpack = torch._C._from_dlpack

# DLManagedTensor: data, device(type, id), ndim, dtype(code, bits, lanes), shape*, strides*,
# byte_offset, manager_ctx, deleter; followed here by the shape and strides arrays.
_HEADER = struct.Struct("<QiiiBBHQQQQQ")
_KDL_EXT_DEV = 12
_DL_CODES = {
    torch.float64: (2, 64),
    torch.float32: (2, 32),
    torch.float16: (2, 16),
    torch.bfloat16: (4, 16),
    torch.int64: (0, 64),
    torch.int32: (0, 32),
    torch.int16: (0, 16),
    torch.int8: (0, 8),
    torch.uint8: (1, 8),
    torch.uint16: (1, 16),
    torch.uint32: (1, 32),
    torch.uint64: (1, 64),
    torch.bool: (6, 8),
    torch.complex64: (5, 64),
    torch.complex128: (5, 128),
}
_ITEMSIZE = {dt: bits // 8 for dt, (_, bits) in _DL_CODES.items()}
_DIMS = {}  # ndim -> struct for shape + strides

_addr_lock = threading.Lock()
_next_addr = 1 << 40
_ALIGN = 64
_tracer = None  # while torch.profiler records memory: called with each allocation and free (runtime/_profiler)


def _fake_address(nbytes: int) -> int:
    """A fresh address range of nbytes, disjoint from every other storage's."""
    global _next_addr
    with _addr_lock:
        addr = _next_addr
        _next_addr = addr + ((nbytes + _ALIGN - 1) // _ALIGN + 1) * _ALIGN
    return addr


class Box:
    """The payload of one storage: a JAX array holding its elements.

    ``arr`` has ``numel`` elements of ``dtype`` (any shape; usually the shape of the
    tensor that wrote it last, so that the common read needs no reshape), or is None
    for a storage that was allocated and never written (it reads as zeros). A box's
    bytes count as allocated on its device while it lives (NOTE [Memory accounting]).
    """

    __slots__ = ("arr", "dtype", "numel", "index", "nbytes", "__weakref__")

    def __init__(self, arr, dtype: torch.dtype, numel: int, index: int, nbytes: int):
        self.arr = arr
        self.dtype = dtype
        self.numel = numel
        self.index = index
        self.nbytes = nbytes
        try:
            u = USAGE[index]
        except IndexError:
            u = usage(index)
        u.current += nbytes
        u.count += 1
        u.allocated += nbytes
        u.allocs += 1
        if u.current > u.peak:
            u.peak = u.current
        if u.count > u.count_peak:
            u.count_peak = u.count
        if _tracer is not None:
            _tracer(index, nbytes, u)

    def __del__(self, _usage=USAGE):  # (bound here: module globals are gone at interpreter exit)
        u = _usage[self.index]
        u.current -= self.nbytes
        u.count -= 1
        u.freed += self.nbytes
        u.frees += 1
        if _tracer is not None:
            _tracer(self.index, -self.nbytes, u)

    def __repr__(self) -> str:
        state = "uninitialized" if self.arr is None else f"shape={tuple(self.arr.shape)}"
        return f"Box({self.dtype}, numel={self.numel}, jax:{self.index}, {state})"


class Pending:
    """An array that fused eager has recorded but not computed yet (NOTE [Fused eager]
    in runtime/_fused): output ``out`` of node ``node`` of ``graph``, with the shape and
    dtype it will have. ``value`` holds the array once the graph has run."""

    __slots__ = ("graph", "node", "out", "shape", "dtype", "value", "replaced", "__weakref__")

    def __init__(self, graph, node: int, out: int, shape, dtype):
        self.graph = graph
        self.node = node
        self.out = out
        self.shape = shape
        self.dtype = dtype
        self.value = None
        self.replaced = None  # the graph input this result replaced in its storage (its position)

    def resolve(self, reason: str):
        if self.value is None:
            self.graph.flush(reason)
        return self.value


class Padded:
    """A storage's elements in a larger array (NOTE [Buckets] in runtime/_buckets): the
    whole, contiguous tensor of logical shape ``shape`` is ``arr`` (a JAX array or a
    ``Pending`` one) cut to ``shape[dim]`` along ``dim``, where ``arr`` has a bucket's
    size; what lies past it is not part of the tensor. Only ops that know buckets read
    ``arr`` itself; everything else reads the storage through :func:`array`, which cuts
    it to its logical shape first."""

    __slots__ = ("arr", "shape", "dim")

    def __init__(self, arr, shape: tuple, dim: int):
        self.arr, self.shape, self.dim = arr, shape, dim

    @property
    def length(self) -> int:
        return self.shape[self.dim]

    def logical(self, reason: str):
        arr = self.arr
        if arr.__class__ is Pending:
            arr = arr.resolve(reason)
        return _cut(arr, self.dim, self.length)


def _cut(arr, dim: int, length: int):
    """``arr`` cut to ``length`` along ``dim``: on the host for an array in host memory
    (a copy, nothing to compile per length), else a slice."""
    import jax
    import numpy as np

    index = (slice(None),) * dim + (slice(0, length),)
    if all(d.platform == "cpu" for d in arr.devices()):
        host = np.ascontiguousarray(np.asarray(arr)[index])
        return jax.device_put(host, arr.sharding)
    return arr[index]


def replace(box: Box, arr) -> None:
    """``box.arr = arr``, where a pending ``arr`` remembers which input of its graph the
    storage held before the graph (NOTE [Donation] in runtime/_fused pairs the two)."""
    if arr.__class__ is Pending:
        old = box.arr
        if old.__class__ is Pending and old.value is None:
            arr.replaced = old.replaced if old.graph is arr.graph else None
        else:
            if old.__class__ is Pending:
                old = old.value
            arr.replaced = arr.graph.input_ids.get(id(old))  # (the graph holds its inputs: ids stay theirs)
    box.arr = arr


def array(box: Box, reason: str = "read"):
    """``box.arr`` as a real array: a pending one is computed first (``reason`` says why,
    for the materialization counters)."""
    arr = box.arr
    if arr.__class__ is Pending:
        arr = box.arr = arr.resolve(reason)
    elif arr.__class__ is Padded:
        arr = box.arr = arr.logical(reason)
    return arr


class Template:
    """Everything about a new tensor that does not change from call to call: its
    DLPack header (all but the data pointer) and its shape and strides arrays, which
    PyTorch copies when it imports the capsule (so they can live here, not in the
    capsule's memory)."""

    __slots__ = ("tail", "dims", "size", "stride", "dtype", "index", "numel", "nbytes", "view_dtype")

    def __init__(self, size, stride, dtype: torch.dtype, index: int, numel: int):
        self.size = list(size)
        self.stride = list(stride)
        self.dtype = dtype
        self.index = index
        self.numel = numel
        self.nbytes = numel * dtype.itemsize
        self.view_dtype = None
        code = _DL_CODES.get(dtype)
        if code is None:
            if dtype.is_floating_point and dtype.itemsize == 1 and dtype in _dtypes.TO_NP:
                # float8 types: a uint8 capsule, reinterpreted (same itemsize)
                code = _DL_CODES[torch.uint8]
                self.view_dtype = dtype
            else:
                raise _dtypes.unsupported(dtype)
        ndim = len(size)
        self.dims = ctypes.create_string_buffer(struct.pack(f"<{2 * ndim}q", *size, *stride), 16 * ndim or 1)
        base = ctypes.addressof(self.dims)
        fields = (_KDL_EXT_DEV, index, ndim, code[0], code[1], 1, base, base + 8 * ndim, 0, 0, _NO_OP_DELETER)
        self.tail = _HEADER.pack(0, *fields)[8:]

    def tensor(self, arr=None) -> torch.Tensor:
        """A new tensor over a new storage whose box holds ``arr``."""
        try:
            header = _headers.header
        except AttributeError:
            header = _new_header()
        if header.template is not self:  # (the header still holds this template's fields)
            header.view[8:] = self.tail
            header.template = self
        _pack_address(header.view, 0, _fake_address(self.nbytes))
        t = _from_dlpack(capsule_new(header.addr, b"dltensor", None))
        if self.view_dtype is not None:
            t = torch.ops.aten.view.dtype(t, self.view_dtype)
        t.untyped_storage()._box = Box(arr, self.dtype, self.numel, self.index, self.nbytes)
        return t


class _Header:
    """One thread's capsule header: its memory (``buf``, written through ``view``), its
    address and the template whose fields it holds; a new tensor of the template written
    last rewrites only the data pointer."""

    __slots__ = ("buf", "view", "addr", "template")

    def __init__(self):
        self.buf = ctypes.create_string_buffer(_HEADER.size)
        self.view = memoryview(self.buf).cast("B")
        self.addr = ctypes.addressof(self.buf)
        self.template = None


_headers = threading.local()
_all_headers: list = []  # never freed: PyTorch reads a header's deleter when its storage dies
_pack_address = struct.Struct("<Q").pack_into


def _new_header() -> _Header:
    header = _Header()
    _all_headers.append(header)
    _headers.header = header
    return header


_templates: dict = {}


def template(size, stride, dtype: torch.dtype, index: int) -> Template:
    key = (tuple(size), tuple(stride), dtype, index)
    tpl = _templates.get(key)
    if tpl is None:
        if len(_templates) > 4096:
            _templates.clear()
        tpl = _templates[key] = Template(size, stride, dtype, index, storage_numel(size, stride))
    return tpl


def contiguous_strides(size) -> list[int]:
    strides = [1] * len(size)
    acc = 1
    for i in range(len(size) - 1, -1, -1):
        strides[i] = acc
        acc *= max(size[i], 1)
    return strides


def dense_perm(size, stride):
    """If (size, stride) is non-overlapping and dense, the dims in memory order
    (outermost first; the identity for contiguous); else None."""
    order = sorted(range(len(size)), key=lambda d: (-stride[d], d))
    expected = 1
    for d in reversed(order):
        if size[d] != 1:
            if stride[d] != expected:
                return None
            expected *= size[d]
    return order


def storage_numel(size, stride, offset: int = 0) -> int:
    """Elements a storage needs to hold a tensor of this size/stride/offset."""
    last = offset  # (a plain loop: every as_strided, so every t() and transpose, asks)
    for n, s in zip(size, stride):
        if n == 0:
            return 0
        last += (n - 1) * s
    return last + 1


_META = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)
_as_strided = torch.ops.aten.as_strided.default


def new_tensor(size, dtype: torch.dtype, index: int, arr=None, stride=None, numel=None, offset=0):
    """A device tensor on jax:index over a new storage whose box holds ``arr``.

    ``arr`` (a JAX array with ``numel`` elements) may be None: the storage is then
    uninitialized and reads as zeros. ``stride`` defaults to contiguous; ``numel``
    (elements of the storage) defaults to what size, stride and offset need.
    """
    stride = contiguous_strides(size) if stride is None else stride
    needed = storage_numel(size, stride, offset)
    if (numel is None or numel == needed) and offset == 0:
        return template(size, stride, dtype, index).tensor(arr)
    base = template([numel], [1], dtype, index).tensor(arr)
    return _as_strided.redispatch(_META, base, list(size), list(stride), offset)


def box_of(t: torch.Tensor) -> Box:
    try:
        return t.untyped_storage()._box
    except AttributeError:
        if t.device.type != torch._C._get_privateuse1_backend_name():
            raise RuntimeError(f"torch_jax: expected a jax tensor, got one on {t.device}") from None
        raise RuntimeError(
            "torch_jax: this jax tensor has no storage payload (was it created by a path that "
            "bypasses the jax allocator, e.g. torch.UntypedStorage(n, device='jax')?)"
        ) from None


def itemsize(dtype: torch.dtype) -> int:
    return _ITEMSIZE.get(dtype) or dtype.itemsize
