"""Every setting of torch_jax in one place.

Each field can be set by a ``TORCH_JAX_<NAME>`` environment variable before the
first use of the device, or changed at run time through ``torch_jax.config``.
"""

from __future__ import annotations

import dataclasses
import os

_FALLBACK_MODES = ("warn", "silent", "error")
_MODES = ("strict", "fused")
_BUCKETING = ("auto", "off", "force")


def _env_str(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = os.environ.get(f"TORCH_JAX_{name}", default).strip().lower()
    if value not in choices:
        raise ValueError(f"TORCH_JAX_{name}={value!r}: expected one of {', '.join(choices)}")
    return value


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(f"TORCH_JAX_{name}", "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"TORCH_JAX_{name}={raw!r}: expected an integer") from None


def cpuinfo(field: str) -> str | None:
    """The first CPU's ``field`` in Linux's ``/proc/cpuinfo`` (None elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _intel_cpu() -> bool:
    """Whether the CPU is Intel's: the default of ``cpu_blas`` (NOTE [Matrix products
    through PyTorch's BLAS] in ffi/_cpu_blas)."""
    return cpuinfo("vendor_id") == "GenuineIntel"


@dataclasses.dataclass
class Config:
    """Settings of the ``jax`` device.

    fallback: what happens when an aten op has no JAX lowering and runs on the CPU:
        ``warn`` (once per op), ``silent``, or ``error`` (raise NotImplementedError).
    launch_blocking: wait for every op to finish before returning, so that an error
        is raised by the op that caused it (like ``CUDA_LAUNCH_BLOCKING=1``).
    deferred_checks: strict mode's value checks (an index out of range) are read at the
        next wait (a copy to the host, ``synchronize``), as fused and compiled graphs'
        are and as CUDA's device-side asserts surface, instead of by the op, which then
        returns without waiting for its computation; off by default (PyTorch's CPU raises
        at the op); vLLM's worker turns it on (NOTE [Deferred value checks] in runtime/_fused).
    debug: 0 quiet; 1 logs fallbacks and compilations; 2 logs every op.
    mode: the executor; ``strict`` runs each op at once as a cached XLA computation,
        ``fused`` records ops and runs them as one computation when a value is needed
        (NOTE [Fused eager] in runtime/_fused).
    fused_max_ops: the size cap of a fused graph (it runs when it reaches this many ops).
    cache_size: how many compiled computations (strict ops' and fused graphs') are kept;
        the least recently used ones are dropped beyond it, and compile again if they
        come back (NOTE [Bounded compile cache] in runtime/_compile_cache).
    compile_cache_mb: the memory the compiled computations may hold, in MiB, estimated
        from what each compilation added to the process's resident memory; the cache
        also keeps the process under half of Linux's memory-mapping limit.
    bucketing: ``auto`` (the default): the ops that know buckets put a tensor whose length
        keeps growing (a KV cache) into arrays of a few sizes once calls with the same
        other sizes have taken 8 lengths, and host tensors uploaded with a changing length
        (variable-length batches) once 3 lengths (integer tensors) or 8 have come, so that
        a new length compiles nothing; ``off``; ``force``: at every call and upload they
        can (the tests' setting) (NOTE [Buckets] and NOTE [Padded rows] in runtime/_buckets).
    cpu_blas: on XLA:CPU, the 2-D float32/float64 matrix products of fused graphs call the
        BLAS PyTorch's CPU build ships (MKL) instead of XLA's dot; by default only on an
        Intel CPU, where MKL is the faster of the two (NOTE [Matrix products through
        PyTorch's BLAS] in ffi/_cpu_blas); read when a graph is compiled.
    cpu_attention: on XLA:CPU, ragged paged attention (vLLM's, ``torch.ops.torch_jax.
        ragged_paged_attention``) over a float32 cache runs as a C++ kernel that reads each
        cached key and value where it lies; 0 runs the jnp version that other platforms run
        (NOTE [Paged attention on XLA:CPU] in kernels/_paged); read when it is compiled.
    route_inductor: ``torch.compile`` with the default backend (Inductor) sends the graphs
        that hold jax tensors to the ``jax`` backend (NOTE [The default torch.compile on
        jax] in compile/_route); 0 leaves them to Inductor.
    compilation_cache: JAX's persistent compilation cache keeps what ``torch.compile``'s
        graphs (and the slower eager compilations) compiled, in
        ``$TORCH_JAX_CACHE_DIR/xla`` (else ``~/.cache/torch_jax/xla``), so the next process
        compiles nothing (NOTE [Persistent compilation cache] in compile/_cache); 0 turns it
        off; read when the device starts.
    census: count every aten op that runs on the device by where it runs (lowered,
        decomposed into other ops, a runtime kernel, a ``torch.compile`` graph, the CPU
        fallback) in ``torch_jax.stats()["op_census"]``; costs a Python call per op, so it is
        off by default (``torch-jax doctor`` turns it on); read when the device starts.
    """

    fallback: str = dataclasses.field(default_factory=lambda: _env_str("FALLBACK", "warn", _FALLBACK_MODES))
    launch_blocking: bool = dataclasses.field(default_factory=lambda: _env_int("LAUNCH_BLOCKING", 0) != 0)
    deferred_checks: bool = dataclasses.field(default_factory=lambda: _env_int("DEFERRED_CHECKS", 0) != 0)
    debug: int = dataclasses.field(default_factory=lambda: _env_int("DEBUG", 0))
    mode: str = dataclasses.field(default_factory=lambda: _env_str("MODE", "strict", _MODES))
    cache_size: int = dataclasses.field(default_factory=lambda: _env_int("CACHE_SIZE", 2048))
    compile_cache_mb: int = dataclasses.field(default_factory=lambda: _env_int("COMPILE_CACHE_MB", 512))
    fused_max_ops: int = dataclasses.field(default_factory=lambda: _env_int("FUSED_MAX_OPS", 2000))
    bucketing: str = dataclasses.field(default_factory=lambda: _env_str("BUCKETING", "auto", _BUCKETING))
    cpu_blas: bool = dataclasses.field(default_factory=lambda: _env_int("CPU_BLAS", int(_intel_cpu())) != 0)
    cpu_attention: bool = dataclasses.field(default_factory=lambda: _env_int("CPU_ATTENTION", 1) != 0)
    route_inductor: bool = dataclasses.field(default_factory=lambda: _env_int("ROUTE_INDUCTOR", 1) != 0)
    compilation_cache: bool = dataclasses.field(default_factory=lambda: _env_int("COMPILATION_CACHE", 1) != 0)
    census: bool = dataclasses.field(default_factory=lambda: _env_int("CENSUS", 0) != 0)

    def __setattr__(self, name: str, value) -> None:
        if name == "fallback" and value not in _FALLBACK_MODES:
            raise ValueError(f"config.fallback must be one of {_FALLBACK_MODES}, got {value!r}")
        if name == "bucketing" and value not in _BUCKETING:
            raise ValueError(f"config.bucketing must be one of {_BUCKETING}, got {value!r}")
        if name == "mode" and value not in _MODES:
            raise ValueError(f"config.mode must be one of {_MODES}, got {value!r}")
        if not hasattr(type(self), "__dataclass_fields__") or name not in type(self).__dataclass_fields__:
            raise AttributeError(f"torch_jax.config has no setting {name!r}")
        object.__setattr__(self, name, value)


config = Config()


# The environment variables torch_jax reads besides ``Config``'s (each ``TORCH_JAX_`` + a
# field's name in capitals): name -> what it does. The manual's settings page is made from
# these and ``Config``'s docstring (docs/_hooks.py), and a test checks that every
# ``TORCH_JAX_*`` variable the package reads is one or the other.
ENVIRONMENT = {
    "TORCH_JAX_CACHE_DIR": "where torch_jax keeps what it builds for later processes: the C++ FFI handlers "
    "(the BLAS call, paged attention, the fusion barrier), the persistent compilation cache (``xla/``) and "
    "the doctor's evidence database; default ``$XDG_CACHE_HOME/torch_jax`` or ``~/.cache/torch_jax``.",
    "TORCH_JAX_HOST_MEMORY": "``system``: on the CPU platform, leave glibc's malloc settings alone instead of "
    "keeping freed buffers for reuse (NOTE [Host memory of the CPU device] in device/_host_memory).",
    "TORCH_JAX_DIST_CHECK": "``0``: no comparison of the ranks' collectives before each one (NOTE [Mismatched "
    "collectives] in distributed/_backend).",
    "TORCH_JAX_VLLM": "``1``: vLLM uses the jax platform whatever hardware vLLM's own platforms find; ``0``: "
    "never; unset: only where none of vLLM's platforms finds its hardware (docs/serving.md).",
    "TORCH_JAX_EVIDENCE_DB": "the doctor's evidence database file; default ``evidence.sqlite`` in the cache "
    "directory (docs/doctor.md).",
    "TORCH_JAX_MODULES_SEED": "the seed of the ModuleInfo sweep's random sample inputs (``python -m "
    "torch_jax.report``; default 0).",
}


def cache_dir():
    """Where torch_jax keeps what it builds for later processes (a pathlib.Path):
    ``$TORCH_JAX_CACHE_DIR``, else ``$XDG_CACHE_HOME/torch_jax`` or ``~/.cache/torch_jax``."""
    from pathlib import Path

    explicit = os.environ.get("TORCH_JAX_CACHE_DIR")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "torch_jax"


# NOTE [GPU memory beside PyTorch]: by default JAX's GPU client preallocates 75% of each
# GPU's memory when it starts, which would leave a program's own CUDA tensors (PyTorch's
# caching allocator) a quarter of the GPU. So before the device starts JAX, it sets
# ``XLA_PYTHON_CLIENT_PREALLOCATE=false``: JAX's allocator then grows on demand (up to
# ``XLA_PYTHON_CLIENT_MEM_FRACTION`` of the GPU, 75% by default) and keeps what it took for
# reuse, as PyTorch's does. A user who set any of JAX's memory variables keeps their
# choice: ``XLA_PYTHON_CLIENT_PREALLOCATE=true`` brings preallocation back (a JAX-only
# program gains a little), ``XLA_PYTHON_CLIENT_MEM_FRACTION=.4`` caps JAX at 40%, and
# ``XLA_PYTHON_CLIENT_ALLOCATOR=platform`` frees each buffer at once (slow, exact). They are
# read when JAX starts its GPU client: a program that used JAX before the device keeps
# whatever JAX started with. Nothing changes on the CPU.
JAX_MEMORY_VARIABLES = (
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_ALLOCATOR",
)


def share_gpu_memory() -> None:
    """NOTE [GPU memory beside PyTorch]: JAX allocates GPU memory on demand unless the user
    chose otherwise."""
    if not any(name in os.environ for name in JAX_MEMORY_VARIABLES):
        os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
