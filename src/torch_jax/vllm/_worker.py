"""vLLM's worker and model runner on ``jax`` (NOTE [vLLM on jax] in vllm/_platform.py):
vLLM's GPU ones, with what they do through CUDA done for the jax device."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
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
        # sees its host's devices, as a CUDA worker sees its GPUs, and uses its own; vLLM's
        # count of its workers on this host, not a value inherited from the environment: an
        # engine run in a parent process set that parent's)
        os.environ["LOCAL_WORLD_SIZE"] = str(self.parallel_config.local_world_size)
        init_worker_distributed_environment(
            self.vllm_config, self.rank, self.distributed_init_method, self.local_rank, current_platform.dist_backend
        )
        # NOTE [No shape buckets under vLLM]: torch_jax's buckets for tensors whose length
        # keeps changing (NOTE [Buckets] in runtime/_buckets) would put vLLM's persistent
        # input buffers, written through slices of changing lengths, into padded arrays,
        # and the step's computation, which reads them whole, would compile again for that
        # layout. vLLM's steps are padded to token buckets already (NOTE [Token buckets]).
        from torch_jax import config

        config.bucketing = "off"
        # (and each step's indexing ops check their indices with the step's graph, at the
        # next wait, as CUDA's device-side asserts: NOTE [vLLM's asynchronous scheduling on jax])
        config.deferred_checks = True
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

    def determine_available_memory(self) -> int:
        """A KV cache of a given size (NOTE [vLLM's memory on XLA:CPU]) needs no profile:
        vLLM's GPU worker still runs its profiling step then, to compile the model for its
        largest batch, which the warm-up of every bucket does here (NOTE [Token
        buckets])."""
        if self.cache_config.kv_cache_memory_bytes and self.model_config.multimodal_config is None:
            return self.cache_config.kv_cache_memory_bytes
        return super().determine_available_memory()

    def _compile_or_warm_up_model(self):
        """NOTE [vLLM's kernel warm-ups]: vLLM's GPU worker warms up CUDA, Triton and
        CuTe kernels (``kernel_warmup``: router GEMMs, FlashInfer autotuning, sparse
        attention kernels) between compiling the model and sampling once; none runs on
        jax, and some import CUDA-only Triton modules. The model's warm-up runs every
        token bucket instead (NOTE [Token buckets]); the rest of the GPU worker's warm-up
        (the sampler's) runs as it is."""
        from vllm.v1.worker import gpu_worker

        if not self.model_config.enforce_eager:
            self.model_runner.compile_buckets(progress=self.rank == 0)
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


@contextlib.contextmanager
def _cuda_streams_on_jax():
    """NOTE [vLLM's asynchronous scheduling on jax]: with asynchronous scheduling, vLLM's
    engine schedules step N+1 and its model runner prepares and dispatches it while the
    device computes step N. The GPU runner reaches CUDA for that directly: each step's
    sampled tokens go to the host with ``to("cpu", non_blocking=True)`` under
    ``torch.cuda.stream(...)`` on a side stream and a ``torch.cuda.Event`` recorded after
    them, which the engine waits on before reading the tokens; another event orders the
    reuse of the host input buffers. While the runner is made and while it runs a step,
    those ``torch.cuda`` names are the jax device's (``torch.jax``'s stream and events, as
    vLLM's XPU runner maps them to ``torch.xpu``'s), and restored after. The copies return
    at once (NOTE [Copies to the host without blocking] in device/_state) and the event's
    ``synchronize`` writes them; the side stream orders nothing, as jax has one queue a
    device (NOTE [One stream per device])."""

    names = _jax_cuda_names()
    saved = {name: getattr(torch.cuda, name) for name in names}
    # (set and restored by hand: unittest.mock.patch.multiple took 43 us a step's call)
    for name, value in names.items():
        setattr(torch.cuda, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(torch.cuda, name, value)


@functools.cache
def _jax_cuda_names() -> dict:
    """The jax device's stream and event names for ``torch.cuda``'s (NOTE [vLLM's
    asynchronous scheduling on jax])."""

    def here() -> torch.device:
        return torch.device(current_platform.device_type, torch.jax.current_device())

    def event(*args, enable_timing=False, blocking=False, interprocess=False, external=False):
        return torch.Event(device=here(), enable_timing=enable_timing, blocking=blocking)

    return {
        "Stream": lambda *args, **kwargs: torch.Stream(device=here()),
        "Event": event,
        "current_stream": torch.jax.current_stream,
        "default_stream": torch.jax.current_stream,
        "stream": torch.jax.stream,
        "set_stream": torch.jax.set_stream,
    }


class JaxModelRunner(GPUModelRunner):
    def __init__(self, *args, **kwargs):
        with _cuda_streams_on_jax():  # NOTE [vLLM's asynchronous scheduling on jax]
            super().__init__(*args, **kwargs)

    def execute_model(self, *args, **kwargs):
        with _cuda_streams_on_jax():
            return super().execute_model(*args, **kwargs)

    def sample_tokens(self, *args, **kwargs):
        with _cuda_streams_on_jax():
            return super().sample_tokens(*args, **kwargs)

    # NOTE [Token buckets]: each step's tokens are padded to the next of a few counts
    # (powers of two from 16 to the batch's limit, ``max_num_batched_tokens``), as vLLM pads
    # to its CUDA graphs' sizes: the model's computation is one per bucket (NOTE [vLLM's
    # step as one computation] in vllm/_attention.py), and every bucket is compiled at
    # start-up (``compile_buckets``, with a progress bar), so no step compiles. The
    # padding tokens write no cache slot (-1) and their results are not read.

    @functools.cached_property
    def buckets(self) -> list[int]:
        limit = self.scheduler_config.max_num_batched_tokens
        sizes, n = [], 16
        while n < limit:
            sizes.append(n)
            n *= 2
        return [*sizes, limit]

    def bucket(self, num_tokens: int) -> int:
        return next((b for b in self.buckets if b >= num_tokens), num_tokens)

    def _determine_batch_execution_and_padding(self, num_tokens: int, *args, **kwargs):
        mode, descriptor, *rest = super()._determine_batch_execution_and_padding(num_tokens, *args, **kwargs)
        if not self.model_config.enforce_eager and self.parallel_config.data_parallel_size == 1:
            descriptor = dataclasses.replace(descriptor, num_tokens=self.bucket(descriptor.num_tokens))
        return (mode, descriptor, *rest)

    def _dummy_run(self, num_tokens: int, *args, **kwargs):
        # (attention metadata for every warm-up step, so that it runs the step's computation,
        # which reads it: vLLM builds it only for its CUDA graphs' capture)
        if not kwargs.get("is_profile") and hasattr(self, "kv_cache_config"):
            kwargs["force_attention"] = True
        return super()._dummy_run(num_tokens, *args, **kwargs)

    def compile_buckets(self, progress: bool = True) -> None:
        """Runs the model once for every token bucket (NOTE [Token buckets]): each compiles,
        or loads from the persistent compilation cache."""
        from tqdm import tqdm

        from torch_jax.runtime import _recompiles

        # (each bucket's step compiles its eager ops for the bucket's size too: chosen sizes,
        # not shapes that keep changing, NOTE [Shapes that keep changing])
        with _recompiles.planned():
            for size in tqdm(self.buckets, desc="torch_jax: compiling the model's token buckets", disable=not progress):
                self._dummy_run(size, skip_eplb=True, remove_lora=False)
            torch.accelerator.synchronize()

    def initialize_kv_cache_tensors(self, kv_cache_config, kernel_block_sizes, kv_cache_allocation_context=None):
        """NOTE [A storage a layer]: vLLM makes the KV cache of every layer a view of one
        buffer. On jax a storage is one array, so writing a layer's cache through such a
        view makes a new array of the whole buffer. Here each layer's view is made as a
        tensor of its own, with the view's shape, strides and dtype (layers whose views
        are the same bytes share one), so a layer's write replaces its own array, in place
        once donated. Groups of layers that vLLM overlays in one buffer take a buffer each."""
        from vllm.v1.worker import gpu_model_runner

        allocate = gpu_model_runner.allocate_kv_cache

        def per_layer(config, device, layout, sizes=None):
            views = allocate(config, torch.device("meta"), layout, sizes)
            made, caches = {}, {}
            for name, view in views.items():
                where = (view.storage_offset(), tuple(view.shape), tuple(view.stride()), view.dtype)
                if where not in made:
                    made[where] = torch.empty_strided(
                        view.shape, view.stride(), dtype=view.dtype, device=device
                    ).zero_()
                caches[name] = made[where]
            return caches

        gpu_model_runner.allocate_kv_cache = per_layer
        try:
            return super().initialize_kv_cache_tensors(kv_cache_config, kernel_block_sizes, kv_cache_allocation_context)
        finally:
            gpu_model_runner.allocate_kv_cache = allocate

    def _to_list(self, sampled_token_ids: torch.Tensor) -> list[list[int]]:
        """NOTE [Sampled tokens to the host]: vLLM's GPU runner copies the sampled ids
        into pinned host memory and waits on a CUDA event, so as not to sync the whole
        device; on jax a copy to the host waits for exactly that array."""
        return sampled_token_ids.tolist()
