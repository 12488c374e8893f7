"""Programs whose shapes keep changing (NOTE [Bounded compile cache] in
runtime/_compile_cache, NOTE [Shapes that keep changing] in runtime/_recompiles): with a
small budget the compile cache evicts often, memory mappings and the cache's memory stay
under it, results still match the CPU, and the process warns once (never for a
fixed-shape loop). Both modes (CI runs the suite in strict and in fused mode)."""

from __future__ import annotations

import warnings

import pytest
import torch

import torch_jax
from conftest import config_as
from torch_jax.runtime import _compile_cache, _recompiles


def _maps() -> int:
    with open("/proc/self/maps", "rb") as f:
        return sum(1 for _ in f)


def _max_maps() -> int:
    with open("/proc/sys/vm/max_map_count") as f:
        return int(f.read())


@pytest.fixture
def fresh_warning(monkeypatch):
    """The once-per-process warning, as if not given yet."""
    monkeypatch.setattr(_recompiles, "_warned", False)
    monkeypatch.setattr(_recompiles, "_sizes", {})
    monkeypatch.setattr(_recompiles, "_shapes", {})


def _step(x, w):
    return torch.relu(x @ w).sum(dim=0)


def test_many_shapes_stay_under_a_small_budget(fresh_warning):
    # (48 lengths, each new: 3 times the cache's entries in graphs, more in ops; 160
    # lengths through a cache of 64 took 48 s of CI's fused run and 22 of its strict run
    # in a fast hour of the 2-core EPYC, 300 took 265 s of the fused run on a slow machine;
    # 8 MiB: one computation's estimate here reached 3.5 MB, where the heap grew)
    w = torch.randn(8, 4)
    w_dev = w.to("jax")
    before = torch_jax.stats()
    # (bucketing off: the loop would otherwise upload x into buckets after 8 lengths and
    # stop compiling, tests/test_buckets; here every shape must compile)
    with (
        config_as(cache_size=16, compile_cache_mb=8, bucketing="off"),
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always")
        for n in range(1, 49):
            x = torch.randn(n, 8)
            got = _step(x.to("jax"), w_dev).cpu()
            torch.testing.assert_close(got, _step(x, w), rtol=1e-5, atol=1e-5)
            assert _compile_cache.entries() <= 16
            assert _compile_cache.held_bytes() <= 8 * 2**20
    after = torch_jax.stats()
    evicted = sum(after.get(k, 0) - before.get(k, 0) for k in ("cache_evictions", "graph_evictions"))
    assert evicted > 0
    assert _maps() < _max_maps() // 2
    recompile_warnings = [w for w in caught if issubclass(w.category, torch_jax.RecompileWarning)]
    assert len(recompile_warnings) == 1, [str(w.message) for w in recompile_warnings]
    assert "keeps compiling for new shapes" in str(recompile_warnings[0].message)
    assert "dimension 0" in str(recompile_warnings[0].message)
    assert after["shape_churn"]


def test_a_fixed_shape_loop_never_warns(fresh_warning):
    w = torch.randn(8, 4, device="jax")
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch_jax.RecompileWarning)
        for _ in range(30):
            for n in (3, 5):  # (two shapes, each seen again and again)
                _step(torch.randn(n, 8, device="jax"), w).cpu()


def test_sizes_compiled_on_purpose_are_not_shapes_that_keep_changing(fresh_warning):
    """A warm-up over chosen sizes (vLLM's token buckets) inside ``_recompiles.planned()``
    warns of nothing and counts no churn; the same sizes after it are cache hits, and new
    ones outside it are noted as ever."""
    w = torch.randn(8, 4, device="jax")
    churn = dict(torch_jax.stats().get("shape_churn", {}))
    # (bucketing off: every size compiles, as test_many_shapes_stay_under_a_small_budget's)
    with config_as(bucketing="off"), warnings.catch_warnings():
        warnings.simplefilter("error", torch_jax.RecompileWarning)
        # (and a torch.compile graph, compiled for each input shape: vLLM's model step)
        compiled = torch.compile(_step, backend="jax", dynamic=True)
        with _recompiles.planned():
            for n in range(1, 2 * _recompiles.THRESHOLD + 1):
                _step(torch.randn(n, 8, device="jax"), w).cpu()
                compiled(torch.randn(n, 8, device="jax"), w).cpu()
        for n in range(1, 2 * _recompiles.THRESHOLD + 1):
            _step(torch.randn(n, 8, device="jax"), w).cpu()
    assert dict(torch_jax.stats().get("shape_churn", {})) == churn
    with config_as(bucketing="off"), pytest.warns(torch_jax.RecompileWarning, match="keeps compiling for new shapes"):
        for n in range(100, 100 + _recompiles.THRESHOLD):
            _step(torch.randn(n, 8, device="jax"), w).cpu()


def test_evicted_computations_compile_again_with_the_same_results():
    x = torch.randn(6, 8).to("jax")
    first = (x * 3).cpu()
    _compile_cache.sweep()
    _compile_cache.sweep()  # (two sweeps: unused since the first, so dropped)
    before = torch_jax.stats()["recompiles"] if "recompiles" in torch_jax.stats() else 0
    assert torch.equal((x * 3).cpu(), first)
    if torch_jax.config.mode == "strict":
        assert torch_jax.stats().get("recompiles", 0) > before


class _Entry:
    def __init__(self, cost):
        self.used, self.cost = False, cost


def test_a_late_charge_keeps_the_memory_budget_and_a_dropped_entry_charges_nothing():
    # (fused eager admits an op's entry when it records it and charges its compilation
    # when it first runs strict: the budget holds after that charge too, and an entry
    # dropped in between holds nothing)
    held, mb = {}, 1
    with config_as(compile_cache_mb=mb):
        _compile_cache.sweep()
        _compile_cache.sweep()  # (everything unused since the first: dropped)
        base = _compile_cache.held_bytes()
        a, b, c = _Entry(0), _Entry(0), _Entry(0)
        for key, entry in zip("abc", (a, b, c)):
            _compile_cache.admit(held, key, entry, "op")
        _compile_cache.sweep()  # (each marked unused)
        _compile_cache.charge(a, 6 * 2**17)
        assert _compile_cache.held_bytes() - base == 6 * 2**17 and set(held) == {"a", "b", "c"}
        _compile_cache.charge(b, 6 * 2**17)  # (over the budget: c, unused, goes, then the older a)
        assert set(held) == {"b"}
        assert _compile_cache.held_bytes() - base == 6 * 2**17 <= mb * 2**20
        _compile_cache.charge(c, 6 * 2**17)  # (dropped before it compiled)
        _compile_cache.charge(a, 2**17)
        assert _compile_cache.held_bytes() - base == 6 * 2**17


def _decode(x, cache, w):
    """A token's step with a growing cache: 60 fixed-shape ops, then a concatenation
    along the cache's length and a reduction over it."""
    for _ in range(30):
        x = torch.tanh(x @ w)
    cache = torch.cat([cache, x], dim=0)
    return cache, (cache * x).sum()


def test_a_fused_graph_that_keeps_changing_shape_runs_op_by_op(fresh_warning, monkeypatch):
    """NOTE [One-off graphs run op by op]: once a fused graph keeps compiling, a new shape
    whose ops are mostly compiled already runs op by op (strict's computations, cached
    per op), not as a new whole graph; results as the CPU's."""
    monkeypatch.setattr(_recompiles, "_op_compiles", [0, 0.0])
    w = torch.randn(8, 8) / 3
    cpu = [torch.randn(1, 8), torch.zeros(0, 8)]
    dev = [t.to("jax") for t in cpu]
    before = torch_jax.stats()
    with torch_jax.fused(), config_as(bucketing="off"):  # (every length a new shape: no buckets)
        for _ in range(30):
            cpu[1], want = _decode(cpu[0], cpu[1], w)
            dev[1], got = _decode(dev[0], dev[1], w.to("jax"))
            torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    after = torch_jax.stats()
    graphs, by_op = (after.get(k, 0) - before.get(k, 0) for k in ("graphs_compiled", "graphs_op_by_op"))
    # the first shapes compile graphs; then every new length runs op by op (its 60
    # fixed-shape ops cost nothing new, only the two that see the length)
    assert graphs <= _recompiles._OP_BY_OP_AFTER + 1 and by_op >= 30 - _recompiles._OP_BY_OP_AFTER - 1, (graphs, by_op)


def test_a_graph_runs_op_by_op_only_where_that_compiles_less(monkeypatch):
    """The choice itself: op by op when the ops not yet compiled, at the mean op's
    compile time, cost less than the structure's last graph, only once graphs of its
    structure have compiled for two shapes, and only the first time a key is seen."""

    class Entry:
        def __init__(self, fn):
            self.spec, self.fn = type("Spec", (), {"op": torch.ops.aten.add.Tensor})(), fn

    compiled, new = Entry(fn=object()), [Entry(fn=None) for _ in range(3)]
    nodes = [(compiled, (0,)), (compiled, (1,))] + [(e, (2,)) for e in new]
    key = _recompiles.structure(nodes)
    monkeypatch.setattr(_recompiles, "_op_compiles", [10, 0.2])  # 20 ms an op
    monkeypatch.setattr(_recompiles, "_shapes", {key: [_recompiles._OP_BY_OP_AFTER - 1, [], 1.0]})
    monkeypatch.setattr(_recompiles, "_once", set())
    assert not _recompiles.op_by_op(nodes, "a")  # (not yet changing shape)
    _recompiles._shapes[key][0] = _recompiles._OP_BY_OP_AFTER
    assert _recompiles.op_by_op(nodes, "b")  # 3 new ops, 60 ms < 1 s
    assert not _recompiles.op_by_op(nodes, "b")  # (the same shapes again: no one-off)
    _recompiles._shapes[key][2] = 0.05
    assert not _recompiles.op_by_op(nodes, "c")  # 60 ms > 50 ms
