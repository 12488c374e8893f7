"""vLLM's attention backend on ``jax``: the KV-cache write and ragged paged attention as
JAX ops (NOTE [Paged attention in jnp] in kernels/_paged.py).

NOTE [The KV cache on jax]: vLLM (0.33) allocates each layer's cache as a view of one
int8 buffer, logically ``[num_blocks, num_kv_heads, block_size, 2 * head_size]`` (a
token's key, then its value, in the last axis), laid out as the backend prefers. This
backend takes vLLM's identity layout (LBHNC): each layer's cache is then one contiguous
slice of the buffer, the layout the ops read. On jax each layer's cache is a storage of
its own instead (NOTE [A storage a layer] in vllm/_worker.py), so writing one layer's cache
replaces one array, in place where it is donated.

NOTE [vLLM's step as one computation]: vLLM's graph of the model (one piece: the platform
does not split it at attention) holds attention and the cache write as vLLM's custom ops,
``vllm.unified_kv_cache_update`` and ``vllm.unified_attention_with_output``, which take a
layer's name and find the layer's cache and the step's metadata in vLLM's forward
context. Both are context ops of torch_jax's compiled graphs (NOTE [Ops that read their
context] in compile/_graph): at each call of the graph, the cache of each layer, the slot
mapping and the metadata are gathered from the forward context as inputs of the one XLA
computation, which writes the caches (donated, so in place) with the rest of the step.
The metadata has a fixed size (NOTE [Metadata of a fixed size]), so the computation is
one per padded token count (NOTE [Token buckets] in vllm/_worker.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import jax.numpy as jnp
import torch
import vllm.model_executor.layers.attention.attention  # noqa: F401 (registers vLLM's attention ops)
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
)
from vllm.v1.kv_cache_layout import KVCacheLayout

from torch_jax.compile._graph import CONTEXT_OPS, ContextLowering
from torch_jax.kernels import _paged


class JaxAttentionBackend(AttentionBackend):
    forward_includes_kv_cache_update: bool = False  # (vLLM calls do_kv_cache_update first)
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list] = ["auto", "float16", "bfloat16"]

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_impl_cls() -> type[JaxAttentionImpl]:
        return JaxAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[JaxAttentionMetadataBuilder]:
        return JaxAttentionMetadataBuilder

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return []  # (any)

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER

    @classmethod
    def supported_kv_cache_layouts(cls) -> tuple[KVCacheLayout, ...]:
        return (KVCacheLayout.LBHNC,)  # NOTE [The KV cache on jax]


# NOTE [Metadata of a fixed size]: vLLM's metadata tensors are the first rows of its
# runner's buffers, as many as the batch has requests, so their shapes change from step to
# step, and each shape would be a computation of its own. The backend passes the whole
# buffers instead (views of them up to ``max_num_seqs`` rows) with the number of requests,
# a run-time value: the attention reads only the batch's rows, whatever the rest holds.


@dataclass
class JaxAttentionMetadata:
    num_actual_tokens: int  # (the batch's tokens; the step's inputs may be padded past them)
    max_query_len: int
    max_seq_len: int
    num_reqs: int
    query_start_loc: torch.Tensor  # [max_num_seqs + 1] int32, the first num_reqs + 1 the batch's
    seq_lens: torch.Tensor  # [max_num_seqs] int32: each request's context, its new tokens included
    block_table: torch.Tensor  # [max_num_seqs, max_blocks] int32
    slot_mapping: torch.Tensor  # [num_tokens] int64, -1 for padding


def _rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """``t``, the first rows of a buffer, as its first ``rows`` rows (NOTE [Metadata of a
    fixed size]); ``t`` itself where the buffer is shorter."""
    have = (t.untyped_storage().nbytes() // t.element_size() - t.storage_offset()) // max(t.stride(0), 1)
    if t.shape[0] == rows or have < rows or not t.is_contiguous():
        return t
    return t.as_strided((rows, *t.shape[1:]), t.stride(), t.storage_offset())


class JaxAttentionMetadataBuilder(AttentionMetadataBuilder[JaxAttentionMetadata]):
    def __init__(self, kv_cache_spec, layer_names, vllm_config, device) -> None:  # (vLLM's is abstract)
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.rows = vllm_config.scheduler_config.max_num_seqs

    def build(
        self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata, fast_build: bool = False
    ) -> JaxAttentionMetadata:
        m = common_attn_metadata
        return JaxAttentionMetadata(
            num_actual_tokens=m.num_actual_tokens,
            max_query_len=m.max_query_len,
            max_seq_len=m.max_seq_len,
            num_reqs=m.num_reqs,
            query_start_loc=_rows(m.query_start_loc, self.rows + 1),
            seq_lens=_rows(m.seq_lens, self.rows),
            block_table=_rows(m.block_table_tensor, self.rows),
            slot_mapping=m.slot_mapping,
        )


class JaxAttentionImpl(AttentionImpl):
    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        alibi_slopes: list[float] | None,
        sliding_window: int | None,
        kv_cache_dtype: str,
        logits_soft_cap: float | None = None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: str | None = None,
        sinks: torch.Tensor | None = None,
    ) -> None:
        if alibi_slopes is not None or sinks is not None:
            raise NotImplementedError("torch_jax: ALiBi slopes and attention sinks are not supported on jax yet")
        if attn_type != AttentionType.DECODER:
            raise NotImplementedError(f"torch_jax: {attn_type} attention is not supported on jax yet")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.sliding_window = -1 if sliding_window is None else int(sliding_window)
        self.logits_soft_cap = float(logits_soft_cap or 0.0)
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.attn_type = attn_type

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping) -> None:
        n = slot_mapping.shape[0]
        torch.ops.torch_jax.paged_kv_cache_update(key[:n], value[:n], kv_cache, slot_mapping)

    def forward(
        self,
        layer,
        query,
        key,
        value,
        kv_cache,
        attn_metadata: JaxAttentionMetadata | None,
        output,
        output_scale=None,
        output_block_scale=None,
    ):
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("torch_jax: fused output quantization is not supported on jax")
        if attn_metadata is None:  # (vLLM's profiling run)
            return output.fill_(0)
        m = attn_metadata
        out = torch.ops.torch_jax.ragged_paged_attention(
            query,
            kv_cache,
            m.query_start_loc,
            m.seq_lens,
            m.block_table,
            self.scale,
            self.sliding_window,
            self.logits_soft_cap,
            m.num_reqs,
        )
        output.copy_(out.view(output.shape))
        return output


# ------------------------------------------------ the step as one computation


def _layer(layer_name):
    from vllm.forward_context import get_forward_context

    name = getattr(layer_name, "value", layer_name)  # (vLLM's LayerName, or a str)
    return name, get_forward_context().no_compile_layers[name]


def _metadata(name: str):
    from vllm.forward_context import get_forward_context

    metadata = get_forward_context().attn_metadata
    if isinstance(metadata, list):  # (speculative decoding's: the base model's first)
        metadata = metadata[0]
    return metadata.get(name) if isinstance(metadata, dict) else metadata


def _gather_cache_update(arguments: dict):
    """The layer's cache and the step's slot mapping (NOTE [vLLM's step as one computation]);
    None (the call runs op by op) where the step has no slot mapping: vLLM's profiling run."""
    if arguments.get("layer_name") is None:
        return None
    from vllm.forward_context import get_forward_context

    name, layer = _layer(arguments["layer_name"])
    slots = get_forward_context().slot_mapping
    slots = slots.get(name) if isinstance(slots, dict) else None
    if slots is None or not isinstance(layer.impl, JaxAttentionImpl) or layer.kv_cache.dim() != 4:
        return None
    return [layer.kv_cache, slots]


def _lower_cache_update(arguments: dict, gathered: list):
    kv_cache, slots = gathered
    key, value = arguments["key"], arguments["value"]
    n = slots.shape[0]
    new = _paged._kv_cache_update(key[:n], value[:n], kv_cache, slots)
    return jnp.zeros((0,), key.dtype), {0: new}  # (vLLM's op returns an empty tensor: an ordering token)


def _gather_attention(arguments: dict):
    """The layer's cache and the step's metadata (NOTE [vLLM's step as one computation]);
    None (the call runs op by op) where the step has none: vLLM's profiling run."""
    if arguments.get("layer_name") is None or arguments.get("output_scale") is not None:
        return None
    name, layer = _layer(arguments["layer_name"])
    m = _metadata(name)
    if not isinstance(m, JaxAttentionMetadata) or layer.kv_cache.dim() != 4:
        return None
    return [layer.kv_cache, m.query_start_loc, m.seq_lens, m.block_table, m.num_reqs]


def _lower_attention(arguments: dict, gathered: list):
    kv_cache, starts, seq_lens, table, num_reqs = gathered
    _, layer = _layer(arguments["layer_name"])
    impl, query, output = layer.impl, arguments["query"], arguments["output"]
    out = _paged._ragged_paged_attention(
        query, kv_cache, starts, seq_lens, table, impl.scale, impl.sliding_window, impl.logits_soft_cap, num_reqs
    )
    return {"output": out.reshape(output.shape).astype(output.dtype)}, {}


def _register_context_ops() -> None:
    ops = torch.ops.vllm
    CONTEXT_OPS[ops.unified_kv_cache_update.default] = ContextLowering(
        _gather_cache_update, _lower_cache_update, writes=(0,)
    )
    CONTEXT_OPS[ops.unified_attention_with_output.default] = ContextLowering(_gather_attention, _lower_attention)


_register_context_ops()
