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


def test_a_few_hundred_shapes_stay_under_a_small_budget(fresh_warning):
    w = torch.randn(8, 4)
    w_dev = w.to("jax")
    before = torch_jax.stats()
    with config_as(cache_size=64, compile_cache_mb=16), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(1, 301):
            x = torch.randn(n, 8)
            got = _step(x.to("jax"), w_dev).cpu()
            torch.testing.assert_close(got, _step(x, w), rtol=1e-5, atol=1e-5)
            assert _compile_cache.entries() <= 64
            assert _compile_cache.held_bytes() <= 16 * 2**20
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


def test_evicted_computations_compile_again_with_the_same_results():
    x = torch.randn(6, 8).to("jax")
    first = (x * 3).cpu()
    _compile_cache.sweep()
    _compile_cache.sweep()  # (two sweeps: unused since the first, so dropped)
    before = torch_jax.stats()["recompiles"] if "recompiles" in torch_jax.stats() else 0
    assert torch.equal((x * 3).cpu(), first)
    if torch_jax.config.mode == "strict":
        assert torch_jax.stats().get("recompiles", 0) > before
