"""vLLM's attention backend on ``jax``: the KV-cache write and ragged paged attention as
JAX ops (NOTE [Paged attention in jnp] in kernels/_paged.py).

NOTE [The KV cache on jax]: vLLM (0.33) allocates each layer's cache as a view of one
int8 buffer, logically ``[num_blocks, num_kv_heads, block_size, 2 * head_size]`` (a
token's key, then its value, in the last axis), laid out as the backend prefers. This
backend takes vLLM's identity layout (LBHNC): each layer's cache is then one contiguous
slice of the buffer, the layout the ops read. (An eager write of it is a new array of the
whole buffer today: docs/serving.md.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
)
from vllm.v1.kv_cache_layout import KVCacheLayout

from torch_jax.kernels import _paged  # noqa: F401 (registers the ops)


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


@dataclass
class JaxAttentionMetadata:
    num_actual_tokens: int  # (the batch's tokens; the step's inputs may be padded past them)
    max_query_len: int
    max_seq_len: int
    query_start_loc: torch.Tensor  # [num_reqs + 1] int32
    seq_lens: torch.Tensor  # [num_reqs] int32: each request's context, its new tokens included
    block_table: torch.Tensor  # [num_reqs, max_blocks] int32
    slot_mapping: torch.Tensor  # [num_tokens] int64, -1 for padding


class JaxAttentionMetadataBuilder(AttentionMetadataBuilder[JaxAttentionMetadata]):
    def __init__(self, kv_cache_spec, layer_names, vllm_config, device) -> None:  # (vLLM's is abstract)
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)

    def build(
        self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata, fast_build: bool = False
    ) -> JaxAttentionMetadata:
        m = common_attn_metadata
        return JaxAttentionMetadata(
            num_actual_tokens=m.num_actual_tokens,
            max_query_len=m.max_query_len,
            max_seq_len=m.max_seq_len,
            query_start_loc=m.query_start_loc,
            seq_lens=m.seq_lens,
            block_table=m.block_table_tensor,
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
        )
        output.copy_(out.view(output.shape))
        return output
