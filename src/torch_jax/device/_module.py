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
import os
import threading
from typing import Any

import torch


def _state():
    from torch_jax.device import _start

    _start.start()
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
    from torch_jax.device import _start

    return _start.started()


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
    return _DeviceProperties(
        name=get_device_name(idx),
        platform=dev.platform,
        device_kind=dev.device_kind,
        index=idx,
        total_memory=mem_get_info(idx)[1],
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


# NOTE [Seeds before the device starts]: ``torch.manual_seed`` seeds every device's
# generator, and programs call it first of all: before ``init_process_group`` (vLLM's
# workers, scripts started with ranks as arguments), whose group JAX's distributed runtime
# must start from, before the device. As ``torch.cuda`` does (``_lazy_call``), seeding a
# device that has not started is kept, and done as it starts. Only what decides the seeds
# is kept, so a program that seeds often and never uses the device keeps two calls: the
# last seeding of every device, and the last of the current device after it (which, until
# the device starts, is always the same one: choosing another starts it).
_pending: dict = {}  # "all", "current" -> call
_pending_lock = threading.Lock()


def _when_started(which: str, call) -> None:
    from torch_jax.device import _start

    with _pending_lock:
        if not _start.started():
            if which == "all":
                _pending.clear()  # (every device's seed replaces what was kept)
            _pending[which] = call
            return
    call(_state())


def run_pending() -> None:
    """The seeds kept until the device started (NOTE [Seeds before the device starts])."""
    from torch_jax.device import _state as state

    with _pending_lock:
        calls = [_pending[k] for k in ("all", "current") if k in _pending]
        _pending.clear()
    for call in calls:
        call(state)


def manual_seed(seed: int) -> None:
    """Seed the current device's generator."""
    _when_started("current", lambda state: state.manual_seed(seed, state.current()))


def manual_seed_all(seed: int) -> None:
    """Seed every device's generator (``torch.manual_seed`` calls this)."""
    _when_started("all", lambda state: state.manual_seed(seed))


def seed() -> None:
    _when_started("current", lambda state: state.random_seed(state.current()))


def seed_all() -> None:
    _when_started("all", lambda state: state.random_seed())


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
#
# NOTE [Memory statistics]: where the PJRT client reports allocator statistics (GPU, TPU:
# ``bytes_in_use``, ``peak_bytes_in_use``, ``bytes_limit``), the current and peak figures are
# the allocator's, which sees every buffer of the device. Where it reports none (XLA:CPU),
# they are the runtime's own count of the live storages' bytes (NOTE [Memory accounting] in
# tensor/_storage), kept on every platform, which also gives the counts of allocations and
# frees. JAX's allocator cannot reset its peak, so after ``reset_peak_memory_stats`` a
# reported peak is the allocator's only once it rises above the peak seen at the reset;
# until then it is the larger of the current figures seen since. XLA:CPU keeps no cache
# above malloc (NOTE [Host memory of the CPU device]), so what it reserves is what is
# allocated, and its memory is the host's (``mem_get_info``: the host's, or the container's).


_peak_resets: dict[int, tuple[int, int]] = {}  # device -> (allocator's peak at the reset, peak since)


def _memory_stats(idx: int) -> dict[str, Any]:
    stats = _state().device(idx).memory_stats()
    return dict(stats) if stats else {}


def _usage(idx: int):
    from torch_jax.device import _memory

    return _memory.usage(idx)


def _allocated(idx: int, raw: dict) -> tuple[int, int]:
    """(current, peak) bytes allocated on jax:idx, given its PJRT statistics ``raw``
    (NOTE [Memory statistics])."""
    if "bytes_in_use" not in raw:
        u = _usage(idx)
        return u.current, u.peak
    current = int(raw["bytes_in_use"])
    peak = int(raw.get("peak_bytes_in_use", current))
    if idx in _peak_resets:
        peak_then, seen = _peak_resets[idx]
        if peak <= peak_then:
            peak = max(seen, current)
            _peak_resets[idx] = (peak_then, peak)
    return current, peak


def _reserved(idx: int, raw: dict) -> tuple[int, int]:
    if "bytes_reserved" in raw:
        return int(raw["bytes_reserved"]), int(raw.get("peak_bytes_reserved", raw["bytes_reserved"]))
    return _allocated(idx, raw)


def memory_stats(device=None) -> collections.OrderedDict:
    """The device's memory statistics under ``torch.cuda.memory_stats``'s keys (its ``all``
    pool; NOTE [Memory statistics]), then the PJRT client's own as ``jax.*``."""
    idx = _index(device)
    u = _usage(idx)
    raw = _memory_stats(idx)
    current, peak = _allocated(idx, raw)
    reserved, reserved_peak = _reserved(idx, raw)
    out = collections.OrderedDict()
    for kind in ("allocated_bytes", "active_bytes", "requested_bytes"):
        out[f"{kind}.all.current"] = current
        out[f"{kind}.all.peak"] = peak
        out[f"{kind}.all.allocated"] = u.allocated
        out[f"{kind}.all.freed"] = u.freed
    for kind in ("allocation", "active"):
        out[f"{kind}.all.current"] = u.count
        out[f"{kind}.all.peak"] = u.count_peak
        out[f"{kind}.all.allocated"] = u.allocs
        out[f"{kind}.all.freed"] = u.frees
    out["reserved_bytes.all.current"] = reserved
    out["reserved_bytes.all.peak"] = reserved_peak
    out["num_alloc_retries"] = 0
    out["num_ooms"] = 0
    for k, v in raw.items():
        out[f"jax.{k}"] = v
    return out


def memory_allocated(device=None) -> int:
    idx = _index(device)
    return _allocated(idx, _memory_stats(idx))[0]


def max_memory_allocated(device=None) -> int:
    idx = _index(device)
    return _allocated(idx, _memory_stats(idx))[1]


def memory_reserved(device=None) -> int:
    idx = _index(device)
    return _reserved(idx, _memory_stats(idx))[0]


def max_memory_reserved(device=None) -> int:
    idx = _index(device)
    return _reserved(idx, _memory_stats(idx))[1]


def _host_memory() -> tuple[int, int]:
    """(free, total) bytes of the host, or of the container where its cgroup sets a lower limit."""
    page = os.sysconf("SC_PAGE_SIZE")
    total, free = page * os.sysconf("SC_PHYS_PAGES"), page * os.sysconf("SC_AVPHYS_PAGES")
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
    with contextlib.suppress(OSError, ValueError):
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit != "max" and int(limit) < total:
            with open("/sys/fs/cgroup/memory.current") as f:
                used = int(f.read())
            total, free = int(limit), min(free, max(int(limit) - used, 0))
    return free, total


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of the device: its allocator's limit, or, for XLA:CPU, whose
    buffers are host memory, the host's."""
    stats = _memory_stats(_index(device))
    if "bytes_limit" not in stats:
        return _host_memory()
    total = int(stats["bytes_limit"])
    return max(total - int(stats.get("bytes_in_use", 0)), 0), total


def reset_peak_memory_stats(device=None) -> None:
    """The peaks start again from the current figures (NOTE [Memory statistics])."""
    idx = _index(device)
    u = _usage(idx)
    u.peak, u.count_peak = u.current, u.count
    raw = _memory_stats(idx)
    if "bytes_in_use" in raw:
        _peak_resets[idx] = (int(raw.get("peak_bytes_in_use", 0)), int(raw["bytes_in_use"]))


def reset_accumulated_memory_stats(device=None) -> None:
    """The totals of bytes and allocations made and freed start again from 0."""
    u = _usage(_index(device))
    u.allocated = u.freed = u.allocs = u.frees = 0


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """The device's memory statistics as a table, like ``torch.cuda.memory_summary``'s."""
    idx = _index(device)
    stats = memory_stats(idx)
    source = "by its allocator" if "jax.bytes_in_use" in stats else "as the bytes of its live storages"
    rule, thin = "|" + "=" * 77 + "|", "|" + "-" * 77 + "|"
    out = [
        rule,
        f"| {'jax:' + str(idx) + ' (' + _state().device(idx).platform + '), memory counted ' + source:<76}|",
        rule,
        f"| {'Metric':<21}| {'Cur Usage':>11} | {'Peak Usage':>11} | {'Tot Alloc':>11} | {'Tot Freed':>11} |",
        thin,
    ]
    for label, key, fmt in (
        ("Allocated memory", "allocated_bytes", _size),
        ("Active memory", "active_bytes", _size),
        ("Allocations", "allocation", str),
    ):
        cur, peak, tot, freed = (stats[f"{key}.all.{k}"] for k in ("current", "peak", "allocated", "freed"))
        out.append(f"| {label:<21}| {fmt(cur):>11} | {fmt(peak):>11} | {fmt(tot):>11} | {fmt(freed):>11} |")
    cur, peak = stats["reserved_bytes.all.current"], stats["reserved_bytes.all.peak"]
    out.append(f"| {'Reserved memory':<21}| {_size(cur):>11} | {_size(peak):>11} | {'':>11} | {'':>11} |")
    free, total = mem_get_info(idx)
    out.append(f"| {'Free / total memory':<21}| {_size(free):>11} | {_size(total):>11} | {'':>11} | {'':>11} |")
    out.append(rule)
    return "\n".join(out) + "\n"


def empty_cache() -> None:
    """JAX frees device buffers when their arrays die; on XLA:CPU the heap's free pages
    go back to the system (NOTE [Host memory of the CPU device])."""
    if _state().device(0).platform == "cpu":
        from torch_jax.device import _host_memory

        _host_memory.trim()
