"""Fused eager (NOTE [Fused eager] in runtime/_fused): same results as strict mode and
the CPU, with the counters showing what it promises: one computation for a chain of
ops, no recompilation after warm-up, no host transfer in a training step."""

from __future__ import annotations

import pytest
import torch

import torch_jax
from torch_jax.tensor import _storage


@pytest.fixture
def fused():
    before = torch_jax.config.mode
    with torch_jax.fused():
        yield
    assert torch_jax.config.mode == before


def _delta(before, key):
    return torch_jax.stats().get(key, 0) - before.get(key, 0)


def test_a_chain_of_elementwise_ops_is_one_computation(fused):
    x = torch.randn(64, device="jax")
    torch_jax.mark_step()  # (the randn itself)
    before = torch_jax.stats()
    y = x
    for i in range(20):
        y = (y * 1.01 + i).tanh()
    assert _delta(before, "graphs_run") == 0  # nothing ran yet
    got = y.cpu()
    assert _delta(before, "graphs_run") == 1
    assert _delta(before, "graph_ops") == 60
    assert torch_jax.stats()["materializations"].get("host transfer", 0) >= 1
    expected = x.cpu()
    for i in range(20):
        expected = (expected * 1.01 + i).tanh()
    torch.testing.assert_close(got, expected)


def _mlp_step(model, opt, x, y):
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss


def _train(device, steps, lr=0.05):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(16, 4))
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2, 0.5)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 8, generator=g).to(device), torch.randint(0, 4, (32,), generator=g).to(device)
    losses = []
    for _ in range(steps):
        losses.append(_mlp_step(model, opt, x, y))
        sched.step()
        if device == "jax":
            torch_jax.mark_step()
    return [loss.item() for loss in losses], [p.detach().cpu() for p in model.parameters()]


def test_training_matches_strict_mode_and_stops_compiling(fused, monkeypatch):
    from torch_jax.runtime import _buckets

    # (the lengths of the uploads seen so far start empty: after a few lengths of 1-d float32
    # uploads in earlier tests of this process, the two runs' biases could go into buckets
    # differently, NOTE [Buckets], and the second run compile)
    monkeypatch.setattr(_buckets, "_lengths", {})
    monkeypatch.setattr(_buckets, "_announced", set())
    losses, params = _train("jax", 6)
    before = torch_jax.stats()
    _train("jax", 6, lr=0.02)  # a new learning rate is an input, not a constant
    assert _delta(before, "compiles") == 0 and _delta(before, "graphs_compiled") == 0
    with _strict():
        strict_losses, strict_params = _train("jax", 6)
    # the same seed draws the same dropout masks in both modes
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(strict_losses))
    torch.testing.assert_close(params, strict_params)


def test_a_training_step_without_item_makes_no_host_transfer(fused):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 2)).to("jax")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(4, 8, device="jax"), torch.randint(0, 2, (4,), device="jax")
    for _ in range(2):
        _mlp_step(model, opt, x, y)
        torch_jax.mark_step()
    before = torch_jax.stats()
    _mlp_step(model, opt, x, y)
    torch_jax.mark_step()
    assert _delta(before, "host_transfers") == 0
    assert _delta(before, "graphs_run") == 1 and _delta(before, "graphs_compiled") == 0


def test_an_unchanged_training_loop_runs_one_graph_per_step(fused):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3)).to("jax")
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 8, device="jax"), torch.randint(0, 3, (16,), device="jax")
    for _ in range(2):  # no mark_step: Optimizer.step() ends the step (NOTE [Optimizer steps mark steps])
        _mlp_step(model, opt, x, y)
    before = torch_jax.stats()
    for _ in range(5):
        _mlp_step(model, opt, x, y)
    assert _delta(before, "graphs_run") == 5 and _delta(before, "graphs_compiled") == 0
    reasons = torch_jax.stats()["materializations"]
    assert reasons["optimizer step"] - before["materializations"].get("optimizer step", 0) == 5


def test_overwritten_storages_donate_their_buffers(fused):
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 16).to("jax")
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x = torch.randn(8, 16, device="jax")
    kept = model.weight.detach().clone()
    alias = model.bias.view(4, 4)  # a view keeps the bias's storage, so its buffer is updated, not lost
    for _ in range(3):
        _mlp_step(model, opt, x, torch.zeros(8, dtype=torch.long, device="jax"))
        torch_jax.mark_step()
    before = torch_jax.stats()
    _mlp_step(model, opt, x, torch.zeros(8, dtype=torch.long, device="jax"))
    torch_jax.mark_step()
    # the weight, the bias and Adam's two moments of each: the step rewrites them in place
    assert _delta(before, "donated_buffers") >= 6
    # an array something else still holds is not given away
    held = [_storage.array(p.untyped_storage()._box) for p in model.parameters()]
    _mlp_step(model, opt, x, torch.zeros(8, dtype=torch.long, device="jax"))
    torch_jax.mark_step()
    assert not any(a.is_deleted() for a in held)
    assert not kept.equal(model.weight.detach())  # the clone is its own storage, untouched
    torch.testing.assert_close(alias.cpu().flatten(), model.bias.detach().cpu())


def test_a_donated_buffer_holds_its_storages_new_value(fused):
    """NOTE [Donation]: the parameter's buffer is rewritten with the parameter's new value,
    not with another result of the same shape computed earlier in the graph (a gradient),
    which would make XLA copy the parameter to keep reading it."""
    w = torch.randn(64, 32, device="jax")
    x = torch.randn(32, 32, device="jax")
    torch.jax.synchronize()
    box = w.untyped_storage()._box
    buffer = _storage.array(box).unsafe_buffer_pointer()
    grad = torch.mm(w, x) * 2  # a fresh result of w's shape and dtype, made before w's update
    w.sub_(0.1 * torch.mm(grad, x.t()))
    torch_jax.mark_step()
    torch.jax.synchronize()
    assert _storage.array(box).unsafe_buffer_pointer() == buffer
    assert grad.cpu().shape == (64, 32)


def test_views_and_in_place_writes(fused):
    base = torch.zeros(4, 5, device="jax")
    row, col = base[1], base[:, 2]
    row.add_(1)
    col.mul_(3).add_(2)
    base.t()[4].fill_(-1)
    cpu = torch.zeros(4, 5)
    cpu[1].add_(1)
    cpu[:, 2].mul_(3).add_(2)
    cpu.t()[4].fill_(-1)
    torch.testing.assert_close(row.cpu(), cpu[1])
    torch.testing.assert_close(base.cpu(), cpu)


def test_data_dependent_shapes_and_errors_materialize(fused):
    x = torch.arange(10.0, device="jax") - 4
    before = torch_jax.stats()["materializations"].get("data-dependent", 0)
    assert x[x > 0].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert torch_jax.stats()["materializations"].get("data-dependent", 0) > before
    # value errors surface when the graph runs (as CUDA's device-side asserts do)
    bad = torch.index_select(x, 0, torch.tensor([11], device="jax"))
    with pytest.raises(IndexError, match="out of range"):
        bad.cpu()
    assert bool((x > 3).any())


def test_value_errors_after_a_step_marker_surface_at_the_next_wait(fused):
    x = torch.arange(5.0, device="jax")
    torch.index_select(x, 0, torch.tensor([7], device="jax"))
    torch_jax.mark_step()  # dispatches the graph; its checks are read later (NOTE [Deferred value checks])
    with pytest.raises(IndexError, match="out of range"):
        torch.jax.synchronize()
    torch.jax.synchronize()  # raised once
    y = torch.index_select(x, 0, torch.tensor([9], device="jax")) + 1
    torch_jax.mark_step()
    with pytest.raises(IndexError, match="out of range"):
        (x + 1).sum().item()  # a later host transfer waits for it too
    assert y.shape == (1,)


def test_size_cap_and_synchronize(fused, monkeypatch):
    monkeypatch.setattr(torch_jax.config, "fused_max_ops", 5)
    x = torch.ones(3, device="jax")
    before = torch_jax.stats()
    for _ in range(12):
        x = x + 1
    assert torch_jax.stats()["materializations"].get("size cap", 0) >= 2
    torch.jax.synchronize()
    assert _delta(before, "graphs_run") == 3
    assert x.tolist() == [13.0, 13.0, 13.0]


def test_modes_switch_through_the_api():
    with _strict():
        torch_jax.set_mode("fused")
        assert torch_jax.config.mode == "fused"
        y = torch.ones(2, device="jax") * 2
        torch_jax.set_mode("strict")  # leaving fused mode runs what is pending
        assert torch_jax.stats()["materializations"].get("mode change", 0) >= 1
        assert y.tolist() == [2.0, 2.0]
    with pytest.raises(ValueError):
        torch_jax.set_mode("lazy")


class _strict:
    def __enter__(self):
        self.before = torch_jax.config.mode
        torch_jax.set_mode("strict")

    def __exit__(self, *exc):
        torch_jax.set_mode(self.before)


def test_graphs_are_dropped_under_mapping_pressure(fused, monkeypatch):
    # NOTE [Bounded compile cache]: a run of many distinct graphs held one executable each
    # until the process ran out of memory mappings; under pressure the oldest half goes,
    # and a graph that comes back compiles again with the same result
    from torch_jax.runtime import _compile_cache

    monkeypatch.setattr(_compile_cache, "maps_pressure", lambda: True)
    before = torch_jax.stats()
    results = {}
    for n in range(1, 40):
        results[n] = (torch.arange(n, device="jax", dtype=torch.float32) * 2).sum().item()
    assert _delta(before, "graph_evictions") > 0
    assert (torch.arange(3, device="jax", dtype=torch.float32) * 2).sum().item() == results[3] == 6.0
    assert results == {n: float(n * (n - 1)) for n in results}
