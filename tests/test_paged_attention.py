"""Paged attention and the KV-cache write (kernels/_paged) against dense attention in
float64 on the CPU: ragged batches mixing prefill, continued chunked prefill and decode,
GQA, sliding windows and soft caps; the write through a view of vLLM's int8 buffer; and
both ops in one torch.compile graph, compiled once."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch_jax
from torch_jax.kernels import _paged  # noqa: F401  (registers the ops)

update = torch.ops.torch_jax.paged_kv_cache_update
attention = torch.ops.torch_jax.ragged_paged_attention


@dataclass
class Batch:
    """One step's arguments, on the CPU: ``kinds`` is one letter a sequence (p: prefill,
    c: continued chunked prefill, d: decode)."""

    query: torch.Tensor  # (T, Hq, D)
    cache: torch.Tensor  # (NB, Hkv, BS, 2D): a token's key, then its value
    starts: torch.Tensor  # (S + 1,) query_start_loc
    lens: torch.Tensor  # (S,) seq_lens
    table: torch.Tensor  # (S, max_blocks)
    slots: torch.Tensor  # (T,) each query token's slot, -1 for padding tokens

    def args(self, device):
        return [t.to(device) for t in (self.query, self.cache, self.starts, self.lens, self.table)]


def _batch(
    kinds,
    *,
    q_heads=8,
    kv_heads=2,
    dim=16,
    block_size=4,
    pad_tokens=0,
    pad_seqs=0,
    shape=None,
    dtype=torch.float32,
    seed=0,
):
    """A random batch, its blocks shuffled; ``shape``: (tokens, blocks, table width) fixed
    whatever the lengths drawn (padded), for the tests that count compilations."""
    g = torch.Generator().manual_seed(seed)

    def draw(lo, hi):  # an int in [lo, hi]
        return int(torch.randint(lo, hi + 1, (), generator=g))

    q_lens, lens = [], []
    for kind in kinds:
        n = draw(2, 5 * block_size)
        q_lens.append(n if kind == "p" else 1 if kind == "d" else draw(1, n - 1))
        lens.append(n)
    need = [math.ceil(n / block_size) for n in lens]
    tokens, n_blocks, width = shape or (sum(q_lens) + pad_tokens, sum(need) + 3, max(need) + 1)
    assert tokens >= sum(q_lens) and n_blocks >= sum(need) and width >= max(need)
    order = torch.randperm(n_blocks, generator=g).tolist()  # (spare blocks: random, never read)
    table = torch.zeros(len(kinds) + pad_seqs, width, dtype=torch.int32)
    for s, k in enumerate(need):
        table[s, :k] = torch.tensor(order[:k])
        order = order[k:]
    cache = torch.randn(n_blocks, kv_heads, block_size, 2 * dim, generator=g).to(dtype)
    starts = torch.tensor([0, *q_lens, *[0] * pad_seqs], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    query = torch.randn(tokens, q_heads, dim, generator=g).to(dtype)
    slots = torch.full((tokens,), -1, dtype=torch.int64)
    for s, (q, n) in enumerate(zip(q_lens, lens)):
        pos = torch.arange(n - q, n)
        slots[starts[s] : starts[s + 1]] = table[s, pos // block_size].long() * block_size + pos % block_size
    lens = torch.tensor([*lens, *[0] * pad_seqs], dtype=torch.int32)
    return Batch(query, cache, starts, lens, table, slots)


def _reference(query, cache, starts, lens, table, scale, window=-1, cap=0.0, dtype=torch.float64):
    """Dense causal attention, sequence by sequence, in ``dtype`` on the CPU; padding
    tokens' rows zero."""
    tokens, q_heads, dim = query.shape
    _, kv_heads, block_size, _ = cache.shape
    out = torch.zeros(tokens, q_heads, dim, dtype=dtype)
    for s in range(len(lens)):
        a, b, n = int(starts[s]), int(starts[s + 1]), int(lens[s])
        if a == b:
            continue
        blocks = table[s, : math.ceil(n / block_size)].long()
        kv = cache[blocks].transpose(1, 2).reshape(-1, kv_heads, 2 * dim)[:n].to(dtype)  # (n, Hkv, 2D)
        k, v = kv[..., :dim], kv[..., dim:]
        k, v = (x.repeat_interleave(q_heads // kv_heads, dim=1) for x in (k, v))  # (n, Hq, D)
        q = query[a:b].to(dtype)  # (q, Hq, D)
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        if cap > 0:
            scores = cap * torch.tanh(scores / cap)
        pos = torch.arange(n - (b - a), n)[:, None]
        key = torch.arange(n)[None, :]
        seen = (key <= pos) & ((key > pos - window) if window > 0 else True)
        scores = scores.masked_fill(~seen, -math.inf)
        out[a:b] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
    return out


def test_the_schemas():
    assert str(update.default._schema) == (
        "torch_jax::paged_kv_cache_update(Tensor key, Tensor value, Tensor(a!) kv_cache, Tensor slot_mapping) -> ()"
    )
    assert str(attention.default._schema) == (
        "torch_jax::ragged_paged_attention(Tensor query, Tensor kv_cache, Tensor query_start_loc, Tensor seq_lens, "
        "Tensor block_table, float scale, int sliding_window=-1, float logits_soft_cap=0., Scalar num_seqs=-1) -> Tensor"
    )


# (name, batch arguments, window, soft cap)
CASES = [
    ("mixed_gqa", dict(kinds="pcdpdc", pad_tokens=3, pad_seqs=2), -1, 0.0),
    ("mha", dict(kinds="pdc", q_heads=4, kv_heads=4, dim=32, block_size=8, seed=1), -1, 0.0),
    ("decode_only", dict(kinds="dddd", block_size=16, pad_tokens=4, seed=2), -1, 0.0),
    ("sliding_window", dict(kinds="pcdd", pad_tokens=2, seed=3), 5, 0.0),
    ("soft_cap", dict(kinds="pcd", pad_seqs=1, seed=4), -1, 3.0),
    ("window_and_cap", dict(kinds="cdp", block_size=8, dim=32, seed=5), 9, 2.0),
]


@pytest.mark.parametrize("name, kwargs, window, cap", CASES, ids=[c[0] for c in CASES])
def test_attention_matches_dense_attention_in_float32(name, kwargs, window, cap):
    batch = _batch(**kwargs)
    scale = 1.0 if cap else 1 / math.sqrt(batch.query.shape[-1])
    cpu = [batch.query, batch.cache, batch.starts, batch.lens, batch.table]
    expected = _reference(*cpu, scale, window, cap)
    cpu_error = (_reference(*cpu, scale, window, cap, dtype=torch.float32) - expected).abs().max()
    got = attention(*batch.args("jax"), scale, window, cap)
    assert got.dtype == torch.float32 and got.shape == batch.query.shape
    error = (got.cpu().double() - expected).abs().max()
    assert error <= 2 * cpu_error, f"{error:.3g} against the CPU's float32 {cpu_error:.3g}"
    valid = int(batch.starts[-1])
    assert torch.equal(got[valid:].cpu(), torch.zeros_like(batch.query[valid:]))  # (padding tokens)


def test_attention_in_bfloat16():
    batch = _batch("pcddp", pad_tokens=2, pad_seqs=1, dtype=torch.bfloat16, seed=6)
    expected = _reference(batch.query, batch.cache, batch.starts, batch.lens, batch.table, 0.25, 7, 4.0)
    got = attention(*batch.args("jax"), 0.25, 7, 4.0)
    assert got.dtype == torch.bfloat16
    # (computed in float32 and rounded once: within bfloat16's half ulp of the exact result)
    torch.testing.assert_close(got.cpu().double(), expected, atol=1e-3, rtol=2**-8)


@pytest.mark.parametrize("name, kwargs, window, cap", CASES, ids=[c[0] for c in CASES])
def test_the_jnp_version_matches_dense_attention_in_float32(name, kwargs, window, cap):
    """The version other platforms run (and the CPU with config.cpu_attention off): on
    the CPU the op above runs the C++ kernel (NOTE [Paged attention on XLA:CPU])."""
    batch = _batch(**kwargs)
    scale = 1.0 if cap else 1 / math.sqrt(batch.query.shape[-1])
    cpu = [batch.query, batch.cache, batch.starts, batch.lens, batch.table]
    expected = _reference(*cpu, scale, window, cap)
    cpu_error = (_reference(*cpu, scale, window, cap, dtype=torch.float32) - expected).abs().max()
    run = jax.jit(functools.partial(_paged._attention_jnp, scale=scale, sliding_window=window, soft_cap=cap))
    got = run(*[jnp.asarray(t.numpy()) for t in cpu], jnp.int32(len(batch.lens)))
    error = (torch.from_numpy(np.array(got)).double() - expected).abs().max()
    # (a soft cap goes through XLA's float32 tanh, 0.7 ulp on average and 4 at most, where
    # the CPU's is 0.25 and 0.5: with a cap the jnp version measured 0.86-2.09x the CPU's
    # error over seven batches on a 2-core AMD EPYC, 1.6x on average; without one 0.26-1.7x)
    limit = 2.5 if cap else 2
    assert error <= limit * cpu_error, f"{error:.3g} against the CPU's float32 {cpu_error:.3g}"


def test_the_cpu_kernel_is_built_and_runs():
    # (so that the tests above hold the kernel, not the jnp version twice, to the reference)
    assert _paged._handlers.load(), _paged._handlers.status
    batch = _batch("pcd", seed=16)
    args = [jnp.asarray(t.numpy()) for t in (batch.query, batch.cache, batch.starts, batch.lens, batch.table)]
    text = jax.jit(lambda *a: _paged._ragged_paged_attention(*a, 0.25)).lower(*args).as_text()
    assert "tj_paged_attention_f32" in text


def test_a_cache_that_does_not_fit_the_queries_is_refused():
    batch = _batch("pd", q_heads=6, kv_heads=4, seed=17)
    with pytest.raises(Exception, match="does not fit queries"):
        attention(*batch.args("jax"), 0.25)


def _kv_shape(batch):
    """(Hkv, D) of a token's key or value."""
    return batch.cache.shape[1], batch.cache.shape[3] // 2


def _write_reference(batch, key, value):
    blocks, heads, block_size, width = batch.cache.shape
    cache = batch.cache.transpose(1, 2).reshape(blocks * block_size, heads, width)  # (a copy: slots, Hkv, 2D)
    keep = batch.slots >= 0
    cache[batch.slots[keep]] = torch.cat([key[keep], value[keep]], dim=-1)
    return cache.view(blocks, block_size, heads, width).transpose(1, 2).contiguous()


def test_the_cache_write_goes_through_a_view_of_an_int8_buffer(mode):
    """vLLM allocates a layer's cache as int8 bytes and views them as the model's dtype
    and the cache's shape; the write lands in the bytes, a later read of the view sees
    it, and attention reads what was written."""
    batch = _batch("pcd", pad_tokens=2, seed=7)
    g = torch.Generator().manual_seed(8)
    key, value = (torch.randn(batch.query.shape[0], *_kv_shape(batch), generator=g) for _ in (0, 1))
    expected = _write_reference(batch, key, value)
    raw = batch.cache.view(torch.int8).flatten().to("jax")
    cache = raw.view(torch.float32).view(batch.cache.shape)
    update(key.to("jax"), value.to("jax"), cache, batch.slots.to("jax"))
    assert torch.equal(raw.cpu(), expected.view(torch.int8).flatten())
    assert torch.equal(cache.cpu(), expected)
    query, _, *rest = batch.args("jax")
    got = attention(query, cache, *rest, 0.25)
    cpu = [batch.query, expected, batch.starts, batch.lens, batch.table]
    torch.testing.assert_close(got.cpu().double(), _reference(*cpu, 0.25), atol=1e-5, rtol=1e-5)


def test_the_cache_write_casts_to_the_cache_dtype():
    """float32 keys and values into a bfloat16 cache."""
    batch = _batch("dd", seed=9)
    key, value = (torch.randn(batch.query.shape[0], *_kv_shape(batch)) for _ in (0, 1))
    batch.cache = batch.cache.to(torch.bfloat16)
    expected = _write_reference(batch, key.bfloat16(), value.bfloat16())
    got = batch.cache.to("jax")
    update(key.to("jax"), value.to("jax"), got, batch.slots.int().to("jax"))  # (slots as int32 too)
    assert got.dtype == torch.bfloat16 and torch.equal(got.cpu(), expected)


def _step(key, value, cache, slots, query, starts, lens, table):
    """A layer's attention in a serving step: write the new tokens, attend."""
    update(key, value, cache, slots)
    return attention(query, cache, starts, lens, table, 0.25, 6)


def _step_on_bytes(key, value, raw, *rest):
    return _step(key, value, raw.view(torch.float32).view(-1, 2, 4, 32), *rest)


@pytest.mark.parametrize("given", ["view", "bytes"])
def test_a_compiled_step_matches_eager_and_compiles_once(given):
    """The cache given as vLLM's view of its bytes, or as the bytes, viewed in the graph."""
    fn = _step if given == "view" else _step_on_bytes
    compiled = torch.compile(fn, backend="jax", fullgraph=True, dynamic=False)
    for seed in (10, 11, 12):  # (same shapes, other values: other lengths and blocks)
        batch = _batch("pcdd", pad_seqs=1, shape=(48, 24, 6), seed=seed)
        g = torch.Generator().manual_seed(seed)
        key, value = (torch.randn(48, 2, 16, generator=g) for _ in (0, 1))
        rest = [a.to("jax") for a in (batch.slots, batch.query, batch.starts, batch.lens, batch.table)]
        raws = [batch.cache.view(torch.int8).flatten().to("jax") for _ in (0, 1)]  # (eager's, compiled's)
        caches = [r.view(torch.float32).view(batch.cache.shape) for r in raws]
        inputs = caches if given == "view" else raws
        expected = fn(key.to("jax"), value.to("jax"), inputs[0], *rest)
        got = compiled(key.to("jax"), value.to("jax"), inputs[1], *rest)
        torch.testing.assert_close(got.cpu(), expected.cpu(), atol=1e-6, rtol=1e-6)
        assert torch.equal(raws[1].cpu(), raws[0].cpu()) and torch.equal(caches[1].cpu(), caches[0].cpu())
        assert not torch.equal(raws[1].cpu(), batch.cache.view(torch.int8).flatten())  # (written)
        if seed == 10:
            torch_jax.reset_stats()
    stats = torch_jax.stats()
    assert stats.get("compiled_graph_compiles", 0) + stats.get("compiled_graph_loads", 0) == 0
    assert stats["compiled_graph_hits"] == 2


def test_eager_attention_compiles_once_for_a_shape():
    shapes = None
    for seed in (13, 14, 15):
        batch = _batch("pcd", block_size=8, shape=(96, 20, 6), seed=seed)
        args = batch.args("jax")
        assert shapes is None or shapes == [a.shape for a in args]
        shapes = [a.shape for a in args]
        attention(*args, 0.25).cpu()
        if seed == 13:
            torch_jax.reset_stats()
    assert torch_jax.stats()["compiles"] == 0


def test_rows_past_num_seqs_are_ignored_and_one_computation_serves_every_count():
    # (vLLM's metadata as whole buffers of a fixed number of rows, the batch's first:
    # NOTE [Metadata of a fixed size]; the rows past it hold a former batch's values)
    for seed, kinds in ((21, "pcd"), (22, "dpdcd")):
        batch = _batch(kinds, block_size=8, shape=(96, 40, 6), pad_seqs=8 - len(kinds), seed=seed)
        expected = _reference(*batch.args("cpu"), 0.25)
        stale = [t.clone() for t in (batch.starts, batch.lens, batch.table)]
        n = len(kinds)
        stale[0][n + 1 :] = torch.arange(8 - n, dtype=torch.int32) * 7  # (not even increasing)
        stale[1][n:] = 33
        stale[2][n:] = 39
        args = [batch.query, batch.cache, *stale]
        got = attention(*[t.to("jax") for t in args], 0.25, -1, 0.0, n).cpu()
        torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)
        if seed == 21:
            torch_jax.reset_stats()
    assert torch_jax.stats()["compiles"] == 0


def test_slot_mapping_from_whole_buffers():
    # (vLLM's slot-mapping kernel on jax: NOTE [Slot mapping on jax]; the buffers' rows past
    # the batch hold a former batch's values, and one computation serves every batch)
    slot_mapping = torch.ops.torch_jax.paged_slot_mapping
    g = torch.Generator().manual_seed(3)
    block_size, rows, width, size = 4, 6, 5, 40
    for seed, q_lens in ((0, [3, 1, 7]), (1, [1, 1, 2, 9, 1])):
        table = torch.randint(0, 50, (rows, width), generator=g, dtype=torch.int32)
        lens = [int(torch.randint(q, width * block_size + 1, (), generator=g)) for q in q_lens]
        starts = torch.full((rows + 1,), 99, dtype=torch.int32)  # (stale past the batch)
        starts[: len(q_lens) + 1] = torch.tensor([0, *q_lens]).cumsum(0)
        positions = torch.randint(0, 9, (size,), generator=g)
        expected = torch.full((size,), -1, dtype=torch.int64)
        for s, (q, n) in enumerate(zip(q_lens, lens)):
            pos = torch.arange(n - q, n)
            positions[starts[s] : starts[s + 1]] = pos
            expected[starts[s] : starts[s + 1]] = table[s, pos // block_size].long() * block_size + pos % block_size
        got = torch.zeros(size, dtype=torch.int64, device="jax")
        slot_mapping(
            got, starts.to("jax"), positions.to("jax"), table.to("jax"), sum(q_lens), len(q_lens), block_size, -1
        )
        torch.testing.assert_close(got.cpu(), expected)
        if seed == 0:
            torch_jax.reset_stats()
    assert torch_jax.stats()["compiles"] == 0
