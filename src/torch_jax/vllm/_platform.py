"""vLLM's platform for the ``jax`` device.

NOTE [vLLM on jax]: vLLM (0.33) runs on an out-of-tree platform through its plugin
interface: the platform class says what the device is and which worker, attention
backend and compiler vLLM uses on it; vLLM's engine, scheduler, model definitions and
sampler stay vLLM's. Its custom ops (RMSNorm, SiLU-and-mul, rotary embedding, GELU)
run their ``forward_native`` PyTorch paths on an out-of-tree platform, which run on jax
as any PyTorch code does. What differs from vLLM's GPU path, each with its own NOTE:

- the worker (vllm/_worker.py): the device is ``jax:LOCAL_RANK``, after the process
  group; no CUDA allocator pools or sleep mode; no CUDA kernel warm-ups;
- the model runner (vllm/_worker.py): the sampled tokens' copy to the host, which vLLM's
  GPU runner does through pinned memory and a CUDA event; a storage for each layer's KV
  cache; token counts padded to buckets, each compiled at start-up;
- the slot mapping, a Triton kernel in vLLM (``register_triton_kernel_overrides``);
- attention and the KV-cache write (vllm/_attention.py): ragged paged attention as
  JAX ops (kernels/_paged.py);
- the compiler of vLLM's graph (vllm/_compiler.py): torch_jax's backend, the graph
  whole, attention and the cache write included (NOTE [vLLM's step as one computation]
  in vllm/_attention.py);
- the configuration (``check_and_update_config``): no CUDA graphs or CUDA fusion
  passes; the KV cache's size on XLA:CPU; workers spawned;
- the CUDA streams and events of asynchronous scheduling (vllm/_worker.py, NOTE
  [vLLM's asynchronous scheduling on jax]).

Everything else is vLLM's own code, so a vLLM upgrade is a diff of these overrides.
"""

from __future__ import annotations

import dataclasses
import os

import torch
from vllm.logger import init_logger
from vllm.platforms.interface import Platform, PlatformEnum

logger = init_logger(__name__)

NAME = "jax"
COMPILER = "torch_jax.vllm._compiler.JaxCompiler"


class JaxPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name = NAME
    device_type = NAME
    dispatch_key = "PrivateUse1"
    dist_backend = NAME  # NOTE [The jax process group]
    simple_compile_backend = NAME  # (vLLM's torch.compile of small helper functions)

    @classmethod
    def get_compile_backend(cls) -> str:
        return COMPILER  # NOTE [vLLM's compilation on jax]

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None) -> str:
        if attn_selector_config.use_mla or attn_selector_config.use_sparse:
            raise NotImplementedError("torch_jax: vLLM's MLA and sparse attention are not supported on jax")
        if selected_backend is not None and getattr(selected_backend, "name", None) != "CUSTOM":
            logger.info("torch_jax: attention backend %s is not available on jax; using jax's", selected_backend)
        return "torch_jax.vllm._attention.JaxAttentionBackend"

    @classmethod
    def check_if_supports_dtype(cls, dtype: torch.dtype) -> None:
        pass  # (XLA computes in every floating dtype vLLM offers)

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return torch.jax.get_device_name(device_id)

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return torch.jax.get_device_properties(device_id).total_memory

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        torch.jax.set_device(device)

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        torch.jax.manual_seed_all(seed)

    @classmethod
    def get_device_uuid(cls, device_id: int = 0) -> str:
        properties = torch.jax.get_device_properties(device_id)
        return f"jax-{properties.platform}-{properties.index}"

    @classmethod
    def num_compute_units(cls, device_id: int = 0) -> int:
        return max(torch.jax.get_device_properties(device_id).multi_processor_count, 1)

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        # (host-to-device copies on jax go through the host's own memory: pinning buys
        # nothing, and vLLM's pinned buffers would ask jax's host allocator for it)
        return False

    def is_sleep_mode_available(self) -> bool:
        return False

    @classmethod
    def get_current_memory_usage(cls, device: torch.types.Device | None = None) -> float:
        return float(torch.jax.max_memory_allocated(device))

    @classmethod
    def opaque_attention_op(cls) -> bool:
        # (attention is a custom op in vLLM's graphs, run by the backend, as on CUDA)
        return True

    @classmethod
    def support_static_graph_mode(cls) -> bool:
        return False  # (no CUDA graphs: XLA's computations are the compiled graphs)

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        from vllm.config import CUDAGraphMode

        parallel = vllm_config.parallel_config
        if parallel.worker_cls == "auto":
            parallel.worker_cls = "torch_jax.vllm._worker.JaxWorker"
        if parallel.world_size > 1:
            # (a process that started JAX cannot fork workers that use it, as with CUDA,
            # for which vLLM spawns them too; the engine's process may have started it)
            os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        cache = vllm_config.cache_config
        if cache is not None and not cache.user_specified_block_size:
            cache.block_size = 16
        if cache is not None and cache.kv_cache_memory_bytes is None and _on_host():
            # NOTE [vLLM's memory on XLA:CPU]: vLLM sizes the KV cache as a share of the
            # device's memory (gpu_memory_utilization, 0.92 by default); on XLA:CPU the
            # device's memory is the host's, shared with every process on it. The cache gets
            # a fixed size there instead, 1 GiB or an eighth of the memory if less
            # (--kv-cache-memory sets it, as VLLM_CPU_KVCACHE_SPACE does on vLLM's CPU
            # platform). Compiled steps write the cache in place; an eager step
            # (enforce_eager) writes a layer's cache as a new array of it.
            from torch_jax.device._module import _host_memory

            cache.kv_cache_memory_bytes = min(1 << 30, _host_memory()[1] // 8)
            logger.info("torch_jax: KV cache of %.2f GiB on XLA:CPU", cache.kv_cache_memory_bytes / (1 << 30))
        compilation = vllm_config.compilation_config
        if compilation.backend in ("", "inductor"):  # NOTE [vLLM's compilation on jax]
            compilation.backend = COMPILER
        # (vLLM's fusion passes rewrite graphs into its CUDA kernels: quantization,
        # all-reduce with RMSNorm, rotary embedding with the cache write)
        passes = compilation.pass_config
        for field in dataclasses.fields(passes):
            if field.name.startswith(("fuse_", "enable_qk_norm")):
                setattr(passes, field.name, False)
        if compilation.splitting_ops is None:
            compilation.splitting_ops = []  # (the graph whole: NOTE [vLLM's step as one computation])
        compilation.cudagraph_mode = CUDAGraphMode.NONE
        compilation.cudagraph_capture_sizes = []
        compilation.max_cudagraph_capture_size = 0
        if compilation.compile_sizes is None:
            compilation.compile_sizes = []
        if parallel.enable_dbo:
            parallel.enable_dbo = False

    @classmethod
    def register_triton_kernel_overrides(cls) -> None:
        """NOTE [Slot mapping on jax]: vLLM computes each token's KV-cache slot from the
        block table with a Triton kernel; on jax it is the same arithmetic as one JAX op,
        ``torch_jax.paged_slot_mapping`` (``_compute_slot_mapping``, in the kernel's argument
        order): one dispatch a step, and one computation whatever the batch's size."""
        from vllm.triton_utils.dispatcher import register_kernels

        register_kernels({"vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel": _compute_slot_mapping})


def _on_host() -> bool:
    """Whether jax's device is XLA:CPU (told without starting JAX)."""
    from torch_jax.device import _host_memory

    return _host_memory.platform() == "cpu"


def _compute_slot_mapping(
    num_tokens,
    max_num_tokens,
    query_start_loc,
    positions,
    block_table,
    block_table_stride,
    slot_mapping,
    KV_CACHE_BLOCK_SIZE,
    TOTAL_CP_WORLD_SIZE=1,
    TOTAL_CP_RANK=0,
    CP_KV_CACHE_INTERLEAVE_SIZE=1,
    PAD_ID=-1,
    BLOCK_SIZE=1024,
) -> None:
    """vLLM's ``ComputeSlotMappingKernel.kernel`` (NOTE [Slot mapping on jax]): the slot of
    each of the batch's tokens, and ``PAD_ID`` past them, as one op on the runner's whole
    buffers (NOTE [Metadata of a fixed size] in vllm/_attention.py), compiled once."""
    if TOTAL_CP_WORLD_SIZE != 1:
        raise NotImplementedError("torch_jax: vLLM's context parallelism is not supported on jax")
    from torch_jax.vllm._attention import _rows

    num_reqs = query_start_loc.shape[0] - 1
    torch.ops.torch_jax.paged_slot_mapping(
        slot_mapping[:max_num_tokens],
        _rows(query_start_loc, block_table.shape[0] + 1),
        _rows(positions, max_num_tokens),
        block_table,
        num_tokens,
        num_reqs,
        KV_CACHE_BLOCK_SIZE,
        PAD_ID,
    )
