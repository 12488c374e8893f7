"""torch_jax: PyTorch's native ``jax`` device, running PyTorch programs on JAX/XLA.

Importing this package (PyTorch does it on ``import torch`` through the
``torch.backends`` entry point) registers the device; JAX itself is imported on the
first use of the device.
"""

from __future__ import annotations


def _autoload() -> None:
    """Entry point PyTorch calls on ``import torch`` (group ``torch.backends``).

    Defined before anything imports torch: when ``import torch_jax`` comes first, its
    ``import torch`` runs this entry point while torch_jax is still half-imported."""


from torch_jax._warnings import (  # noqa: E402
    CompileWarning,
    FallbackWarning,
    RecompileWarning,
    RegistrationWarning,
)

__version__ = "0.1.0"

try:  # NOTE [Autoload never breaks torch] (in _compat)
    from torch_jax import _compat
    from torch_jax._config import Config, config
    from torch_jax.device._registration import initialize, register

    _compat.warn_if_unsupported()
    register()
except Exception as _error:
    from torch_jax import _compat

    initialize = register = _compat.registration_failed(_error)


def stats() -> dict:
    """Counters since start (or the last :func:`reset_stats`): ``ops`` run by the
    executor, ``compiles`` (XLA computations built), ``cache_hits``, ``fallbacks``
    (ops run on the CPU), ``fallback_ops`` (per aten op) and ``host_transfers``."""
    initialize()
    from torch_jax.runtime import _stats

    return _stats.snapshot()


def reset_stats() -> None:
    initialize()
    from torch_jax.runtime import _stats

    _stats.reset()


def set_mode(mode: str) -> None:
    """``"strict"`` (each op runs at once) or ``"fused"`` (ops are recorded and run as one
    XLA computation when a value is needed); also ``TORCH_JAX_MODE``."""
    initialize()
    from torch_jax.runtime import _fused

    _fused.set_mode(mode)


def fused():
    """A context manager: the block runs in fused mode, then the previous mode returns."""
    initialize()
    from torch_jax.runtime import _fused

    return _fused.fused()


def mark_step() -> None:
    """Fused mode: run the ops recorded so far (for example at the end of a training
    step); asynchronous, like every computation on the device."""
    initialize()
    from torch_jax.runtime import _fused

    _fused.mark_step()


__all__ = [
    "CompileWarning",
    "Config",
    "FallbackWarning",
    "RecompileWarning",
    "RegistrationWarning",
    "config",
    "fused",
    "initialize",
    "mark_step",
    "reset_stats",
    "set_mode",
    "stats",
]
