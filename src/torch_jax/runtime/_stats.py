"""Counters of what the device did: ops run, computations compiled, cache hits, and
which aten ops ran through the CPU fallback (and how often)."""

from __future__ import annotations

import collections

counters: collections.Counter = collections.Counter()
fallback_ops: collections.Counter = collections.Counter()
compile_reasons: collections.Counter = collections.Counter()  # why torch.compile's graphs compiled
# (placement, aten op) -> calls, while config.census is on (installed when the device starts)
census: collections.Counter | None = None


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
    if census is not None:
        out["op_census"] = {f"{placement} {op}": n for (placement, op), n in sorted(census.items())}
    return out


def counted(kernel, op, placement: str):
    """``kernel``, counting its calls in :data:`census` (``config.census``)."""
    key = (placement, op_name(op))

    def run(*args, **kwargs):
        census[key] += 1
        return kernel(*args, **kwargs)

    run.__name__ = getattr(kernel, "__name__", "kernel")
    return run


def op_name(op) -> str:
    """``aten::add.Tensor``: an op overload's name as PyTorch prints it."""
    name = op._schema.name
    return f"{name}.{op._overloadname}" if op._overloadname != "default" else name


def reset() -> None:
    from torch_jax.runtime import _fused

    counters.clear()
    fallback_ops.clear()
    compile_reasons.clear()
    if census is not None:
        census.clear()
    _fused.materializations.clear()
