"""One policy for everything the device compiles: strict ops' entries, fused graphs (and
later ``torch.compile``'s graphs).

NOTE [Bounded compile cache]: every compiled XLA executable holds code memory and memory
mappings (14 mappings and 0.2-2 MB for a small strict op on XLA:CPU, measured; a Linux
process may have only ``vm.max_map_count``, usually 65,530, and past it LLVM cannot map
code and the process dies). A training loop uses a few hundred computations, but a
program whose shapes keep changing (variable-length batches, a growing KV cache) makes
new ones without end. So every cache of compiled code admits its entries here, and the
policy keeps three budgets:

- a count, ``config.cache_size`` entries;
- memory, ``config.compile_cache_mb``: each entry costs what the memory the process
  has allocated grew by while it compiled (glibc's ``mallinfo2``: 3 us in a fresh process,
  0.4-1.1 ms in one whose heap holds many free blocks, as a test run's workers do, against
  the 40-60 ms a compilation takes there; elsewhere the resident memory), an estimate
  that other threads' allocations blur but that sums right over many entries (strict
  ops: 0.22 MB on average, fused graphs of 3 ops 0.26 MB; resident memory grew by 0.28
  and 0.37 MB, measured over 100 and 40 compilations, and by tens of MB at single
  compilations where the heap grew);
- mappings: every 16 admissions the process's mappings are counted against half of
  ``vm.max_map_count``.

Past any of them a sweep runs, a clock: entries not used since the last sweep are
dropped, the others marked unused; if the budgets are still exceeded, the oldest half
goes. A dropped entry compiles again when it comes back, with the same results; the
runtime's stats count evictions (``cache_evictions`` for ops, ``graph_evictions`` for
fused graphs) and recompilations (``recompiles``: a key compiled again after its
eviction).

An entry is any object with a ``used`` attribute that a hit sets and a ``cost`` (bytes);
the cache that holds it is a dict from key to entry, which the sweep deletes from.
"""

from __future__ import annotations

import ctypes
import os

import jax

from torch_jax._config import config
from torch_jax.device import _host_memory
from torch_jax.runtime import _stats

_counters = _stats.counters
_admitted: list = []  # (container, key, entry, kind) in admission order
_bytes = 0
_evicted: set = set()  # hashes of evicted (container, key) pairs, for recompiles
_EVICTED_MAX = 1 << 16
_MAPS_EVERY = 16
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_EVICTIONS = {"op": "cache_evictions", "graph": "graph_evictions", "compiled": "compiled_graph_evictions"}


def outside_dynamo(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with Dynamo's frame hook off. NOTE [Dynamo skips the
    runtime] (in compile/_route): the eager code that a compiled function runs after a
    graph break calls the device's kernels, and JAX's Python under them (tracing a new
    computation, ``device_put``) makes objects of its dataclasses, whose generated methods
    belong to no file that Dynamo's skip list can name: Dynamo would try to compile them,
    and fail inside its own numpy support. Compilations, transfers, data-dependent ops and
    the CPU fallback pass here; outside a compiled function the hook is off and this costs
    one C call."""
    if _hook is None or _hook.get_eval_frame_callback() is None:
        return fn(*args, **kwargs)
    before = _hook.set_eval_frame(None)
    try:
        return fn(*args, **kwargs)
    finally:
        _hook.set_eval_frame(before)


def hook_off(kernel):
    """``kernel``, run with Dynamo's frame hook off (:func:`outside_dynamo`)."""

    def run(*args, **kwargs):
        return outside_dynamo(kernel, *args, **kwargs)

    run.__name__ = getattr(kernel, "__name__", "kernel")
    return run


try:
    from torch._C._dynamo import eval_frame as _hook  # (set_eval_frame: what torch._dynamo.disable uses)

    if not hasattr(_hook, "get_eval_frame_callback") or not hasattr(_hook, "set_eval_frame"):
        _hook = None
except ImportError:
    _hook = None


def fresh(fn, name: str | None = None):
    """A new function that calls ``fn``, for JAX to trace: JAX's tracing and lowering
    caches are keyed (weakly) by the function and hold its jaxpr and lowered module while
    it lives, and a compiled entry keeps its own function (NOTE [Compiled, not jitted] in
    runtime/_executor). ``name`` names it, and so the XLA module (``jit_<name>``) that
    profiler traces show."""
    wrapper = lambda *args: fn(*args)  # noqa: E731
    if name is not None:
        wrapper.__name__ = wrapper.__qualname__ = name
    return wrapper


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                     "keepcost")
    ]  # fmt: skip


_mallinfo2 = getattr(ctypes.CDLL(None), "mallinfo2", None)
if _mallinfo2 is not None:
    _mallinfo2.restype = _MallInfo2


def allocated() -> int:
    """The memory the process has allocated, in bytes: with glibc, what ``malloc`` holds in
    use (its heap and its mmapped blocks); elsewhere the resident memory (0 where
    ``/proc`` is not there either)."""
    if _mallinfo2 is not None:
        info = _mallinfo2()
        return info.uordblks + info.hblkhd
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def maps_pressure() -> bool:
    """Whether the process holds more than half of the memory mappings Linux allows it
    (``vm.max_map_count``)."""
    try:
        with open("/proc/self/maps", "rb") as f:
            used = sum(1 for _ in f)
        with open("/proc/sys/vm/max_map_count") as f:
            limit = int(f.read())
    except OSError:
        return False
    return used > limit // 2


def admit(container: dict, key, entry, kind: str) -> None:
    """Put ``entry`` in ``container[key]``: a computation just compiled (``kind``: "op" or
    "graph"), whose compilation allocated ``entry.cost`` bytes that it still holds."""
    global _bytes
    entry.used = True  # (the call that compiled it used it: a sweep right after keeps it)
    entry.cost = max(entry.cost, 0)
    container[key] = entry
    _admitted.append((container, key, entry, kind))
    _bytes += entry.cost
    if _evicted and hash((id(container), key)) in _evicted:
        _counters["recompiles"] += 1
    if _over_budget(check_maps=len(_admitted) % _MAPS_EVERY == 0):
        sweep()


def charge(entry, cost: int) -> None:
    """An admitted entry compiled later (an op recorded in fused mode, then run strict):
    its cost joins the memory budget, which a sweep then keeps, as at an admission. An
    entry dropped before it compiled (its cost is -1) is not held: nothing is charged."""
    global _bytes
    if entry.cost < 0:
        return
    cost = max(cost, 0)
    entry.cost += cost
    _bytes += cost
    entry.used = True  # (as at an admission: the call that compiled it is using it)
    if _over_budget(check_maps=False):
        sweep()


def _over_budget(check_maps: bool) -> bool:
    return (
        len(_admitted) > config.cache_size
        or _bytes > config.compile_cache_mb * 2**20
        or (check_maps and maps_pressure())
    )


def sweep() -> None:
    """Drop the entries not used since the last sweep; if the cache is still over its
    budgets, the oldest half of the rest."""
    global _bytes
    kept = []
    for item in _admitted:
        container, key, entry, _ = item
        if container.get(key) is not entry:  # (replaced or dropped by its owner)
            _bytes -= entry.cost
            entry.cost = -1
        elif entry.used:
            entry.used = False
            kept.append(item)
        else:
            _drop(item)
    _admitted[:] = kept
    if _over_budget(check_maps=True) or len(kept) > config.cache_size * 3 // 4:
        half = len(kept) // 2
        for item in kept[:half]:
            _drop(item)
        _admitted[:] = kept[half:]
    _give_back()


def _give_back() -> None:
    """Return what the dropped entries held. JAX keeps per-jaxpr analyses (DCE, memory
    kinds, shardings) in caches of its own that outlive a compiled function, and glibc
    keeps freed memory in the heap's holes (NOTE [Host memory of the CPU device] in
    device/_host_memory: no trimming below 2 GB), where a compilation's freed transient
    memory is kept too. (Entries hold no reference cycles, so no garbage collection is
    needed: one takes 0.1-0.2 s in a large process.)"""
    jax.clear_caches()
    _host_memory.trim()


def _drop(item) -> None:
    global _bytes
    container, key, entry, kind = item
    del container[key]
    _bytes -= entry.cost
    entry.cost = -1  # (no longer held here: a later charge adds nothing, see charge)
    _counters[_EVICTIONS[kind]] += 1
    if len(_evicted) >= _EVICTED_MAX:
        _evicted.clear()
    _evicted.add(hash((id(container), key)))


def held_bytes() -> int:
    """The compiled entries' memory, as estimated (for stats and tests)."""
    return _bytes


def entries() -> int:
    return len(_admitted)
