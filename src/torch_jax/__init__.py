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

__version__ = "0.9.0"  # (CHANGELOG.md says what each version brought)

try:  # NOTE [Autoload never breaks torch] (in _compat)
    from torch_jax import _compat
    from torch_jax._config import Config, config
    from torch_jax._registration import initialize, register

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


# ---- custom kernels and JAX interop (torch_jax/kernels)


def jax_op(name: str, fn=None, **options):
    """Define the operator ``name`` ("namespace::op") whose kernel on ``jax`` is the JAX
    function ``fn`` (a decorator without ``fn``): schema, fake implementation and
    autograd derived from it; it runs in strict and fused eager and inside
    ``torch.compile`` graphs (NOTE [JAX functions as operators] in kernels/_jax_op)."""
    initialize()
    from torch_jax import kernels

    return kernels.jax_op(name, fn, **options)


def override(op, fn):
    """Run the JAX function ``fn`` in place of the lowering of the aten op ``op``: from
    now until ``.remove()``, or for a ``with`` block (NOTE [Overriding a lowering])."""
    initialize()
    from torch_jax import kernels

    return kernels.override(op, fn)


def check_override(op, fn, *args, **kwargs) -> dict:
    """Compare ``op`` with ``fn`` in place of its lowering against its default on these
    arguments: outputs and gradients; raises AssertionError if they differ."""
    initialize()
    from torch_jax import kernels

    return kernels.check_override(op, fn, *args, **kwargs)


def to_jax(t):
    """The ``jax.Array`` of a ``jax`` tensor's values (its storage's own array, no copy,
    when the tensor is its whole storage, contiguous)."""
    initialize()
    from torch_jax import kernels

    return kernels.to_jax(t)


def from_jax(a, device=None):
    """A ``jax`` tensor over the JAX array ``a``, no copy (NOTE [Tensors and JAX arrays
    share buffers] in kernels/_interop)."""
    initialize()
    from torch_jax import kernels

    return kernels.from_jax(a, device)


def call_jax(fn, *args, **kwargs):
    """Run the JAX function ``fn`` on ``jax`` tensors (as JAX arrays, nested in lists,
    tuples and dicts too); its arrays come back as tensors, with autograd through
    ``jax.vjp``."""
    initialize()
    from torch_jax import kernels

    return kernels.call_jax(fn, *args, **kwargs)


__all__ = [
    "CompileWarning",
    "Config",
    "FallbackWarning",
    "RecompileWarning",
    "RegistrationWarning",
    "call_jax",
    "check_override",
    "config",
    "from_jax",
    "fused",
    "initialize",
    "jax_op",
    "mark_step",
    "override",
    "reset_stats",
    "set_mode",
    "stats",
    "to_jax",
]
