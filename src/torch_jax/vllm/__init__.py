"""vLLM on ``jax``: a platform plugin (NOTE [vLLM on jax] in vllm/_platform.py).

Registered through the entry point group ``vllm.platform_plugins`` (``pip install
torch_jax[vllm]``). vLLM calls :func:`register` in every process it starts; nothing here
imports vLLM or JAX until then.
"""

from __future__ import annotations

import os

ENV = "TORCH_JAX_VLLM"
PLATFORM = "torch_jax.vllm._platform.JaxPlatform"
_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")


def register() -> str | None:
    """The jax platform's class for vLLM, or None where it does not activate.

    NOTE [When the jax platform activates]: vLLM takes an activated out-of-tree platform
    before its own, so an unconditional plugin would take a CUDA, ROCm, TPU or XPU machine
    away from vLLM's platform for it. ``TORCH_JAX_VLLM=1`` chooses jax (vLLM on JAX's GPU
    or TPU, say), ``TORCH_JAX_VLLM=0`` never; unset, jax activates only where none of
    vLLM's own platforms finds its hardware (a machine where vLLM would otherwise run
    nothing: no GPU, and this wheel's CPU platform needs a CPU build of vLLM)."""
    choice = os.environ.get(ENV, "").strip().lower()
    if choice in _OFF:
        return None
    if choice in _ON:
        return PLATFORM
    if choice:
        raise ValueError(f"torch_jax: {ENV}={os.environ[ENV]!r}; use 1 (jax) or 0 (vLLM's own platforms)")
    from vllm.platforms import builtin_platform_plugins

    for detect in builtin_platform_plugins.values():
        try:
            if detect() is not None:
                return None
        except Exception:  # (vLLM's own detection logs and skips its failures too)
            continue
    return PLATFORM
