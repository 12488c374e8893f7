"""Device-agnostic PyTorch APIs on the ``jax`` device: ``torch.accelerator``,
``torch.Stream``/``torch.Event``, pinned memory and ``torch.Generator(device="jax")``.

NOTE [Accelerator APIs from Python]: a Python PrivateUse1 backend implements only the
hooks' ``is_available``/``has_primary_context``/``is_built`` and the guard's ``type_``
(``torch._C._acc``). Every other C++ entry point of the device is missing: the device
index (always 0, setting it is ignored), device synchronization, the caching
allocator's statistics (an internal assert), event synchronization, the pinned host
allocator and device generators. ``install()`` closes these gaps at the Python level,
for the jax device only; every other device keeps PyTorch's behaviour:

- ``torch.accelerator`` functions are wrapped (``functools.wraps``) to run the
  ``torch.jax`` function of the same meaning when the accelerator is jax.
- ``torch.Stream``/``torch.Event`` become subclasses of PyTorch's C types (see
  NOTE [One stream per device]); ``isinstance``/``issubclass`` answer for the C types,
  so streams and events made by PyTorch itself still count.
- ``Tensor.pin_memory``/``Tensor.is_pinned``: NOTE [Pinned memory for jax].
- ``torch.Generator(device="jax")``: NOTE [jax generators].

Nothing here imports JAX (NOTE [Cheap autoload]); the device initializes on first use.
"""

from __future__ import annotations

import functools
import os
import threading
import time
import warnings
import weakref

import torch
from torch.accelerator._utils import _get_device_index

from torch_jax import _compat
from torch_jax.device import _module

NAME = "jax"
_MASK64 = (1 << 64) - 1
_installed = False


def _on_jax() -> bool:
    acc = torch._C._accelerator_getAccelerator()
    return acc is not None and acc.type == NAME


def _is_jax_device(device) -> bool:
    if device is None:
        return _on_jax()
    try:
        return torch.device(device).type == NAME
    except (RuntimeError, TypeError):
        return False


_supported_dtypes = None  # () -> the dtypes of jax tensors (the tensor layer's, handed in by install)


def install(supported_dtypes) -> None:
    """Install everything this module describes (once; cheap: imports nothing);
    ``supported_dtypes()``: the dtypes a jax tensor may have."""
    global _installed, _supported_dtypes
    if _installed:
        return
    _supported_dtypes = supported_dtypes
    _install_accelerator()
    torch.Stream = Stream
    torch.Event = Event
    _install_pinning()
    _install_generators()
    _installed = True


# ---- torch.accelerator ----


def _no_host_cache() -> None:
    """There is no pinned host cache to empty (NOTE [Pinned memory for jax])."""


def _capability(index: int) -> dict:
    return {"supported_dtypes": _supported_dtypes()}


# each device's one stream, made once: Dynamo asks for the current stream at every call of
# a compiled function on jax (1.6 of 3.9 us went to making it anew)
_streams: dict = {}

# torch.accelerator name -> what it does on jax, given the device index
_BY_INDEX = {
    "synchronize": _module.synchronize,
    "current_stream": lambda index: _streams.get(index) or _streams.setdefault(index, Stream._of(index)),
    "get_device_capability": _capability,
    "memory_stats": _module.memory_stats,
    "memory_allocated": _module.memory_allocated,
    "max_memory_allocated": _module.max_memory_allocated,
    "memory_reserved": _module.memory_reserved,
    "max_memory_reserved": _module.max_memory_reserved,
    "reset_peak_memory_stats": _module.reset_peak_memory_stats,
    "reset_accumulated_memory_stats": _module.reset_accumulated_memory_stats,
    "get_memory_info": _module.mem_get_info,
}
# the same without arguments (empty_host_cache crashes the process otherwise)
_NO_ARGS = {
    "current_device_index": _module.current_device,
    "empty_cache": _module.empty_cache,
    "empty_host_cache": _no_host_cache,
}


def _by_index(original, on_jax):
    @functools.wraps(original)
    def routed(device=None, /):
        if not _on_jax():
            return original(device)
        index = _get_device_index(device, optional=True)
        _module._state().device(index)  # an unknown device raises
        return on_jax(index)

    return routed


def _no_args(original, on_jax):
    @functools.wraps(original)
    def routed():
        if not _on_jax():
            return original()
        return on_jax()

    return routed


def _set_device_index(original):
    @functools.wraps(original)
    def set_device_index(device, /) -> None:
        if not _on_jax():
            return original(device)
        index = _get_device_index(device, optional=False)
        if index >= 0:  # PyTorch: a no-op for a negative index
            _module.set_device(index)

    return set_device_index


def _set_stream(original):
    @functools.wraps(original)
    def set_stream(stream) -> None:
        if stream.device.type != NAME:
            return original(stream)
        _module.set_device(stream.device_index)  # the device's one stream is always current

    return set_stream


def _deprecated_alias(original, replacement, message: str):
    @functools.wraps(original)
    def alias(*args):
        warnings.warn(message, FutureWarning, stacklevel=2)
        return replacement(*args)

    return alias


def _install_accelerator() -> None:
    acc, mem = torch.accelerator, torch.accelerator.memory
    # (NOTE [torch.accelerator across versions] in torch_jax/_compat)
    routed = {name: _by_index(getattr(acc, name), fn) for name, fn in _BY_INDEX.items() if _compat.in_accelerator(name)}
    routed.update(
        {name: _no_args(getattr(acc, name), fn) for name, fn in _NO_ARGS.items() if _compat.in_accelerator(name)}
    )
    routed["set_device_index"] = _set_device_index(acc.set_device_index)
    routed["set_stream"] = _set_stream(acc.set_stream)
    # the deprecated aliases hold the original functions: alias the routed ones instead
    routed["current_device_idx"] = _deprecated_alias(
        acc.current_device_idx, routed["current_device_index"], "Use `current_device_index` instead."
    )
    routed["set_device_idx"] = _deprecated_alias(
        acc.set_device_idx, routed["set_device_index"], "Use `set_device_index` instead."
    )
    for name, fn in routed.items():
        for module in (acc, mem):
            if getattr(module, name, None) is fn.__wrapped__:
                setattr(module, name, fn)
    _patch_device_index(acc.device_index)


def _patch_device_index(cls) -> None:
    enter, exit_ = cls.__enter__, cls.__exit__

    @functools.wraps(enter)
    def __enter__(self):
        if self.idx is None or not _on_jax():
            return enter(self)
        self.prev_idx = _module.current_device()
        if self.idx >= 0:
            _module.set_device(self.idx)

    @functools.wraps(exit_)
    def __exit__(self, *exc_info):
        if self.idx is None or not _on_jax():
            return exit_(self, *exc_info)
        if self.prev_idx >= 0:
            _module.set_device(self.prev_idx)

    cls.__enter__, cls.__exit__ = __enter__, __exit__


# ---- torch.Stream and torch.Event ----

# NOTE [One stream per device]: JAX runs the computations of a device in the order
# they were dispatched, asynchronously, and a transfer between devices waits for the
# computation that produced its data. So a jax device has exactly one stream (id 0):
# ``torch.Stream(device="jax:1")`` is that stream, ``wait_event``/``wait_stream`` and
# ``Event.wait`` have nothing to order and return at once, and ``with stream:`` /
# ``set_stream`` only make the stream's device current. An event records the results
# of the last computation dispatched to its device (keeping them alive until it is
# synchronized or finds them ready); ``synchronize`` blocks until they are ready, which
# means every earlier computation of the device has finished. A timing event
# (``enable_timing=True``) synchronizes the device when it is recorded and reads the
# host clock, so ``elapsed_time`` is the wall time of the device work between the two
# records, and recording it blocks the host (unlike CUDA).

_CStream = torch.Stream
_CEvent = torch.Event


class _AnswersForPyTorchType(type):
    """``isinstance(x, torch.Stream)`` stays true for every stream PyTorch makes (the
    replacement classes answer for PyTorch's; their subclasses answer for themselves)."""

    def __instancecheck__(cls, obj) -> bool:
        if "_pytorch_type" not in cls.__dict__:
            return super().__instancecheck__(obj)
        return isinstance(obj, cls._pytorch_type)

    def __subclasscheck__(cls, sub) -> bool:
        if "_pytorch_type" not in cls.__dict__:
            return super().__subclasscheck__(sub)
        return issubclass(sub, cls._pytorch_type)


def _pending(index: int):
    """The results of the last computation dispatched to jax device ``index``, or None
    (fused eager first dispatches the ops it has recorded)."""
    state = _module._state()
    for dispatch in state.before_event:
        dispatch()
    return state.last.get(index)


def _ready(results) -> bool:
    import jax

    return all(a.is_ready() for a in jax.tree_util.tree_leaves(results))


def _device_index(device) -> int:
    return _module._index(device)


def _explicit_index(device) -> int | None:
    if isinstance(device, int):
        return device
    return None if device is None else torch.device(device).index


class Stream(_CStream, metaclass=_AnswersForPyTorchType):
    __doc__ = _CStream.__doc__
    __module__ = "torch"
    _pytorch_type = _CStream

    def __new__(cls, *args, **kwargs):
        stream = _CStream(*args, **kwargs)
        if stream.device.type != NAME:  # PyTorch's own stream (a subclass keeps its class)
            return stream if cls is Stream else super().__new__(cls, *args, **kwargs)
        index = kwargs.get("device_index")
        if index is None:  # PyTorch's guard reports device 0 whatever the device was
            index = _device_index(args[0] if args else kwargs.get("device"))
        _module._state().device(index)  # an unknown device raises
        return super().__new__(cls, stream_id=stream.stream_id, device_index=index, device_type=stream.device_type)

    @classmethod
    def _of(cls, index: int) -> Stream:
        stream = _CStream(device=NAME)
        return super().__new__(cls, stream_id=stream.stream_id, device_index=index, device_type=stream.device_type)

    def query(self) -> bool:
        if self.device.type != NAME:
            return super().query()
        state = _module._state()
        results = _pending(self.device_index)
        copies = state.pending_host_copies(self.device_index)
        if results is not None and not _ready(results) or not all(copy.ready() for copy in copies):
            return False
        if copies:  # (done, as the query answers: written)
            state.finish_host_copies(copies=copies)
        return True

    def synchronize(self) -> None:
        if self.device.type != NAME:
            return super().synchronize()
        _module.synchronize(self.device_index)

    def is_capturing(self) -> bool:
        """A jax stream never captures a graph (torch 2.11/2.12 raise "Backend doesn't
        support stream capture query" for a Python backend; 2.13 answers False)."""
        if self.device.type != NAME:
            return super().is_capturing()
        return False

    def wait_event(self, event) -> None:
        """Nothing to order on the jax device (NOTE [One stream per device])."""
        if self.device.type != NAME:
            return super().wait_event(event)

    def wait_stream(self, stream) -> None:
        """Nothing to order on the jax device (NOTE [One stream per device])."""
        if self.device.type != NAME:
            return super().wait_stream(stream)

    def record_event(self, event=None):
        if self.device.type != NAME:
            return super().record_event(event)
        event = Event(device=self.device) if event is None else event
        event.record(self)
        return event

    def __enter__(self):
        if self.device.type != NAME:
            return super().__enter__()
        self.__dict__.setdefault("_previous", []).append(_module.current_device())
        _module.set_device(self.device_index)
        return self

    def __exit__(self, *exc_info):
        if self.device.type != NAME:
            return super().__exit__(*exc_info)
        _module.set_device(self._previous.pop())


class Event(_CEvent, metaclass=_AnswersForPyTorchType):
    __doc__ = _CEvent.__doc__
    __module__ = "torch"
    _pytorch_type = _CEvent

    def __new__(cls, device=None, *, enable_timing=False, blocking=False, interprocess=False):
        event = _CEvent(device, enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)
        jax = event.device.type == NAME
        if not jax and cls is Event:  # PyTorch's own event (a subclass keeps its class)
            return event
        if jax and interprocess:
            raise RuntimeError("torch_jax: interprocess events are not supported on the jax device (JAX has no IPC)")
        self = super().__new__(cls, device, enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)
        self._jax = jax
        self._index = _explicit_index(device)  # None until recorded, unless the device names one
        self._timing = enable_timing
        self._recorded = False
        self._results = None  # what synchronize() waits for
        self._copies = ()  # and the copies to the host it writes (NOTE [Copies to the host without blocking])
        self._time = None  # host clock at record (timing events)
        return self

    @property
    def device(self) -> torch.device:
        if not self._jax:
            return _CEvent.device.__get__(self)
        return torch.device(NAME, self._index)

    def record(self, stream=None) -> None:
        if not self._jax:
            return super().record(stream)
        if stream is not None and stream.device.type != NAME:
            raise RuntimeError(
                f"Event device type {NAME} does not match recording stream's device type {stream.device.type}."
            )
        index = _module.current_device() if stream is None else stream.device_index
        if self._index is not None and self._index != index:
            raise RuntimeError(f"Event device {self.device} does not match recording stream's device {NAME}:{index}.")
        self._index = index
        if self._timing:
            _module.synchronize(index)
            self._time = time.perf_counter()
        else:
            self._results = _pending(index)
            self._copies = _module._state().pending_host_copies(index)
        self._recorded = True

    def query(self) -> bool:
        if not self._jax:
            return super().query()
        if self._results is not None and _ready(self._results):
            self._results = None
        if self._results is None and self._copies:
            if not all(copy.ready() for copy in self._copies):
                return False
            self._finish_copies()
        return self._results is None

    def synchronize(self) -> None:
        if not self._jax:
            return super().synchronize()
        if self._results is not None:
            import jax

            jax.block_until_ready(self._results)
            self._results = None
        if self._copies:
            self._finish_copies()

    def _finish_copies(self) -> None:
        _module._state().finish_host_copies(copies=self._copies)
        self._copies = ()

    def wait(self, stream=None) -> None:
        """Nothing to order on the jax device (NOTE [One stream per device])."""
        if not self._jax:
            return super().wait(stream)

    def elapsed_time(self, end_event) -> float:
        if not self._jax:
            return super().elapsed_time(end_event)
        if not (self._timing and getattr(end_event, "_timing", False)):
            raise ValueError("Both events must be created with argument 'enable_timing=True'.")
        if not (self._recorded and end_event._recorded):
            raise ValueError("Both events must be recorded before calculating elapsed time.")
        return (end_event._time - self._time) * 1000.0

    def ipc_handle(self):
        if not self._jax:
            return super().ipc_handle()
        raise RuntimeError("torch_jax: events of the jax device have no IPC handle (JAX has no IPC)")

    def __repr__(self) -> str:
        if not self._jax:
            return super().__repr__()
        index = -1 if self._index is None else self._index
        return f"torch.Event device_type={NAME}, device_index={index}, event_flag={int(self._timing)}, event_id={self.event_id}"


# ---- pinned memory ----

# NOTE [Pinned memory for jax]: page-locked host memory lets CUDA copy to the device
# asynchronously; JAX's transfers (PJRT) take any host buffer and copy it themselves,
# so pinning means nothing for the jax device and a Python backend cannot register a
# pinned allocator anyway. ``Tensor.pin_memory()`` for the jax device (the current
# accelerator, or device="jax") therefore returns what CUDA returns, an ordinary CPU
# copy with the same sizes and strides (the tensor itself when it is already pinned),
# and remembers its storage: ``is_pinned()`` is true for that copy and its views, false
# for every other tensor, as on CUDA. ``DataLoader(pin_memory=True)`` pins through
# ``Tensor.pin_memory``, so it works unchanged. Factories with ``pin_memory=True``
# (``torch.empty(..., pin_memory=True)``) still raise PyTorch's error: they are C
# functions, and replacing ``torch.empty`` and its 38 siblings by Python wrappers would
# break TorchScript (it compiles the wrapper) for every program that loads torch_jax.

_pinned: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # id(storage) -> storage


def _is_marked(t: torch.Tensor) -> bool:
    try:
        storage = t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # tensors without storage are never pinned
        return False
    return _pinned.get(id(storage)) is storage


def _install_pinning() -> None:
    pin, is_pinned = torch.Tensor.pin_memory, torch.Tensor.is_pinned

    @functools.wraps(pin)
    def pin_memory(self, device=None):
        if not (self.is_cpu and _is_jax_device(device)):
            return pin(self) if device is None else pin(self, device)
        if self.layout != torch.strided:
            raise NotImplementedError(f"torch_jax: pin_memory() of a {self.layout} tensor is not supported for jax")
        if _is_marked(self):
            return self
        out = torch.empty_strided(self.size(), self.stride(), dtype=self.dtype)
        out.copy_(self)
        storage = out.untyped_storage()
        _pinned[id(storage)] = storage
        return out

    @functools.wraps(is_pinned)
    def is_pinned_(self, device=None):
        if self.is_cpu and _is_jax_device(device) and _is_marked(self):
            return True
        return is_pinned(self) if device is None else is_pinned(self, device)

    torch.Tensor.pin_memory = pin_memory
    torch.Tensor.is_pinned = is_pinned_


# ---- torch.Generator(device="jax") ----

# NOTE [jax generators]: PyTorch builds device generators in C++ (getNewGenerator),
# which a Python backend cannot provide. ``torch.Generator`` stays PyTorch's class, but
# its metaclass (a Python class where torch has one, NOTE [torch.Generator's metaclass])
# now makes ``torch.Generator(device="jax")`` a
# ``_JaxGenerator``: a subclass whose C++ half is an unused CPU generator (the handle
# PyTorch passes to kernels) and whose Python half is a (seed, offset) pair like the
# device RNG (NOTE [Device RNG]), so a generator and the device seeded alike draw the
# same numbers. Kernels receive a new Python wrapper of the C++ handle, not this object,
# so the executor finds it by ``_cdata`` (``generator_key``); drawing from it advances
# only its offset. A jax generator handed to a CPU op draws from its unused CPU half
# instead of raising as CUDA does (that check lives in PyTorch's C++ CPU kernels).

_CGenerator = torch._C.Generator
_generators: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # _cdata -> generator
_generator_lock = threading.Lock()


class _JaxGenerator(_CGenerator):
    __doc__ = _CGenerator.__doc__

    def __new__(cls, index: int):
        return super().__new__(cls)  # a CPU generator: PyTorch's handle for this one

    def __init__(self, index: int):
        state = _module._state()
        state.device(index)  # an unknown device raises
        self._index = index
        self._seed = state.DEFAULT_SEED
        self._offset = 0
        _generators[self._cdata] = self

    @property
    def device(self) -> torch.device:
        return torch.device(NAME, self._index)

    def manual_seed(self, seed) -> _JaxGenerator:
        with _generator_lock:
            self._seed, self._offset = int(seed) & _MASK64, 0
        return self

    def seed(self) -> int:
        seed = int.from_bytes(os.urandom(8), "little") >> 1  # non-negative int64: a seed anywhere
        self.manual_seed(seed)
        return seed

    def initial_seed(self) -> int:
        return self._seed

    def get_offset(self) -> int:
        return self._offset

    def set_offset(self, offset: int) -> _JaxGenerator:
        with _generator_lock:
            self._offset = int(offset) & _MASK64
        return self

    def get_state(self) -> torch.Tensor:
        """The state as a 16-byte uint8 CPU tensor (seed and offset), like ``torch.jax.get_rng_state``."""
        raw = self._seed.to_bytes(8, "little") + self._offset.to_bytes(8, "little")
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8)

    def set_state(self, new_state: torch.Tensor) -> _JaxGenerator:
        raw = new_state.detach().cpu().contiguous()
        if raw.dtype != torch.uint8 or raw.numel() != 16:
            raise RuntimeError(
                f"torch_jax: Generator.set_state expects the 16-byte uint8 tensor that get_state returns, "
                f"got {raw.dtype} with {raw.numel()} elements"
            )
        data = bytes(raw.tolist())
        with _generator_lock:
            self._seed, self._offset = int.from_bytes(data[:8], "little"), int.from_bytes(data[8:], "little")
        return self

    def clone_state(self) -> _JaxGenerator:
        return _JaxGenerator(self._index).set_state(self.get_state())

    def graphsafe_get_state(self) -> _JaxGenerator:
        return self.clone_state()

    def graphsafe_set_state(self, state) -> _JaxGenerator:
        return self.set_state(state.get_state())

    def __reduce__(self):
        return _rebuild_generator, (str(self.device), self.get_state())

    def _next_words(self):
        state = _module._state()
        with _generator_lock:
            seed, offset = self._seed, self._offset
            self._offset = (offset + state.OFFSET_STEP) & _MASK64  # NOTE [Device RNG]
        return state.key_words(seed, offset)


def _rebuild_generator(device: str, state: torch.Tensor) -> _JaxGenerator:
    return torch.Generator(device=device).set_state(state)


def generator_key(generator, index: int):
    """The 4 words (seed, offset) of the next random op drawn from a ``generator=``
    argument (NOTE [jax generators]); PyTorch's error for a generator of another device."""
    owner = _generators.get(generator._cdata)
    if owner is None:
        raise RuntimeError(f"Expected a '{NAME}' device type for generator but found '{generator.device.type}'")
    return owner._next_words()


def _jax_generator(args, kwargs) -> _JaxGenerator | None:
    """``torch.Generator(*args, **kwargs)`` when it asks for a jax generator, else None."""
    if len(args) + len(kwargs) == 1:
        device = args[0] if args else kwargs.get("device")
        if device is not None and _is_jax_device(device):
            return _JaxGenerator(_device_index(device))
    return None


class _GeneratorType(_AnswersForPyTorchType, type(_CGenerator)):  # (type(_CGenerator) is type before 2.13)
    def __call__(cls, *args, **kwargs):
        if cls is not Generator:  # a user's subclass
            return super().__call__(*args, **kwargs)
        made = _jax_generator(args, kwargs)
        return _CGenerator(*args, **kwargs) if made is None else made


# ``torch.Generator`` where PyTorch's class has no Python metaclass to hook (NOTE
# [torch.Generator's metaclass]): it makes PyTorch's generators, and answers
# ``isinstance``/``issubclass`` for PyTorch's class.
class Generator(_CGenerator, metaclass=_GeneratorType):
    __doc__ = _CGenerator.__doc__
    __module__ = "torch"
    _pytorch_type = _CGenerator


def _install_generators() -> None:
    if not _compat.generator_metaclass_hookable():
        torch.Generator = Generator
        return
    meta = type(_CGenerator)
    construct = meta.__call__

    def __call__(cls, *args, **kwargs):
        made = _jax_generator(args, kwargs) if cls is _CGenerator else None
        return construct(cls, *args, **kwargs) if made is None else made

    meta.__call__ = __call__
