"""The cost of one strict op, kept near JAX's own (benchmarks/dispatch.py measures it in
full), and the fast path of a cache hit (NOTE [The fast path of a cache hit] in
runtime/_executor): the same results and cache entries as the general path, which still
takes every call the fast path declines."""

from __future__ import annotations

import gc
import time

import jax
import jax.numpy as jnp
import pytest
import torch

import torch_jax
from torch_jax.runtime import _buckets, _executor

# Strict `add` of 16 floats against jax.jit's call of x + y, in one process: 2.8x on
# 2026-12-06 (11.6 against 4.2 us, a 2-core Xeon), 3.2x before the fast path. A ratio,
# never a time: these machines vary several times from hour to hour, a ratio far less,
# but it differs between the kinds of machine CI runs on: a 2-core AMD EPYC VM (its
# Python-side work several times slower, jax.jit's C++ call 1.8x) measured 4.5-5.7x alone
# and 4.9x beside the suite's other worker (2026-12-07), where a limit of 4x failed. The
# limit takes the slowest kind seen, with room: a per-op cost grown by half crosses it
# there, one grown 2.5x on the Xeon (a coarse guard; benchmarks/dispatch has the detail).
ADD_LIMIT = 7.0


def _per_call(fn, args, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        out = fn(*args)
    jax.block_until_ready(out) if isinstance(out, jax.Array) else None
    return (time.perf_counter() - start) / calls


def _best_times(pairs, rounds: int = 30, calls: int = 100) -> dict[str, float]:
    """The best round of each function, the rounds interleaved, the collector off (as timeit).

    CI runs this beside another pytest worker on 2 cores: a round longer than a scheduler
    slice is often shared with the other worker, so rounds are short and many (measured with
    two busy XLA processes beside it: 400-call rounds gave 1.9-3.8x, 100-call rounds 2.8-3.1x)."""
    best = {name: float("inf") for name, _, _ in pairs}
    gc.collect()
    gc.disable()
    try:
        for round_ in range(rounds + 1):  # (round 0 warms up)
            for name, fn, args in pairs:
                t = _per_call(fn, args, calls)
                if round_:
                    best[name] = min(best[name], t)
    finally:
        gc.enable()
    return best


def test_strict_add_costs_at_most_a_fixed_multiple_of_jax_jit(monkeypatch):
    monkeypatch.setattr(torch_jax.config, "mode", "strict")
    # (as a fresh process: once an earlier test in this one put an upload into a bucket,
    # every op checks its operands for padded rows, NOTE [Padded rows]; measured after
    # tests/test_buckets.py, 3.6x against 2.8x)
    monkeypatch.setattr(_buckets, "active", False)
    a, b = torch.randn(16, device="jax"), torch.randn(16, device="jax")
    x, y = jnp.asarray(a.cpu().numpy()), jnp.asarray(b.cpu().numpy())
    jitted = jax.jit(lambda p, q: p + q)
    pairs = (("strict", torch.add, (a, b)), ("jax.jit", jitted, (x, y)))
    # (a measurement over the limit is taken again, twice at most: a slower path fails all
    # three; a burst of the other worker's compiles, one)
    for _ in range(3):
        best = _best_times(pairs)
        ratio = best["strict"] / best["jax.jit"]
        if ratio <= ADD_LIMIT:
            break
    assert ratio <= ADD_LIMIT, (
        f"strict add: {best['strict'] * 1e6:.1f} us, {ratio:.2f}x jax.jit's {best['jax.jit'] * 1e6:.1f} us "
        f"(limit {ADD_LIMIT}x): python -m benchmarks.dispatch shows where an op's time goes"
    )


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_fast_path_hits_share_the_general_paths_entries(monkeypatch, mode):
    monkeypatch.setattr(torch_jax.config, "mode", mode)
    # (once an upload went into a bucket, ops over padded rows take the general path, which
    # plans them: NOTE [Padded rows]; an earlier test in this process may have made one)
    monkeypatch.setattr(_buckets, "active", False)
    a, b = torch.randn(4, 3, device="jax"), torch.randn(4, 3, device="jax")
    ref = a.cpu() * b.cpu() + 2.5
    first = a * b + 2.5  # (compiles: the general path)
    a * b + torch.tensor(2.5)  # (a CPU scalar tensor: an entry of its own)
    described = []
    general = _executor._describe
    monkeypatch.setattr(_executor, "_describe", lambda *args: described.append(1) or general(*args))
    torch_jax.reset_stats()
    for scalar in (2.5, 3.5, torch.tensor(2.5), torch.tensor(-1.0)):  # Python numbers, wrapped CPU scalars
        out = a * b + scalar
    torch.jax.synchronize()
    s = torch_jax.stats()
    assert s["compiles"] == 0 and s["cache_hits"] == s["ops"] == 8
    assert described == []  # (every call a hit of the fast path)
    torch.testing.assert_close(first.cpu(), ref)
    torch.testing.assert_close(out.cpu(), a.cpu() * b.cpu() - 1.0)


def test_calls_the_fast_path_declines_take_the_general_path():
    a = torch.randn(4, 4, device="jax")
    for x in (a.t(), a[1:], a.to(torch.float64), a.conj()):  # views, another dtype, a lazy conj bit
        torch.testing.assert_close((x + 1).cpu(), x.cpu() + 1)
        torch.testing.assert_close((x + 1).cpu(), x.cpu() + 1)  # (the second call: a hit)
    with pytest.raises(RuntimeError, match="same device"):
        a + torch.randn(4, 4, dtype=torch.float32)  # a CPU operand of more than 0 dims
    p = torch.nn.Parameter(torch.randn(4, 4, device="jax"))
    torch.testing.assert_close((p * a).detach().cpu(), p.detach().cpu() * a.cpu())


def test_an_override_applies_to_ops_whose_fast_path_was_made_before_it():
    x = torch.tensor([-1.0, 2.0, 3.0], device="jax")
    torch.relu(x), torch.relu(x)  # (compiled, then a hit of the fast path)
    with torch_jax.override(torch.ops.aten.relu.default, lambda a: jnp.maximum(a, 0) * 2):
        assert torch.relu(x).cpu().tolist() == [0.0, 4.0, 6.0]
        assert torch.relu(x).cpu().tolist() == [0.0, 4.0, 6.0]  # (a hit, in the override's cache)
    assert torch.relu(x).cpu().tolist() == [0.0, 2.0, 3.0]
