"""Buckets (NOTE [Buckets] in runtime/_buckets): tensors whose length keeps growing live in
arrays of a few sizes, so that a new length compiles nothing; the ops that know buckets
give the CPU's results on PyTorch's own samples with bucketing forced, views of a
bucket read in place, and a KV cache or generated ids stop compiling."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import torch_jax
from conftest import config_as
from torch_jax.report import _sweep
from torch_jax.runtime import _buckets, _recompiles
from torch_jax.tensor import _storage

# the OpInfos whose calls reach the ops that know buckets
BUCKET_OPINFOS = ("cat", "nn.functional.scaled_dot_product_attention")


def _padded(t) -> bool:
    return t.untyped_storage()._box.arr.__class__ is _storage.Padded


def _stat(name: str) -> int:
    return torch_jax.stats().get(name, 0)


# (fused mode runs the same rules inside graphs: float32 there, with its gradients and
# variants; 93 s of CI's fused run with every dtype on a 2-core AMD EPYC)
@pytest.mark.parametrize("dtype", (torch.float32,) if torch_jax.config.mode == "fused" else _sweep.DTYPES, ids=str)
@pytest.mark.parametrize("name", BUCKET_OPINFOS)
def test_ops_that_know_buckets_give_the_cpus_results_with_bucketing_forced(name, dtype):
    """Every sample (and for float32/float64 its gradients, in-place and out= variants)
    with every call that a rule applies to in a bucket: results as the CPU's, to the
    sweep's tolerances."""
    (op,) = [o for o in _sweep.opinfos() if _sweep.name_of(o) == name]
    if not _sweep.supported(op, dtype):
        pytest.skip(f"{name} has no {dtype} on the CPU")
    before = _stat("bucketed_ops")
    with config_as(bucketing="force"):
        result = _sweep.check(op, dtype)
    assert result.status == "pass", result.message
    assert _stat("bucketed_ops") > before  # (the rules ran, not only the plain path)


def test_a_growing_cache_compiles_nothing_within_a_bucket():
    """cat along a growing length and attention over it: once the op keeps compiling,
    its results go into buckets; once the first two lengths in bucket 64 have compiled
    their computations (33 moves the cache into the bucket, 34 writes within it),
    lengths 35..64 compile nothing (strict) or run the graphs compiled for the bucket
    (fused), with the CPU's results."""
    torch.manual_seed(0)
    q, step = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8)
    cpu, dev = torch.randn(1, 2, 1, 8), None
    dev = cpu.to("jax")
    for n in range(2, 65):
        if n == 35:
            compiles, graphs = _stat("compiles"), _stat("graphs_compiled")
        cpu = torch.cat([cpu, step * n], dim=2)
        dev = torch.cat([dev, (step * n).to("jax")], dim=2)
        got = F.scaled_dot_product_attention(q.to("jax"), dev, dev)
        torch.testing.assert_close(got.cpu(), F.scaled_dot_product_attention(q, cpu, cpu), rtol=1e-5, atol=1e-5)
        torch_jax.mark_step()
    assert _padded(dev) and dev.untyped_storage()._box.arr.arr.shape == (1, 2, 64, 8)
    if torch_jax.config.mode == "strict":
        assert _stat("compiles") == compiles
    else:
        assert _stat("graphs_compiled") - graphs <= 2  # (the bucket's graph, and one donating variant)
    torch.testing.assert_close(dev.cpu(), cpu)
    assert _padded(dev)  # (a host transfer cuts on the host: the storage stays in its bucket)


def test_a_planned_call_asks_the_meta_kernel_once_for_its_arguments(monkeypatch):
    """NOTE [Meta outputs of a planned call]: a second sequence growing through the same
    lengths dispatches no Meta kernel, with the CPU's results; other sizes ask again."""
    from torch_jax.runtime import _executor

    asked = []
    meta = _executor._meta_outputs
    monkeypatch.setattr(_executor, "_meta_outputs", lambda spec, args: asked.append(1) or meta(spec, args))
    step = torch.randn(1, 2, 1, 8)

    def grow(start, lengths):
        cpu, dev = start, start.to("jax")
        with config_as(bucketing="force"):
            for n in lengths:
                cpu = torch.cat([cpu, step * n], dim=2)
                dev = torch.cat([dev, (step * n).to("jax")], dim=2)
        assert _padded(dev)
        torch.testing.assert_close(dev.cpu(), cpu)

    grow(torch.randn(1, 2, 1, 8), range(2, 12))
    first = len(asked)
    grow(torch.randn(1, 2, 1, 8), range(2, 12))
    assert first > 0 and len(asked) == first
    grow(torch.randn(1, 3, 1, 8)[:, :2], range(2, 6))  # (other strides: asked again)
    assert len(asked) > first


def _bucketed(cpu: torch.Tensor, dim: int):
    """``cpu`` on the device, in a bucket along ``dim`` (written there by cat)."""
    with config_as(bucketing="force"):
        head = cpu.narrow(dim, 0, 1).to("jax")
        t = torch.cat([head, cpu.narrow(dim, 1, cpu.shape[dim] - 1).to("jax")], dim=dim)
    assert _padded(t)
    return t


def test_views_of_a_bucket_read_in_place_and_writes_cut_it():
    x = torch.randn(3, 5, 4)
    t = _bucketed(x, 1)
    assert t.untyped_storage()._box.arr.arr.shape == (3, 16, 4)
    for view in (lambda a: a[:, -1], lambda a: a[1], lambda a: a[:, 1:3, 2], lambda a: a.transpose(0, 2), lambda a: a):
        torch.testing.assert_close((view(t) * 2).cpu(), view(x) * 2)
        assert _padded(t)  # (read in the bucket: the storage stays there)
    torch.testing.assert_close(t.reshape(-1).cpu(), x.reshape(-1))  # (not a block: read cut)
    t = _bucketed(x, 1)
    t[:, 0].fill_(7.0)
    x[:, 0] = 7.0
    assert not _padded(t)
    torch.testing.assert_close(t.cpu(), x)


def test_what_is_past_the_length_never_reaches_a_result():
    """The bucket past the length holds NaN; reductions, prints, .item() and the CPU
    fallback see only the tensor."""
    x = torch.arange(6.0).reshape(2, 3)
    t = _bucketed(x, 1)
    arr = t.untyped_storage()._box.arr.arr
    if arr.__class__ is _storage.Pending:  # (fused mode: the graph that writes it has not run)
        arr = arr.resolve("test")
    assert np.isnan(np.asarray(arr)).any()
    assert t.sum().item() == 15.0 and t.max().item() == 5.0
    assert "nan" not in repr(t)
    torch.testing.assert_close(t.cpu(), x)


def test_data_dependent_ops_read_a_flat_view_of_padded_rows_in_its_shape():
    # (a (12,) view of a (3, 4) tensor in padded rows, its comparison and clone stored in
    # the same rows: nonzero must see 12 elements, not the storage's (3, 4))
    x = torch.tensor([[0.0, 1.5, 0.0, 2.0], [0.0, 0.0, 0.0, 0.0], [-3.0, 0.0, 4.0, 0.0]])
    with config_as(bucketing="force"):
        t = x.to("jax")
        flat = t.reshape(12)
        torch.testing.assert_close(torch.nonzero(flat != 0).cpu(), torch.nonzero(x.reshape(12) != 0))
        torch.testing.assert_close(flat[flat != 0].cpu(), x.reshape(12)[x.reshape(12) != 0])


def test_buckets_are_powers_of_two_from_16():
    assert [_buckets.size(n) for n in (1, 16, 17, 64, 65, 600)] == [16, 16, 32, 64, 128, 1024]


def test_a_fixed_shape_program_never_buckets():
    before = _stat("bucketed_ops")
    a, b = torch.randn(2, 3).to("jax"), torch.randn(2, 5).to("jax")
    for _ in range(20):
        out = torch.cat([a, b], dim=1)
    assert _stat("bucketed_ops") == before and not _padded(out)


def test_greedy_generation_with_the_dynamic_cache_gives_the_cpus_tokens_and_stops_compiling():
    """A 2-layer GPT-2, 48 new tokens with the default dynamic cache: the CPU's tokens;
    the KV cache and the generated ids stay in buckets."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=300, n_positions=128)
    model = transformers.GPT2LMHeadModel(config).eval()
    prompt = torch.randint(0, 300, (1, 5), generator=torch.Generator().manual_seed(1))
    kwargs = dict(max_new_tokens=48, min_new_tokens=48, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        want = model.generate(prompt, **kwargs)
        model.to("jax")
        before = _stat("compiles")
        got = model.generate(prompt.to("jax"), **kwargs).cpu()
    assert torch.equal(got, want)
    compiles = _stat("compiles") - before
    # ~90 computations for the first tokens (prompt and decode step), a few per bucket
    # after; one compilation for each new length would be ~48 * 7 more
    assert compiles < 170, compiles
    assert _recompiles.churn  # (the cat kept compiling before it bucketed)


# ---------------------------------------------------------------- NOTE [Padded rows]

# the OpInfos whose calls reach the ops that take padded rows (and their backward ops)
ROWS_OPINFOS = (
    "mm",
    "addmm",
    "nn.functional.linear",
    "nn.functional.embedding",
    "nn.functional.nll_loss",
    "nn.functional.cross_entropy",
    "log_softmax",
    "softmax",
    "sum",
    "nn.functional.gelu",
    "add",
)
# which uploads go into buckets: (the sample's input, its other tensors) padded along a
# dim or not; ("rows", d): every tensor as long as the input along d (input and targets)
PADDINGS = ((0, None), (-1, None), (None, 0), (None, -1), (0, 0), (-1, -1), (-1, 0), ("rows", 0), ("rows", -1))
# (the losses have many samples: the paddings that give their input and targets the
# same rows, and the input's alone, which takes the plain path)
LOSS_PADDINGS = (("rows", 0), ("rows", -1), (0, None))
# (fused mode runs the same lowerings inside graphs: float32, with its gradients, there)
ROWS_DTYPES = (
    (torch.float32,)
    if torch_jax.config.mode == "fused"
    else (torch.float32, torch.float64, torch.bfloat16, torch.int64)
)


# CI's share (the default; ``TORCH_JAX_BUCKETS=full`` runs every padding everywhere):
# in strict mode each dtype a fixed third of the paddings (and rows along dim 0), the
# thirds of float32, float64 and bfloat16 together every padding, the gradients (float32
# and float64) two of the thirds; fused mode (float32 alone) a third an op, the ops' thirds
# taking turns. (CI's budget: with every padding these tests took 11 of the strict run's
# 60 minutes of worker time, measured on a loaded 2-core machine; with two thirds in
# float32, 369 s of the strict run's 4442 on a 2-core AMD EPYC, 2026-12-07.)
FULL = os.environ.get("TORCH_JAX_BUCKETS", "share") == "full"


def _paddings(name, dtype):
    paddings = LOSS_PADDINGS if "loss" in name or "entropy" in name else PADDINGS
    if FULL:
        return paddings
    turn = ROWS_OPINFOS.index(name) if torch_jax.config.mode == "fused" else ROWS_DTYPES.index(dtype)
    share = [p for i, p in enumerate(paddings) if (i + turn) % 3 == 0]
    if ("rows", 0) not in share:  # (the padding that puts every operand in a bucket, the losses' too)
        share.append(("rows", 0))
    return share


@pytest.mark.parametrize("dtype", ROWS_DTYPES, ids=str)
@pytest.mark.parametrize("name", ROWS_OPINFOS)
def test_ops_over_padded_rows_give_the_cpus_results_with_bucketing_forced(name, dtype, monkeypatch):
    """Every sample uploaded into buckets in each of PADDINGS (CI's share of them: FULL)
    (and for float32/float64 its gradients): results as the CPU's, to the sweep's
    tolerances; the rules ran."""
    (op,) = [o for o in _sweep.opinfos() if _sweep.name_of(o) == name]
    if not _sweep.supported(op, dtype):
        pytest.skip(f"{name} has no {dtype} on the CPU")
    before = _stat("bucketed_ops")
    for padding in _paddings(name, dtype):
        with config_as(bucketing="force"):
            result = _sweep.check(op, dtype, uploaded=padding)
        assert result.status == "pass", f"{padding}: {result.message}"
    assert _stat("bucketed_ops") > before


def test_a_changing_length_training_loop_runs_in_buckets(monkeypatch):
    """benchmarks/shapes' training loop (embedding, two Linear layers, GELU,
    cross-entropy, SGD) over lengths 1..64 scrambled: after 3 lengths the token ids are
    uploaded into buckets and every op of the step (forward, backward, the loss) runs
    there, so a new length within a bucket compiles nothing; the CPU's losses (each
    step's loss depends on every update before it); one warning, naming the uploads."""
    from benchmarks.shapes import training

    monkeypatch.setattr(_recompiles, "_warned", False)
    monkeypatch.setattr(_buckets, "_lengths", {})
    monkeypatch.setattr(_buckets, "_announced", set())
    want = training("cpu", 64, lambda: None)
    before = _stat("compiles")
    with pytest.warns(torch_jax.RecompileWarning, match="uploads of shape") as caught:
        got = training("jax", 64, torch_jax.mark_step)
    assert len([w for w in caught if issubclass(w.category, torch_jax.RecompileWarning)]) == 1
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)
    # ~17 computations a length for the first 3, then ~17 for each of the buckets 16, 32
    # and 64 (each of the first two lengths in a bucket: the ids' bucket, then the
    # steady step); one a length would be 64 * 17
    assert _stat("compiles") - before < 200, _stat("compiles") - before


def test_a_fixed_shape_training_loop_never_buckets():
    """The same step at one length, again and again: no bucket, no warning."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 50)).to("jax")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = _stat("bucketed_ops")
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch_jax.RecompileWarning)
        for _ in range(12):
            x, y = torch.randint(0, 50, (2, 7)).to("jax"), torch.randint(0, 50, (2, 7)).to("jax")
            F.cross_entropy(model(x).reshape(-1, 50), y.reshape(-1)).backward()
            opt.step()
            torch_jax.mark_step()
    assert _stat("bucketed_ops") == before
