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

import jax.numpy as jnp
from jax import lax

from torch_jax.kernels._jax_op import jax_op


def _kv_cache_update(key, value, kv_cache, slot_mapping):
    """The cache with each token's key and value in its slot; a negative slot (vLLM's
    PAD_SLOT_ID, a padding token) writes nothing."""
    blocks, _, block_size, _ = kv_cache.shape
    block = jnp.where(slot_mapping >= 0, slot_mapping // block_size, blocks)  # (out of bounds: dropped)
    new = jnp.concatenate([key, value], axis=-1).astype(kv_cache.dtype)  # (T, Hkv, 2D)
    return kv_cache.at[block, :, slot_mapping % block_size].set(new, mode="drop")


# NOTE [Paged attention in jnp]: each query token finds its sequence (a search in
# query_start_loc) and its position, then walks the cache blocks it attends to, one per
# step of a loop with an online softmax: step i gathers, for every token at once, the
# i-th block of its window, so a step holds (T, Hq, block_size) scores, never a token's
# whole context or the whole cache. The loop runs as many steps as the longest window
# has blocks, a bound read from the arguments at run time, so the op compiles once per
# shape of its arguments whatever the lengths. The tokens of one sequence each gather
# its blocks (a prefill of T tokens reads its context T times), which a kernel would
# not: ``_ragged_paged_attention`` is the place for a Pallas kernel on GPU or TPU
# (lax.platform_dependent, this body as the default). JAX's TPU kernel
# (jax.experimental.pallas.ops.tpu.ragged_paged_attention) takes these same arguments,
# with keys and values interleaved by head in one page array.


def _ragged_paged_attention(
    query, kv_cache, query_start_loc, seq_lens, block_table, scale, sliding_window=-1, soft_cap=0.0
):
    """Causal attention of each query token to its sequence's cached keys and values,
    computed in float32 (NOTE [Paged attention in jnp]); padding tokens' rows are zeros."""
    tokens, q_heads, dim = query.shape
    _, kv_heads, block_size, _ = kv_cache.shape
    group = q_heads // kv_heads
    n_seqs, table_width = block_table.shape
    starts = query_start_loc.astype(jnp.int32)
    t = jnp.arange(tokens, dtype=jnp.int32)
    seq = jnp.minimum(jnp.searchsorted(starts[1:], t, side="right"), n_seqs - 1)  # (T,)
    last = seq_lens.astype(jnp.int32)[seq] - (starts[seq + 1] - t)  # (T,) the token's own position
    last = jnp.where(t < starts[n_seqs], last, -1)  # (padding tokens attend to nothing)
    first = jnp.maximum(last - sliding_window + 1, 0) if sliding_window > 0 else jnp.zeros_like(last)
    first_block = first // block_size
    steps = jnp.max(last // block_size - first_block + 1)
    table = block_table.astype(jnp.int32)
    q = query.astype(jnp.float32).reshape(tokens, kv_heads, group, dim) * scale  # (T, Hkv, G, D)
    offsets = jnp.arange(block_size, dtype=jnp.int32)

    def step(i, carry):
        m, total, acc = carry  # running max, softmax denominator: (T, Hkv, G); (T, Hkv, G, D)
        b = first_block + i  # (T,)
        block = table[seq, jnp.minimum(b, table_width - 1)]  # (T,)
        pos = b[:, None] * block_size + offsets  # (T, BS)
        seen = (pos >= first[:, None]) & (pos <= last[:, None])  # (T, BS)
        kv = kv_cache[block].astype(jnp.float32)  # (T, Hkv, BS, 2D)
        k = kv[..., :dim]
        v = jnp.where(seen[:, None, :, None], kv[..., dim:], 0)  # (never-written slots)
        s = jnp.einsum("thgd,thbd->thgb", q, k, precision=lax.Precision.HIGHEST)  # (T, Hkv, G, BS)
        if soft_cap > 0:
            s = soft_cap * jnp.tanh(s / soft_cap)
        s = jnp.where(seen[:, None, None, :], s, -jnp.inf)
        m_new = jnp.maximum(m, s.max(-1))
        m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # (no key seen yet: exp(-inf) = 0, not nan)
        p = jnp.exp(s - m_safe[..., None])
        alpha = jnp.exp(m - m_safe)
        total = total * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + jnp.einsum("thgb,thbd->thgd", p, v, precision=lax.Precision.HIGHEST)
        return m_new, total, acc

    init = (
        jnp.full((tokens, kv_heads, group), -jnp.inf, jnp.float32),
        jnp.zeros((tokens, kv_heads, group), jnp.float32),
        jnp.zeros((tokens, kv_heads, group, dim), jnp.float32),
    )
    _, total, acc = lax.fori_loop(0, steps, step, init)
    out = acc / jnp.where(total > 0, total, 1.0)[..., None]  # (padding tokens: acc is 0)
    return out.reshape(tokens, q_heads, dim).astype(query.dtype)


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
        "float scale, int sliding_window=-1, float logits_soft_cap=0.0) -> Tensor"
    ),
    autograd=False,
)
