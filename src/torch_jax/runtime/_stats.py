"""Counters of what the device did: ops run, computations compiled, cache hits, and
which aten ops ran through the CPU fallback (and how often)."""

from __future__ import annotations

import collections

counters: collections.Counter = collections.Counter()
fallback_ops: collections.Counter = collections.Counter()


def snapshot() -> dict:
    """A copy of every counter: ``ops``, ``compiles``, ``cache_hits``, ``fallbacks``
    (total calls through the CPU fallback) and ``fallback_ops`` (calls per aten op)."""
    out = {k: counters.get(k, 0) for k in ("ops", "compiles", "cache_hits", "fallbacks", "host_transfers")}
    out.update({k: v for k, v in counters.items() if k not in out})
    out["fallback_ops"] = dict(fallback_ops)
    from torch_jax.runtime import _fused

    out["materializations"] = dict(_fused.materializations)
    return out


def reset() -> None:
    from torch_jax.runtime import _fused

    counters.clear()
    fallback_ops.clear()
    _fused.materializations.clear()


def maps_pressure() -> bool:
    """Whether the process holds more than half of the memory mappings Linux allows it
    (``vm.max_map_count``): every compiled executable holds some (NOTE [Bounded compile
    cache] in runtime/_executor), and past the limit LLVM cannot map code and the process
    dies. Both compile caches check it."""
    try:
        with open("/proc/self/maps", "rb") as f:
            used = sum(1 for _ in f)
        with open("/proc/sys/vm/max_map_count") as f:
            limit = int(f.read())
    except OSError:
        return False
    return used > limit // 2
