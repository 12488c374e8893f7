"""``torch.jax``: the device module, with the ``torch.cuda``-style API that PyTorch
and libraries call. Signatures and defaults follow ``torch.cuda``: PyTorch's own
helpers call these positionally.

Nothing here imports JAX at import time (NOTE [Cheap autoload]); each function that
needs the devices initializes the backend on first use.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from typing import Any

import torch


def _state():
    from torch_jax.device import _registration

    _registration.initialize()
    from torch_jax.device import _state

    return _state


def _index(device=None) -> int:
    state = _state()
    if device is None:
        return state.current()
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "jax":
            raise ValueError(f"Expected a jax device, but got: {device}")
        return state.current() if device.index is None else device.index
    raise TypeError(f"torch.jax: cannot interpret {device!r} as a jax device")


# ---- availability and devices ----


def is_available() -> bool:
    """True when JAX sees at least one device. Before the device starts, whether JAX is
    installed (it always has its CPU), without starting it, as torch.cuda.is_available()
    leaves CUDA alone: PyTorch asks this early (torch 2.14's ``init_process_group`` does,
    before JAX's distributed runtime may start; NOTE [The jax process group])."""
    if not is_initialized():
        import importlib.util

        return importlib.util.find_spec("jax") is not None
    try:
        return _state().count() > 0
    except Exception:  # noqa: BLE001 (a broken JAX install means "not available")
        return False


def is_initialized() -> bool:
    from torch_jax.device import _registration

    return _registration.is_initialized()


def init() -> None:
    _state()


def __getattr__(name: str):
    # ``torch.utils.checkpoint`` saves and restores a device's RNG state only if its
    # module says ``_initialized`` (a module global in torch.cuda)
    if name == "_initialized":
        return is_initialized()
    if name in ("Stream", "Event"):  # (torch.cuda's names; FSDP2 asks its device module for them)
        from torch_jax.device import _accelerator

        return getattr(_accelerator, name)
    raise AttributeError(f"module 'torch.jax' has no attribute {name!r}")


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return _state().count()


def current_device() -> int:
    return _state().current()


def set_device(device) -> None:
    _state().set_current(_index(device))


class device:
    """Context manager that changes the current jax device."""

    def __init__(self, device):
        self.idx = -1 if device is None else _index(device)
        self.prev_idx = -1

    def __enter__(self):
        if self.idx >= 0:
            self.prev_idx = current_device()
            set_device(self.idx)
        return self

    def __exit__(self, *exc):
        if self.idx >= 0:
            set_device(self.prev_idx)
        return False


class device_of(device):
    """Context manager that makes the device of a tensor the current device."""

    def __init__(self, obj):
        super().__init__(obj.get_device() if obj.device.type == "jax" else None)


def current_stream(device=None) -> torch.Stream:
    """The device's one stream (NOTE [One stream per device] in device/_accelerator)."""
    return torch.Stream(device=torch.device("jax", _index(device)))


default_stream = current_stream


def set_stream(stream) -> None:
    torch.accelerator.set_stream(stream)


def stream(stream):
    """``with torch.jax.stream(s):`` makes ``s`` current (its device), as ``with s:`` does."""
    return stream if stream is not None else contextlib.nullcontext()


def synchronize(device=None) -> None:
    """Wait until every op queued on the device (all devices if None) has finished."""
    state = _state()
    state.synchronize(None if device is None else _index(device))


def get_device_name(device=None) -> str:
    dev = _state().device(_index(device))
    return f"{dev.platform}:{dev.device_kind}"


@dataclasses.dataclass(frozen=True)
class _DeviceProperties:
    name: str
    platform: str
    device_kind: str
    index: int
    total_memory: int
    multi_processor_count: int = 0
    major: int = 0
    minor: int = 0
    is_integrated: bool = False


def get_device_properties(device=None) -> _DeviceProperties:
    idx = _index(device)
    dev = _state().device(idx)
    stats = _memory_stats(idx)
    return _DeviceProperties(
        name=get_device_name(idx),
        platform=dev.platform,
        device_kind=dev.device_kind,
        index=idx,
        total_memory=int(stats.get("bytes_limit", 0)),
        multi_processor_count=int(getattr(dev, "core_count", 0) or 0),
    )


def get_device_capability(device=None) -> tuple[int, int]:
    props = get_device_properties(device)
    return props.major, props.minor


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


# ---- random numbers ----


def manual_seed(seed: int) -> None:
    """Seed the current device's generator."""
    state = _state()
    state.manual_seed(seed, state.current())


def manual_seed_all(seed: int) -> None:
    """Seed every device's generator (``torch.manual_seed`` calls this)."""
    _state().manual_seed(seed)


def seed() -> None:
    state = _state()
    state.random_seed(state.current())


def seed_all() -> None:
    _state().random_seed()


def initial_seed() -> int:
    state = _state()
    return state.initial_seed(state.current())


def get_rng_state(device="jax") -> torch.Tensor:
    """The generator state of a device as a uint8 CPU tensor (seed and offset)."""
    return _state().get_rng_state(_index(device))


def set_rng_state(new_state: torch.Tensor, device="jax") -> None:
    _state().set_rng_state(new_state, _index(device))


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states) -> None:
    for i, s in enumerate(new_states):
        set_rng_state(s, i)


# ---- memory ----


def _memory_stats(idx: int) -> dict[str, Any]:
    stats = _state().device(idx).memory_stats()
    return dict(stats) if stats else {}


def memory_stats(device=None) -> collections.OrderedDict:
    """JAX's memory statistics of the device, under PyTorch's names where they exist
    (empty where the platform reports none, e.g. JAX's CPU client)."""
    raw = _memory_stats(_index(device))
    out = collections.OrderedDict()
    names = {
        "bytes_in_use": "allocated_bytes.all.current",
        "peak_bytes_in_use": "allocated_bytes.all.peak",
        "bytes_reserved": "reserved_bytes.all.current",
        "peak_bytes_reserved": "reserved_bytes.all.peak",
        "num_allocs": "allocation.all.allocated",
    }
    for jax_name, torch_name in names.items():
        if jax_name in raw:
            out[torch_name] = int(raw[jax_name])
    for k, v in raw.items():
        out[f"jax.{k}"] = v
    return out


def memory_allocated(device=None) -> int:
    return int(_memory_stats(_index(device)).get("bytes_in_use", 0))


def max_memory_allocated(device=None) -> int:
    return int(_memory_stats(_index(device)).get("peak_bytes_in_use", 0))


def memory_reserved(device=None) -> int:
    stats = _memory_stats(_index(device))
    return int(stats.get("bytes_reserved", stats.get("bytes_in_use", 0)))


def max_memory_reserved(device=None) -> int:
    stats = _memory_stats(_index(device))
    return int(stats.get("peak_bytes_reserved", stats.get("peak_bytes_in_use", 0)))


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes, where the platform reports a limit; (0, 0) otherwise."""
    stats = _memory_stats(_index(device))
    total = int(stats.get("bytes_limit", 0))
    return max(total - int(stats.get("bytes_in_use", 0)), 0), total


def reset_peak_memory_stats(device=None) -> None:
    """JAX keeps its own peak counters and offers no reset; this is a no-op."""


def empty_cache() -> None:
    """JAX frees device buffers when their arrays die; nothing is cached to release."""
