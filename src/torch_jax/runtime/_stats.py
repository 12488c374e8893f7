"""Counters of what the device did: ops run, computations compiled, cache hits, and
which aten ops ran through the CPU fallback (and how often)."""

from __future__ import annotations

import collections

counters: collections.Counter = collections.Counter()
fallback_ops: collections.Counter = collections.Counter()
compile_reasons: collections.Counter = collections.Counter()  # why torch.compile's graphs compiled


def snapshot() -> dict:
    """A copy of every counter: ``ops``, ``compiles``, ``cache_hits``, ``fallbacks``
    (total calls through the CPU fallback) and ``fallback_ops`` (calls per aten op)."""
    out = {k: counters.get(k, 0) for k in ("ops", "compiles", "cache_hits", "fallbacks", "host_transfers")}
    out.update({k: v for k, v in counters.items() if k not in out})
    out["fallback_ops"] = dict(fallback_ops)
    out["compiled_graph_reasons"] = dict(compile_reasons)
    from torch_jax.runtime import _fused

    out["materializations"] = dict(_fused.materializations)
    from torch_jax.runtime import _recompiles

    out["shape_churn"] = dict(_recompiles.churn)
    return out


def reset() -> None:
    from torch_jax.runtime import _fused

    counters.clear()
    fallback_ops.clear()
    compile_reasons.clear()
    _fused.materializations.clear()
