"""vLLM's worker and model runner on ``jax`` (NOTE [vLLM on jax] in vllm/_platform.py):
vLLM's GPU ones, with what they do through CUDA done for the jax device."""

from __future__ import annotations

import contextlib
import gc
import os

import torch
from vllm.logger import init_logger
from vllm.platforms import current_platform
from vllm.utils.mem_utils import MemorySnapshot
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.gpu_worker import Worker, init_worker_distributed_environment, request_memory

logger = init_logger(__name__)


class JaxWorker(Worker):
    def init_device(self) -> None:
        """NOTE [The vLLM worker's device]: vLLM's GPU worker sets up only ``cuda``
        devices. Here the worker's device is ``jax:LOCAL_RANK`` (as ``cuda:LOCAL_RANK``),
        its process group the jax one (XLA collectives), created first, and the memory snapshot vLLM
        sizes the KV cache from is read through ``torch.accelerator`` as on CUDA. No
        CUDA allocator pools (vLLM's sleep mode), no cuBLAS handles to create first."""
        # (the process group first: JAX's distributed runtime starts with the device, from
        # the group's rendezvous, NOTE [The jax process group]; each process of the group
        # sees its host's devices, as a CUDA worker sees its GPUs, and uses its own)
        os.environ.setdefault("LOCAL_WORLD_SIZE", str(self.parallel_config.local_world_size))
        init_worker_distributed_environment(
            self.vllm_config, self.rank, self.distributed_init_method, self.local_rank, current_platform.dist_backend
        )
        self.device = torch.device(current_platform.device_type, self.local_rank)
        torch.accelerator.set_device_index(self.device)
        current_platform.check_if_supports_dtype(self.model_config.dtype)
        set_random_seed(self.model_config.seed)
        gc.collect()
        torch.accelerator.empty_cache()
        self.init_snapshot = MemorySnapshot(device=self.device)
        if self.cache_config.kv_cache_memory_bytes is not None:
            # (a KV cache of a given size, NOTE [vLLM's memory on XLA:CPU]: no share of the
            # device's memory is asked for, so none is checked against what is free)
            self.requested_memory = self.init_snapshot.free_memory
        else:
            self.requested_memory = request_memory(self.init_snapshot, self.cache_config, 0)
        self._init_workspace_and_model_runner()

    def _maybe_get_memory_pool_context(self, tag: str):
        return contextlib.nullcontext()  # (vLLM's CUDA memory pools for sleep mode: none on jax)

    def _compile_or_warm_up_model(self):
        """NOTE [vLLM's kernel warm-ups]: vLLM's GPU worker warms up CUDA, Triton and
        CuTe kernels (``kernel_warmup``: router GEMMs, FlashInfer autotuning, sparse
        attention kernels) between compiling the model and sampling once; none runs on
        jax, and some import CUDA-only Triton modules. The rest of the GPU worker's
        warm-up runs as it is, with that one step left out."""
        from vllm.v1.worker import gpu_worker

        warmup = gpu_worker.kernel_warmup
        gpu_worker.kernel_warmup = lambda worker, **kwargs: None
        try:
            return super()._compile_or_warm_up_model()
        finally:
            gpu_worker.kernel_warmup = warmup

    def _make_model_runner(self) -> GPUModelRunner:
        if self.use_v2_model_runner:
            raise NotImplementedError(
                "torch_jax: vLLM's V2 model runner is not supported on jax (VLLM_USE_V2_MODEL_RUNNER=0)"
            )
        return JaxModelRunner(self.vllm_config, self.device)

    def sleep(self, level: int = 1) -> None:
        raise NotImplementedError("torch_jax: vLLM's sleep mode is not supported on jax")

    def wake_up(self, tags: list[str] | None = None) -> None:
        raise NotImplementedError("torch_jax: vLLM's sleep mode is not supported on jax")


class JaxModelRunner(GPUModelRunner):
    def _to_list(self, sampled_token_ids: torch.Tensor) -> list[list[int]]:
        """NOTE [Sampled tokens to the host]: vLLM's GPU runner copies the sampled ids
        into pinned host memory and waits on a CUDA event, so as not to sync the whole
        device; on jax a copy to the host waits for exactly that array."""
        return sampled_token_ids.tolist()
