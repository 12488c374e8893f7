"""Copies: host <-> device, device <-> device, and reading values back to Python.

NOTE [One copy each way]: host to device, the CPU tensor's memory is viewed as numpy
without a copy and handed to JAX once (on the CPU platform JAX aliases a numpy
buffer, so we give it a private copy, which is then the only copy). Device to host,
JAX's buffer is viewed without a copy where it is host memory (or fetched once where
it is not) and copied once into the CPU tensor.
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import torch

from torch_jax._config import config
from torch_jax.device import _state as _devices
from torch_jax.ops import _context
from torch_jax.runtime import _buckets, _compile_cache, _executor, _fused, _profiler, _stats
from torch_jax.tensor import _dtypes, _storage

aten = torch.ops.aten


def _whole_dense_perm(t: torch.Tensor):
    """If ``t`` covers its whole storage densely, its dims in memory order (identity
    for contiguous); else None."""
    box = _storage.box_of(t)
    if t.dtype != box.dtype or t.numel() != box.numel or t.storage_offset() != 0:
        return None
    return _storage.dense_perm(t.shape, t.stride())


# ---------------------------------------------------------------- host -> device


def upload(a: np.ndarray, index: int, non_blocking: bool = False):
    """A JAX array on jax:index holding the values of the numpy array ``a`` (one copy)."""
    dev = _devices.device(index)
    _stats.counters["host_transfers"] += 1
    if dev.platform == "cpu":
        # JAX's CPU client aliases a 64-byte aligned numpy buffer (and copies any other):
        # our own aligned copy, which nobody else writes, becomes the device buffer
        buf = _aligned_copy(a)
        arr = _put(buf, index)
        if buf.size and arr.unsafe_buffer_pointer() != buf.ctypes.data:
            _stats.counters["extra_host_copies"] += 1
        return arr
    arr = _put(np.ascontiguousarray(a), index)
    if not non_blocking:
        arr.block_until_ready()  # the CPU tensor may be written as soon as we return
    return arr


try:  # NOTE [Direct device_put]
    from jax._src import core as _jax_core
    from jax._src.interpreters.pxla import batched_device_put as _batched_device_put
except ImportError:  # (a JAX without these internals: the public call)
    _batched_device_put = None


def _put(a: np.ndarray, index: int):
    """``jax.device_put(a, device)`` for a numpy array.

    NOTE [Direct device_put]: ``jax.device_put`` reaches, for a numpy array and one
    device, ``pxla.batched_device_put`` after about 20 us of Python (argument trees,
    copy semantics, sharding checks); calling it directly costs about 5 us. Every
    upload (``torch.tensor(..., device="jax")``, a batch's ``.to("jax")``) pays it."""
    dev = _devices.device(index)
    if _batched_device_put is None:
        return jax.device_put(a, dev)
    return _batched_device_put(_jax_core.ShapedArray(a.shape, a.dtype), _devices.sharding(index), [a], [dev])


def _aligned_copy(a: np.ndarray, align: int = 64) -> np.ndarray:
    """A C-contiguous copy of ``a`` whose data starts on an ``align``-byte boundary."""
    raw = np.empty(a.nbytes + align, np.uint8)
    start = (-raw.ctypes.data) % align
    out = raw[start : start + a.nbytes].view(a.dtype).reshape(a.shape)
    np.copyto(out, a)
    return out


def upload_tensor(src: torch.Tensor, index: int, non_blocking: bool = False) -> torch.Tensor:
    """A new contiguous device tensor with the values of the CPU tensor ``src``."""
    arr = upload(_dtypes.tensor_to_numpy(src.detach().resolve_conj().resolve_neg()), index, non_blocking)
    return _storage.new_tensor(src.shape, src.dtype, index, arr)


# ---------------------------------------------------------------- device -> host


def logical_array(t: torch.Tensor, reason: str = "data-dependent"):
    """The JAX array of ``t``'s values in its logical shape (a read of the view)."""
    box = _storage.box_of(t)
    arr = box.arr
    if arr is not None and t.dtype is box.dtype and t.is_contiguous() and arr.shape == t.shape:
        if not (t.is_conj() or t.is_neg()):
            return _storage.array(box, reason)
    out = _executor.run(_executor.SPECS[aten.clone.default], (t, torch.contiguous_format))
    arr = _storage.array(_storage.box_of(out), reason)
    # (a clone in padded rows keeps its storage's shape, which a view's may not be: the
    # (12,) view of a (3, 4) tensor, NOTE [Padded rows] in runtime/_buckets)
    return arr if arr.shape == tuple(t.shape) else arr.reshape(tuple(t.shape))


def to_numpy(arr) -> np.ndarray:
    """A writable numpy array that we own, with the values of a JAX array (one copy)."""
    if _devices.host_copies:  # NOTE [Copies to the host without blocking]: the earlier ones first
        _devices.finish_host_copies()
    if _fused._deferred:  # NOTE [Deferred value checks] (runtime/_fused)
        _fused.check_deferred()
    return _fetch(arr)


def _fetch(arr) -> np.ndarray:
    """(a copy to the host without blocking reads its array alone: the graphs dispatched
    after it may still be running, and their checks wait for the next blocking read)"""
    _stats.counters["host_transfers"] += 1
    fetch = getattr(arr, "_single_device_array_to_np_array_did_copy", None)
    if fetch is not None:
        npy, did_copy = fetch()
        if did_copy and npy.flags.owndata:
            npy.flags.writeable = True
            return npy
        return np.array(npy, copy=True)
    return np.array(arr, copy=True)


def download(t: torch.Tensor) -> torch.Tensor:
    """A new CPU tensor with ``t``'s values; dense layouts (e.g. transposed) keep their
    strides, as ``.cpu()`` does on CUDA."""
    if t.is_conj():  # NOTE [Conjugate and negative views] (runtime/_executor.py)
        return torch.conj_physical(download(t.conj()))
    if t.is_neg():
        return torch.neg(download(t._neg_view()))
    perm = _whole_dense_perm(t)
    box = _storage.box_of(t)
    if perm is not None and box.arr is not None:
        arr = box.arr
        if arr.__class__ is _storage.Padded:
            # NOTE [Buckets]: cut on the host; the storage stays in its bucket for the ops after
            if arr.arr.__class__ is _storage.Pending:
                arr.arr = arr.arr.resolve("host transfer")
            host = to_numpy(arr.arr)[(slice(None),) * arr.dim + (slice(0, arr.length),)]
        else:
            host = to_numpy(_storage.array(box, "host transfer"))
        physical = np.ascontiguousarray(host).reshape([t.shape[d] for d in perm])
        base = _dtypes.numpy_to_tensor(physical)
        if perm == list(range(t.dim())):
            return base.reshape(t.shape)
        return base.reshape(-1).as_strided(t.shape, t.stride())
    return _dtypes.numpy_to_tensor(to_numpy(logical_array(t, "host transfer")))


class _HostCopy:
    """A copy of a jax tensor's values into a CPU tensor, in flight (NOTE [Copies to the
    host without blocking] in device/_state)."""

    __slots__ = ("arr", "dst", "done", "_lock")

    def __init__(self, arr, dst: torch.Tensor):
        arr.copy_to_host_async()
        self.arr, self.dst, self.done = arr, dst, False
        self._lock = threading.Lock()

    def ready(self) -> bool:
        return self.done or self.arr.is_ready()

    def finish(self) -> None:
        with self._lock:
            if not self.done:
                # (the values only, as the call's kernel would have written them: no autograd,
                # no second version bump, whatever inference mode the call was made in)
                self.dst.data.copy_(_dtypes.numpy_to_tensor(_fetch(self.arr)))
                self.done = True


def _deferrable(t: torch.Tensor, dst: torch.Tensor | None = None) -> bool:
    """Whether a copy of ``t`` to the host may wait (else it is made at once, and raises at
    once what PyTorch's copy raises: a shape that does not broadcast, an overlapping
    destination)."""
    if t.is_conj() or t.is_neg():
        return False
    if dst is None:
        return True
    try:
        fits = torch.broadcast_shapes(t.shape, dst.shape) == dst.shape
    except RuntimeError:
        return False
    return fits and torch._debug_has_internal_overlap(dst) == 0


def download_later(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """``dst.copy_(src)`` from jax to the CPU without waiting (NOTE [Copies to the host
    without blocking]): ``dst`` is written once something orders after the copy."""
    copy = _HostCopy(logical_array(src, "host transfer"), dst)
    _devices.defer_host_copy(_storage.box_of(src).index, copy)
    return dst


# ---------------------------------------------------------------- kernels


def _plain(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a plain tensor (the same TensorImpl's data): the kernels of a Python backend
    receive the caller's Python object, and a subclass may refuse what a C++ kernel never
    asks (a lazy module's ``UninitializedParameter`` raises on ``.shape``, so
    ``LazyLinear(3).to("jax")`` failed where ``.to("cuda")`` works)."""
    if type(t) is torch.Tensor:
        return t
    with torch._C.DisableTorchFunctionSubclass():
        return t.as_subclass(torch.Tensor)


def copy_(self: torch.Tensor, src: torch.Tensor, non_blocking: bool = False):
    self, src = _plain(self), _plain(src)
    if self.is_cpu:
        if non_blocking and _deferrable(src, self):
            return download_later(src, self)
        return self.copy_(download(src))
    jax_type = _storage_device_type()
    if self.device.type != jax_type:  # e.g. a cuda tensor written from a jax one
        return self.copy_(to_torch_device(src, self.device))
    index = _storage.box_of(self).index
    if src.is_cpu:
        if _upload_into(self, src, index, non_blocking) or _upload_into_part(self, src):
            return self
        src = upload_tensor(src, index, non_blocking)
    elif src.device.type != jax_type:
        src = from_torch_device(src, index)
    elif _storage.box_of(src).index != index:
        src = move(src, index)
    if _alias_whole(self, src):
        return self
    return _executor.run(_executor.SPECS[aten.copy_.default], (self, src, non_blocking))


def move(t: torch.Tensor, index: int) -> torch.Tensor:
    """A contiguous copy of ``t`` on jax:index."""
    arr = jax.device_put(logical_array(t, "copy between devices"), _devices.device(index))
    return _storage.new_tensor(t.shape, t.dtype, index, arr)


# NOTE [Copies with CUDA]: a program can hold ``cuda`` and ``jax`` tensors in one process.
# Where JAX's device is a GPU (platform "gpu", "cuda" or "rocm") and the torch tensor is on a
# GPU too (``cuda``, which is also ROCm's type), the copy goes device to device through
# DLPack: JAX reads torch's buffer (DLPack's stream argument orders it after torch's work)
# and copies it on the device (an alias would change when torch writes the tensor), and
# torch reads JAX's buffer the same way and copies it, so neither side ever shares the
# other's memory. Otherwise, and when DLPack refuses (another GPU than JAX sees, a dtype
# DLPack lacks), the values go through the host: one download and one upload.


def dlpack_route(torch_device_type: str, jax_platform: str) -> bool:
    """Whether a copy between a torch device and a JAX device goes through DLPack (NOTE
    [Copies with CUDA])."""
    return torch_device_type == "cuda" and jax_platform in ("gpu", "cuda", "rocm")


def from_torch_device(src: torch.Tensor, index: int, dlpack: bool | None = None) -> torch.Tensor:
    """A new contiguous tensor on jax:index with the values of ``src``, a tensor of another
    torch device (NOTE [Copies with CUDA]); ``dlpack`` overrides the route (tests)."""
    dev = _devices.device(index)
    src = src.detach().resolve_conj().resolve_neg()
    if dlpack is None:
        dlpack = dlpack_route(src.device.type, dev.platform)
    if dlpack:
        try:
            borrowed = jax.dlpack.from_dlpack(src.contiguous())
        except (RuntimeError, TypeError, ValueError, BufferError):
            borrowed = None
        if borrowed is not None:
            _stats.counters["device_transfers"] += 1
            arr = jax.device_put(borrowed, dev, may_alias=False)  # our own copy, on our device
            return _storage.new_tensor(src.shape, src.dtype, index, arr)
    return upload_tensor(src.cpu(), index)


def to_torch_device(t: torch.Tensor, device: torch.device, dlpack: bool | None = None) -> torch.Tensor:
    """A new tensor on ``device``, another torch device, with the values of the jax tensor
    ``t`` (NOTE [Copies with CUDA]); ``dlpack`` overrides the route (tests)."""
    if dlpack is None:
        dlpack = dlpack_route(device.type, _devices.device(_storage.box_of(t).index).platform)
    if dlpack:
        try:
            borrowed = torch.from_dlpack(logical_array(t, "copy to another device"))
        except (RuntimeError, TypeError, ValueError, BufferError):
            borrowed = None
        if borrowed is not None:
            _stats.counters["device_transfers"] += 1
            return borrowed.to(device, copy=True)  # never JAX's buffer itself
    return download(t).to(device)


def _upload_into(self, src, index, non_blocking) -> bool:
    """Upload a CPU tensor straight into ``self``'s storage when ``self`` is the whole
    storage with the same dtype and shape: no device-side work at all."""
    if src.dtype != self.dtype or src.shape != self.shape or self.is_conj() or self.is_neg():
        return False
    src = src.resolve_conj().resolve_neg()
    perm = _whole_dense_perm(self)
    if perm is None:
        return False
    physical = _dtypes.tensor_to_numpy(src.detach()).transpose(perm)
    if list(perm) == list(range(len(perm))):
        d = _buckets.upload_dim(tuple(src.shape), src.dtype)
        if d is not None:  # NOTE [Padded rows] (runtime/_buckets): the host pads, nothing compiles
            _storage.box_of(self).arr = _storage.Padded(
                _upload_padded(physical, d, index, non_blocking), tuple(src.shape), d
            )
            _buckets.active = True
            return True
    _storage.box_of(self).arr = upload(physical, index, non_blocking)
    return True


# NOTE [Uploads into part of a storage]: ``buffer[:n].copy_(host[:n], non_blocking=True)``,
# a device buffer's first rows written from the host (vLLM's input buffers, several a
# step; a preallocated batch), went as an upload into a new device tensor and then a
# strict copy op into the view: 240-330 us on the 2-core EPYC, where a computation
# called with the host values as its argument takes 13-25 us (now 168 against 326 us for
# a 64-element prefix, slicing included; 97 against 237 into an existing view). So a contiguous
# CPU tensor copied into a contiguous view of a storage that holds a plain array (strict
# mode, the same dtype and shape) is one computation: its host values (a private copy,
# padded to a power of two, at least 16) and the view's offset and length are its
# arguments, and it writes the first ``length`` of them from the offset on. It compiles
# once per storage shape, dtype and power of two, whatever the offset and the length, so a
# buffer's uploads of changing lengths compile a few computations, not one a length. It
# counts as the copy op did: an op (a cache hit once compiled) and a host transfer. Views
# that are not contiguous, other dtypes, storages never written or in buckets or fused
# graphs, launch blocking and the profiler keep the upload and the copy op.
_parts: dict = {}


class _Part:
    """A compiled write of host values into part of a storage."""

    __slots__ = ("fn", "used", "cost")


def _upload_into_part(self, src) -> bool:
    """Upload a CPU tensor into ``self``, a contiguous part of a storage (NOTE [Uploads into
    part of a storage]); False where the general path must."""
    if config.mode != "strict" or config.launch_blocking or _profiler.recording:
        return False
    if src.dtype != self.dtype or src.shape != self.shape or self.is_conj() or self.is_neg() or src.is_neg():
        return False
    box = _storage.box_of(self)
    arr = box.arr
    n = self.numel()
    if box.dtype != self.dtype or not isinstance(arr, jax.Array) or n == 0 or not self.is_contiguous():
        return False
    host = _dtypes.tensor_to_numpy(src.detach().resolve_conj().contiguous())
    if host.dtype != arr.dtype or arr.is_deleted():
        return False
    width = max(16, 1 << (n - 1).bit_length())
    values = np.empty(width, host.dtype)  # (ours alone: JAX may alias it on the CPU)
    values[:n] = host.reshape(-1)
    index = box.index
    key = (arr.shape, arr.dtype, width, index)
    part = _parts.get(key)
    counters = _stats.counters
    counters["ops"] += 1
    counters["host_transfers"] += 1
    if part is None:
        part = _compile_cache.outside_dynamo(_compile_part, arr, values, index)
        _compile_cache.admit(_parts, key, part, "op")
    else:
        part.used = True
        counters["cache_hits"] += 1
    offsets = np.int64 if arr.size >= 2**31 else np.int32
    out = part.fn(arr, values, offsets(self.storage_offset()), offsets(n))
    _storage.replace(box, out)
    _executor._last[index] = (out,)
    return True


def _compile_part(arr, values, index: int) -> _Part:
    """The computation of :func:`_upload_into_part` for ``arr``'s storage and ``values``'
    width."""
    _stats.counters["compiles"] += 1
    shape, size, width = arr.shape, arr.size, values.shape[0]
    offsets = jnp.int64 if size >= 2**31 else jnp.int32

    def write(old, new, offset, length):
        lanes = jnp.arange(width, dtype=offsets)
        at = jnp.where(lanes < length, offset + lanes, size)  # (past the length: dropped)
        return old.reshape(-1).at[at].set(new, mode="drop").reshape(shape)

    before = _compile_cache.allocated()
    jitted = jax.jit(_compile_cache.fresh(write, "upload_into_part"), out_shardings=_devices.sharding(index))
    scalar = jax.ShapeDtypeStruct((), offsets)
    fn = _executor._compile_op(jitted, (arr, values, scalar, scalar), index)
    del jitted
    part = _Part()
    part.fn = fn
    part.cost = _compile_cache.allocated() - before
    return part


def _upload_padded(a: np.ndarray, d: int, index: int, non_blocking: bool):
    """``a`` uploaded into a bucket along ``d`` (NOTE [Buckets]), filled past its length."""
    shape = list(a.shape)
    shape[d] = _buckets.size(shape[d])
    padded = np.full(shape, _context.pad_fill(a.dtype), a.dtype)
    padded[(slice(None),) * d + (slice(0, a.shape[d]),)] = a
    return upload(padded, index, non_blocking)


def _alias_whole(self, src) -> bool:
    """``self = src`` for whole, same-dtype, same-shape contiguous tensors: share src's
    (immutable) array; no computation."""
    if self.is_conj() or self.is_neg() or src.is_conj() or src.is_neg():
        return False  # NOTE [Conjugate and negative views] (runtime/_executor.py)
    sbox = _storage.box_of(src)
    arr = sbox.arr
    if arr is None or src.dtype is not sbox.dtype or arr.shape != src.shape or not src.is_contiguous():
        return False
    if src.dtype != self.dtype or src.shape != self.shape or not self.is_contiguous():
        return False
    box = _storage.box_of(self)
    if box.dtype != self.dtype or box.numel != self.numel():
        return False
    box.arr = arr
    return True


def _to_copy(self, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    self = _plain(self)
    target = torch.device(device) if device is not None else self.device
    if self.is_cpu:  # the device argument dispatched a CPU -> jax copy here
        src = self if dtype is None or dtype == self.dtype else self.to(dtype)
        index = _devices.index_of(target)
        keep = memory_format in (None, torch.preserve_format) and _storage.dense_perm(src.shape, src.stride())
        out = _storage.new_tensor(src.shape, src.dtype, index, None, src.stride() if keep else None)
        return copy_(out, src, non_blocking)
    if target.type != _storage_device_type():  # the CPU, cuda or another device of this torch
        if target.type == "cpu" and non_blocking and _deferrable(self):
            # (the layout download() gives: a dense one kept, unless contiguous is asked for)
            if memory_format != torch.contiguous_format and _storage.dense_perm(self.shape, self.stride()):
                out = torch.empty_strided(self.shape, self.stride(), dtype=dtype or self.dtype)
            else:
                out = torch.empty(self.shape, dtype=dtype or self.dtype)
            return download_later(self, out)
        out = download(self) if target.type == "cpu" else to_torch_device(self, target)
        if memory_format == torch.contiguous_format:
            out = out.contiguous()
        return out if dtype is None or dtype == out.dtype else out.to(dtype)
    index = _devices.index_of(target)
    if index != _storage.box_of(self).index:
        self = move(self, index)
        if dtype is None or dtype == self.dtype:
            return self
    args = (self, dtype, layout, None, pin_memory, non_blocking, memory_format)
    return _executor.run(_executor.SPECS[aten._to_copy.default], args)


def _storage_device_type() -> str:
    return torch._C._get_privateuse1_backend_name()


def local_scalar_dense(self):
    value = to_numpy(logical_array(self, "host transfer")).reshape(()).item()
    if self.dtype == torch.bool:
        return bool(value)
    if self.dtype.is_complex:
        return complex(value)
    if self.dtype.is_floating_point:
        return float(value)
    return int(value)


def new_storage(args, device: torch.device, **kwargs):
    """``torch.UntypedStorage(n | bytes, device=jax)``: a storage of n zero bytes, or of
    the given byte values (NOTE [Storages without an allocator])."""
    if kwargs or len(args) > 1:
        raise TypeError(f"torch_jax: UntypedStorage(..., device='{device}') takes a size or a sequence of bytes")
    index = _devices.index_of(device)
    if not args:
        data = []
    elif isinstance(args[0], int):
        return _storage.new_tensor([args[0]], torch.uint8, index).untyped_storage()
    else:
        data = list(args[0])
    t = _storage.new_tensor([len(data)], torch.uint8, index)
    copy_(t, torch.tensor(data, dtype=torch.uint8))
    return t.untyped_storage()


def copy_from(src, dst, non_blocking=False):
    return copy_(dst, src, non_blocking)


def copy_from_and_resize(src, dst):
    if dst.shape != src.shape:
        dst.resize_(src.shape)
    return copy_(dst, src)


def kernels():
    return [
        (aten.copy_.default, copy_),
        (aten._copy_from.default, copy_from),
        (aten._copy_from_and_resize.default, copy_from_and_resize),
        (aten._to_copy.default, _to_copy),
        (aten._local_scalar_dense.default, local_scalar_dense),
    ]
