"""Paged attention for LLM serving: the KV-cache write and ragged paged attention as JAX
ops (NOTE [JAX functions as operators]), in vLLM's layout.

The cache of one layer is ``[num_blocks, Hkv, block_size, 2 * D]``: vLLM's (0.33) logical
per-layer shape, a token's key then its value in the last axis (NOTE [The KV cache on
jax] in vllm/_attention.py). Token ``t``'s slot is ``block * block_size + offset``. A
batch is ragged: sequence ``s`` owns query tokens ``query_start_loc[s]:query_start_loc[s
+ 1]``, the last positions of its ``seq_lens[s]``, so prefill, a continued chunked
prefill and decode share one call. Importing the module registers
``torch.ops.torch_jax.paged_kv_cache_update`` and ``torch.ops.torch_jax.ragged_paged_attention``.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core
from jax.interpreters import mlir

from torch_jax._config import config
from torch_jax.ffi import _build
from torch_jax.kernels._jax_op import jax_op


def _kv_cache_update(key, value, kv_cache, slot_mapping):
    """The cache with each token's key and value in its slot; a negative slot (vLLM's
    PAD_SLOT_ID, a padding token) writes nothing."""
    blocks, _, block_size, _ = kv_cache.shape
    block = jnp.where(slot_mapping >= 0, slot_mapping // block_size, blocks)  # (out of bounds: dropped)
    new = jnp.concatenate([key, value], axis=-1).astype(kv_cache.dtype)  # (T, Hkv, 2D)
    return kv_cache.at[block, :, slot_mapping % block_size].set(new, mode="drop")


# NOTE [Paged attention in jnp]: each query token finds its sequence (a search in
# query_start_loc) and its position. Its keys are of two kinds, each a loop with one
# online softmax carried through both, so a step holds a tile of scores, never a token's
# whole context or the whole cache:
#
# - the keys of the batch's own tokens (the step's new tokens, written into the cache
#   before attention): a sequence's new tokens are consecutive in the batch, so the
#   queries go in tiles of consecutive tokens, and step i pairs each query tile with the
#   key tile i tiles before it (shifted, not gathered), masked to the query's own
#   sequence and causal order; as many steps as the longest query spans tiles. A prefill
#   reads its keys once a tile, not once a token.
# - the keys cached before the step (a prefix, an earlier chunk, a decode's context):
#   step i gathers, for every token at once, the i-th cache block of its window; as many
#   steps as the longest cached window has blocks (none for a batch of fresh prefills).
#
# Both bounds are read from the arguments at run time, so the op compiles once per shape
# of its arguments whatever the lengths. This body is ``attention_p``'s default lowering;
# the CPU has a C++ kernel of its own (NOTE [Paged attention on XLA:CPU]), and a Pallas
# kernel for GPU or TPU would be another platform's lowering of the same primitive. JAX's
# TPU kernel (jax.experimental.pallas.ops.tpu.ragged_paged_attention) takes these same
# arguments, with keys and values interleaved by head in one page array.

_TILE = 32  # (queries and keys of the batch's own tokens in a tile: at most this many, a power of two)


def _online_softmax(carry, s, v, seen, soft_cap):
    """One step of the online softmax: scores ``s`` (..., K) against values ``v`` (..., K,
    D), ``seen`` the keys the query attends to (a mask broadcast to ``s``)."""
    m, total, acc = carry  # running max, softmax denominator: (...); (..., D)
    if soft_cap > 0:
        s = soft_cap * jnp.tanh(s / soft_cap)
    s = jnp.where(seen, s, -jnp.inf)
    m_new = jnp.maximum(m, s.max(-1))
    m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # (no key seen yet: exp(-inf) = 0, not nan)
    p = jnp.exp(s - m_safe[..., None])
    alpha = jnp.exp(m - m_safe)
    total = total * alpha + p.sum(-1)
    acc = acc * alpha[..., None] + jnp.einsum("...k,...kd->...d", p, v, precision=lax.Precision.HIGHEST)
    return m_new, total, acc


def _ragged_paged_attention(
    query, kv_cache, query_start_loc, seq_lens, block_table, scale, sliding_window=-1, soft_cap=0.0, num_seqs=-1
):
    """Causal attention of each query token to its sequence's keys and values in the cache
    (the batch's own tokens' written there first), computed in float32; padding tokens'
    rows are zeros. ``num_seqs`` (an int or a traced one; -1: all): the batch's sequences,
    the first rows of the metadata, whose rows past them are ignored, so that the metadata
    may be buffers of a fixed size and one computation serve every batch size. A float32
    cache goes through ``attention_p`` (NOTE [Paged attention on XLA:CPU]), any other
    through the jnp version."""
    (_, q_heads, dim), (_, kv_heads, _, width) = query.shape, kv_cache.shape
    if width != 2 * dim or kv_heads == 0 or q_heads % kv_heads:
        raise ValueError(
            f"ragged_paged_attention: a cache of shape {tuple(kv_cache.shape)} (blocks, key/value heads, block size, "
            f"2 x head size) does not fit queries of shape {tuple(query.shape)} (tokens, heads, head size)"
        )
    n_seqs = block_table.shape[0]
    if isinstance(num_seqs, int) and num_seqs < 0:
        num_seqs = n_seqs
    ints = [x.astype(jnp.int32) for x in (query_start_loc[: n_seqs + 1], seq_lens[:n_seqs], block_table)]
    num_seqs = jnp.clip(jnp.asarray(num_seqs).astype(jnp.int32), 0, n_seqs)
    params = dict(scale=float(scale), sliding_window=int(sliding_window), soft_cap=float(soft_cap))
    if kv_cache.dtype != jnp.float32 or ints[0].shape[0] < n_seqs + 1 or ints[1].shape[0] < n_seqs:
        return _attention_jnp(query, kv_cache, *ints, num_seqs, **params)
    out = attention_p.bind(query.astype(jnp.float32), kv_cache, *ints, num_seqs, **params)
    return out.astype(query.dtype)


def _attention_jnp(
    query, kv_cache, query_start_loc, seq_lens, block_table, num_seqs, *, scale, sliding_window, soft_cap
):
    """``_ragged_paged_attention`` in jnp (NOTE [Paged attention in jnp]), ``num_seqs`` an
    int32 scalar array."""
    tokens, q_heads, dim = query.shape
    _, kv_heads, block_size, _ = kv_cache.shape
    group = q_heads // kv_heads
    n_seqs, table_width = block_table.shape
    starts = query_start_loc.astype(jnp.int32)[: n_seqs + 1]
    seq_lens = seq_lens[:n_seqs].astype(jnp.int32)
    row = jnp.arange(n_seqs + 1, dtype=jnp.int32)  # (the rows past the batch: empty sequences)
    starts = jnp.where(row <= num_seqs, starts, starts[num_seqs])
    seq_lens = jnp.where(row[:n_seqs] < num_seqs, seq_lens, 0)
    table = block_table.astype(jnp.int32)
    t = jnp.arange(tokens, dtype=jnp.int32)
    seq = jnp.minimum(jnp.searchsorted(starts[1:], t, side="right"), n_seqs - 1)  # (T,)
    real = t < starts[n_seqs]
    q_len = starts[seq + 1] - starts[seq]  # (T,) its sequence's tokens in the batch
    last = jnp.where(real, seq_lens[seq] - (starts[seq + 1] - t), -1)  # (T,) the token's own position
    cached = jnp.where(real, seq_lens[seq] - q_len, 0)  # (T,) its sequence's positions cached before the step
    first = jnp.maximum(last - sliding_window + 1, 0) if sliding_window > 0 else jnp.zeros_like(last)
    q = query.astype(jnp.float32).reshape(tokens, kv_heads, group, dim) * scale  # (T, Hkv, G, D)

    # the batch's own tokens, in tiles (their keys and values from their slots in the cache)
    tile = math.gcd(tokens, _TILE)  # (the largest power of two up to _TILE that divides the tokens)
    tiles = tokens // tile
    own_pos = jnp.maximum(last, 0)
    own_block = table[seq, jnp.minimum(own_pos // block_size, table_width - 1)]
    own = kv_cache[own_block, :, own_pos % block_size].astype(jnp.float32)  # (T, Hkv, 2D)
    own_seq = jnp.where(real, seq, -1)

    def shifted(x, i, fill):  # x's tiles moved i tiles later (the first i: ``fill``)
        x = x.reshape(tiles, tile, *x.shape[1:])
        padded = jnp.concatenate([jnp.full_like(x, fill), x])
        return lax.dynamic_slice_in_dim(padded, tiles - i, tiles)

    q_tiles = q.reshape(tiles, tile, kv_heads, group, dim)
    q_seq, q_t = own_seq.reshape(tiles, tile), t.reshape(tiles, tile)
    q_first = first.reshape(tiles, tile)

    def own_step(i, carry):
        kv = shifted(own, i, 0.0)  # (tiles, tile, Hkv, 2D)
        k_seq, k_t, k_pos = shifted(own_seq, i, -2), shifted(t, i, -1), shifted(last, i, -1)
        seen = (
            (q_seq[:, :, None] == k_seq[:, None, :])
            & (k_t[:, None, :] <= q_t[:, :, None])
            & (k_pos[:, None, :] >= q_first[:, :, None])
            & (q_seq[:, :, None] >= 0)
        )  # (tiles, tile, tile)
        s = jnp.einsum("nqhgd,nkhd->nqhgk", q_tiles, kv[..., :dim], precision=lax.Precision.HIGHEST)
        v = jnp.where((k_seq >= 0)[..., None, None], kv[..., dim:], 0)  # (padding tokens' slots: never written)
        v = jnp.moveaxis(v, 1, 2)[:, None, :, None]  # (tiles, 1, Hkv, 1, tile, D)
        return _online_softmax(carry, s, v, seen[:, :, None, None, :], soft_cap)

    longest = jnp.max(jnp.where(real, q_len, 0))
    own_steps = jnp.where(longest > 0, (longest - 1 + tile - 1) // tile + 1, 0)
    carry = (
        jnp.full((tiles, tile, kv_heads, group), -jnp.inf, jnp.float32),
        jnp.zeros((tiles, tile, kv_heads, group), jnp.float32),
        jnp.zeros((tiles, tile, kv_heads, group, dim), jnp.float32),
    )
    carry = lax.fori_loop(0, own_steps, own_step, carry)
    carry = tuple(c.reshape(tokens, *c.shape[2:]) for c in carry)

    # the keys cached before the step, a block a step
    first_block = first // block_size
    steps = jnp.max(jnp.where(cached > first, (cached - 1) // block_size - first_block + 1, 0))
    offsets = jnp.arange(block_size, dtype=jnp.int32)

    def cached_step(i, carry):
        b = first_block + i  # (T,)
        block = table[seq, jnp.minimum(b, table_width - 1)]  # (T,)
        pos = b[:, None] * block_size + offsets  # (T, BS)
        seen = (pos >= first[:, None]) & (pos < cached[:, None])  # (T, BS)
        # (keys and values gathered apart: each gather writes a contiguous array, where slices
        # of one gathered block were copies of their own, a third of the op's time)
        k = kv_cache[block, :, :, :dim].astype(jnp.float32)  # (T, Hkv, BS, D)
        v = kv_cache[block, :, :, dim:].astype(jnp.float32)
        v = jnp.where(seen[:, None, :, None], v, 0)  # (never-written slots)
        s = jnp.einsum("thgd,thbd->thgb", q, k, precision=lax.Precision.HIGHEST)  # (T, Hkv, G, BS)
        return _online_softmax(carry, s, v[:, :, None], seen[:, None, None, :], soft_cap)

    _, total, acc = lax.fori_loop(0, steps, cached_step, carry)
    out = acc / jnp.where(total > 0, total, 1.0)[..., None]  # (padding tokens: acc is 0)
    return out.reshape(tokens, q_heads, dim).astype(query.dtype)


# NOTE [Paged attention on XLA:CPU]: on the CPU the jnp version spends its time moving
# data, not computing: each loop step's gather writes the step's key and value blocks out
# before YNNPACK's batched dots read them back, and the dots are tiny (one decode token's
# handful of query heads against a block). Measured in vLLM's decode step (64 sequences of
# ~100 positions, 4 query and 2 key/value heads of 64, a 2-core Xeon): 1.5-2.1 ms a layer,
# where reading the layer's cached keys and values once would take ~0.4 ms at this
# machine's copy speed. So on XLA:CPU a float32 cache goes to an FFI handler
# (``csrc/paged_attention.cc``, built by ffi/_build as the other handlers are) that reads each
# key and value once, where it lies in the cache: a work item is up to 16 consecutive query
# tokens of one sequence and one key/value head, all of that head's query heads together,
# and XLA's intra-op threads share the items out. Scores are computed exactly (two passes:
# scores and their maximum, then the weights times the values), in float32 as the jnp
# version does; exp is a polynomial the compiler vectorizes (within 1 ulp). Other
# platforms, other cache dtypes, ``config.cpu_attention = False`` or a machine without a C++
# compiler keep the jnp version (``attention_p``'s default lowering);
# tests/test_paged_attention.py holds both to the float64 reference.
#
# Measured alone (jax.jit of the op, 4 query and 2 key/value heads of 64, blocks of 16,
# 2-core Xeon, best of 5 x 20 calls, two runs): 64 decode tokens of ~100 positions 0.35-0.39
# ms against jnp's 1.96-2.06 (the kernel reads the 6.5 MB of keys and values at ~17 GB/s,
# about this machine's copy speed); 8 prefills of 64 tokens 0.41-0.43 against 1.83-1.96;
# 32 decodes and 2 prefills 0.26-0.30 against 4.0-4.4. Accuracy, on 60 random batches
# (GQA, windows, soft caps, block sizes 1-16): the largest error against float64 is on
# average 0.99x that of the same attention in PyTorch's float32 (jnp's: 1.05x), at most
# 2.0x (as jnp's, on the same batch).

_KERNEL = _build.CSRC / "paged_attention.cc"
_TARGET = "tj_paged_attention_f32"
_handlers = _build.Handlers(
    lambda: _build.build(_KERNEL, [_TARGET], flags=("-O3", "-fopenmp-simd", "-fno-math-errno")),
    "paged attention on the CPU runs in jnp",
)

attention_p = core.Primitive("torch_jax_ragged_paged_attention")
attention_p.def_abstract_eval(lambda query, *_, **__: jax.core.ShapedArray(query.shape, query.dtype))
attention_p.def_impl(lambda *args, **params: jax.jit(functools.partial(_attention_jnp, **params))(*args))
_jnp_lowering = mlir.lower_fun(_attention_jnp, multiple_results=False)
mlir.register_lowering(attention_p, _jnp_lowering)


def _cpu_lowering(ctx, *args, scale, sliding_window, soft_cap):
    if not (config.cpu_attention and _handlers.load()):
        return _jnp_lowering(ctx, *args, scale=scale, sliding_window=sliding_window, soft_cap=soft_cap)
    return jax.ffi.ffi_lowering(_TARGET)(
        ctx, *args, scale=np.float32(scale), window=np.int32(sliding_window), soft_cap=np.float32(soft_cap)
    )


mlir.register_lowering(attention_p, _cpu_lowering, platform="cpu")


def _slot_mapping(slot_mapping, query_start_loc, positions, block_table, num_tokens, num_seqs, block_size, pad_id):
    """Each of the batch's first ``num_tokens`` tokens' cache slot, from its sequence's
    row of the block table and its position; ``pad_id`` past them. Whole buffers of a fixed
    size, the first ``num_seqs`` rows of the metadata the batch's (NOTE [Paged attention in
    jnp]: one computation for every batch)."""
    n = slot_mapping.shape[0]
    rows, width = block_table.shape
    row = jnp.arange(query_start_loc.shape[0], dtype=jnp.int32)
    ends = jnp.where(row <= num_seqs, query_start_loc.astype(jnp.int32), jnp.iinfo(jnp.int32).max)[1:]
    t = jnp.arange(n, dtype=jnp.int32)
    seq = jnp.minimum(jnp.searchsorted(ends, t, side="right"), rows - 1)
    pos = positions[:n].astype(jnp.int32)
    block = block_table[seq, jnp.clip(pos // block_size, 0, width - 1)].astype(slot_mapping.dtype)
    slots = block * block_size + pos % block_size
    return jnp.where(t < num_tokens, slots, pad_id).astype(slot_mapping.dtype)


paged_kv_cache_update = jax_op(
    "torch_jax::paged_kv_cache_update",
    _kv_cache_update,
    schema="(Tensor key, Tensor value, Tensor(a!) kv_cache, Tensor slot_mapping) -> ()",
)
ragged_paged_attention = jax_op(
    "torch_jax::ragged_paged_attention",
    _ragged_paged_attention,
    schema=(
        "(Tensor query, Tensor kv_cache, Tensor query_start_loc, Tensor seq_lens, Tensor block_table, "
        "float scale, int sliding_window=-1, float logits_soft_cap=0.0, Scalar num_seqs=-1) -> Tensor"
    ),
    autograd=False,
)
paged_slot_mapping = jax_op(
    "torch_jax::paged_slot_mapping",
    _slot_mapping,
    schema=(
        "(Tensor(a!) slot_mapping, Tensor query_start_loc, Tensor positions, Tensor block_table, Scalar num_tokens, "
        "Scalar num_seqs, int block_size, int pad_id) -> ()"
    ),
    autograd=False,
)
