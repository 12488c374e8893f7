"""Host memory of the CPU device: freed buffers stay in the process for reuse.

NOTE [Host memory of the CPU device]: XLA:CPU allocates a computation's outputs and its
temporaries (one block: 231 MB for the GPT-2-style training step's fused graph) with
``malloc``, mostly on its worker threads. glibc serves a block over 64 MB on a thread
other than the main one with a fresh ``mmap`` (a thread's arena cannot hold it), and
any block over its mmap threshold (at most 32 MB) the same way, and unmaps it when it is
freed; so every run of the graph page-faults its whole temporary block in again and the
kernel zeroes it: 59k page faults and ~100 ms of system time per step (measured with
another job on the machine); without them the step ran 10-20% faster. A GPU runtime keeps its device memory in a pool (PyTorch's caching allocator,
XLA's preallocation); the CPU device does the same with glibc's own settings: when the
JAX platform is the CPU, the device's initialization sets one malloc arena, no ``mmap``
for large blocks and no trimming of the heap's top below 2 GB, so a freed block is
reused by the next allocation of its size without faults (0 per step, measured).

The settings should come before JAX starts its CPU client: a thread that has allocated
keeps its own arena for life, and glibc serves a block over 64 MB on such a thread with a
fresh ``mmap`` whatever ``M_MMAP_MAX`` says (a thread's heap cannot grow past 64 MB). When
a program starts JAX itself before its first use of the device (``jax.devices()``, a
``jax.numpy`` op), XLA's worker threads already have their arenas. The settings are applied
then too, since they still serve the main thread (where XLA runs cheap computations
inline): a 96 MB ``torch.full`` made 18 times faulted 0 pages in 14 of them, against
24.6k every time without the settings. But the GPT-2 step's temporary block, allocated on
a worker thread, faulted its 59k pages every step (measured). ``TORCH_JAX_DEBUG=1`` says
when this happens; using the device (or calling ``torch_jax.initialize()``) before
starting JAX avoids it.

This is process-wide, as ``MALLOC_ARENA_MAX`` and friends would be: PyTorch's own CPU
tensors are served the same way (its eager steps fault less too), and the process's
resident memory stays at its high-water mark instead of shrinking after a peak.
``TORCH_JAX_HOST_MEMORY=system`` leaves glibc's settings as they are. Other C
libraries (musl, macOS) are left alone.
"""

from __future__ import annotations

import ctypes
import os
import sys

# mallopt's parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
_TRIM_ABOVE = 2**31 - 1  # (mallopt takes an int)

applied = False  # whether this process runs with the settings


def platform() -> str:
    """The platform JAX will choose, told before JAX starts (its thread pools must not
    have allocated yet): ``cpu`` when ``JAX_PLATFORMS`` names only the CPU, or names
    nothing and no accelerator plugin (``jax_plugins``, as an entry point or a package;
    libtpu) is installed; otherwise ``other``."""
    names = [p.strip() for p in os.environ.get("JAX_PLATFORMS", "").split(",") if p.strip()]
    if names:
        return "cpu" if names == ["cpu"] else "other"
    import importlib.metadata
    import importlib.util

    plugins = importlib.metadata.entry_points(group="jax_plugins")
    if plugins or any(importlib.util.find_spec(m) is not None for m in ("libtpu", "jax_plugins")):
        return "other"
    return "cpu"


def jax_started() -> bool:
    """Whether JAX's backends (and so XLA's threads) exist already."""
    bridge = sys.modules.get("jax._src.xla_bridge")
    return bridge is not None and bridge.backends_are_initialized()


def keep_freed_blocks(platform: str) -> bool:
    """Apply the settings (once) if the platform is the CPU and the C library is glibc;
    returns whether they are in effect."""
    global applied
    if applied or platform != "cpu" or os.environ.get("TORCH_JAX_HOST_MEMORY", "pool") == "system":
        return applied
    libc = ctypes.CDLL(None)  # (the process's symbols, as tensor/_storage loads them)
    if not hasattr(libc, "gnu_get_libc_version"):
        return False
    mallopt = libc.mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    applied = all(
        mallopt(param, value) == 1
        for param, value in ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _TRIM_ABOVE))
    )
    if applied and jax_started():
        from torch_jax._config import config

        if config.debug >= 1:
            print(
                "[torch_jax] JAX started before the jax device: large buffers that XLA's worker "
                "threads allocate are not kept for reuse (NOTE [Host memory of the CPU device] in "
                "torch_jax/device/_host_memory)"
            )
    return applied


def trim() -> None:
    """Hand the heap's free memory back to the system (glibc's ``malloc_trim``, which
    also releases free pages inside the heap), at the rare moments the compile cache
    drops entries (NOTE [Bounded compile cache])."""
    malloc_trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if malloc_trim is not None:
        malloc_trim(0)
