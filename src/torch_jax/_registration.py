"""Registers PyTorch's PrivateUse1 backend as the ``jax`` device, and starts it: the one
place that installs every layer (NOTE [One place installs the layers] in device/_start).

NOTE [Cheap autoload]: PyTorch imports this on every ``import torch`` (through the
``torch.backends`` entry point), so nothing here may import JAX or build the
lowering table. Registration installs the device name, the device module, the
hooks, and one boxed fallback for the PrivateUse1 key. The first op that reaches
the device (a factory, a ``.to("jax")``) lands in that fallback, which runs
:func:`initialize` (import JAX, register every kernel) and dispatches the op again.
"""

from __future__ import annotations

import sys
import threading

import torch

from torch_jax.device import _start

NAME = "jax"

_lock = threading.RLock()
_registered = False
_initialized = False
_libs: list[torch.library.Library] = []
_fallback_kernel = None  # the CPU fallback, installed by initialize()


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _Guard(torch._C._acc.DeviceGuard):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


def _boxed_fallback(op, *args, **kwargs):
    if not _initialized:
        initialize()
        return op(*args, **kwargs)
    return _fallback_kernel(op, *args, **kwargs)


def register() -> None:
    """Make ``jax`` a PyTorch device. Cheap: imports nothing beyond torch."""
    global _registered
    with _lock:
        if _registered:
            return
        current = torch._C._get_privateuse1_backend_name()
        if current not in ("privateuseone", NAME):
            raise RuntimeError(
                f"torch_jax: PyTorch's PrivateUse1 backend is already registered as {current!r}; "
                "only one out-of-tree backend can use it per process"
            )
        from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

        from torch_jax.device import _accelerator, _autocast, _module, _patches

        if current == "privateuseone":
            _setup_privateuseone_for_python_backend(
                rename=NAME, backend_module=_module, hook=_Hooks(), device_guard=_Guard()
            )
        fallback = torch.library.Library("_", "IMPL")  # noqa: TOR901 (a backend fallback is global)
        fallback.fallback(_boxed_fallback, "PrivateUse1")
        # torch.autocast("jax") dispatches to AutocastPrivateUse1 for every op; PyTorch
        # registers no fallthrough for it (it does for CUDA), so without this every op
        # under autocast fails. Per-op autocast kernels can still be registered on top.
        fallback.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
        _autocast.register()  # the CUDA autocast policy, one kernel per op (device/_autocast.py)
        _libs.append(fallback)
        _patch_untyped_storage()
        _patches.install()
        _accelerator.install(_supported_dtypes)  # torch.accelerator, Stream/Event, pinning, Generator
        from torch_jax.compile import _route

        _route.install()  # NOTE [The default torch.compile on jax]
        from torch_jax import distributed

        distributed.install()  # NOTE [The jax process group] in distributed/_backend
        _registered = True


def _supported_dtypes() -> set:
    """The dtypes tensors on jax may have (``torch.accelerator.get_device_capability``)."""
    from torch_jax.tensor import _dtypes

    return set(_dtypes.TO_NP)


def _patch_untyped_storage() -> None:
    """NOTE [Storages without an allocator]: ``torch.UntypedStorage(n, device="jax")``
    (used by ``torch.load`` and ``TypedStorage``) asks PyTorch's C++ allocator for the
    device, which a Python backend cannot register: it would crash the process. For
    the jax device the storage is made the way every device storage is made."""
    storage_new = torch.UntypedStorage.__new__

    def __new__(cls, *args, device=None, **kwargs):
        if device is not None and torch.device(device).type == NAME:
            initialize()
            from torch_jax.runtime import _copy

            return _copy.new_storage(args, torch.device(device), **kwargs)
        if device is None:
            return storage_new(cls, *args, **kwargs)
        return storage_new(cls, *args, device=device, **kwargs)

    torch.UntypedStorage.__new__ = __new__


def initialize() -> None:
    """Import JAX and register every kernel. Runs once, on first use of the device."""
    global _initialized, _fallback_kernel
    if _initialized:
        return
    with _lock:
        if _initialized:
            return
        from torch_jax._config import share_gpu_memory
        from torch_jax.device import _host_memory

        share_gpu_memory()  # NOTE [GPU memory beside PyTorch]
        _host_memory.keep_freed_blocks(_host_memory.platform())  # NOTE [Host memory of the CPU device]
        register()
        # NOTE [The jax process group], NOTE [Any order under a launcher]
        from torch_jax import distributed

        if "torch.distributed.distributed_c10d" in sys.modules or distributed.launched():
            from torch_jax.distributed import _backend

            _backend.start_runtime()
        from torch_jax import sparse
        from torch_jax.runtime import _install

        _fallback_kernel = _install.install()
        sparse.install(_install.library())  # sparse COO and CSR layouts
        from torch_jax.compile import _cache

        _cache.enable()  # NOTE [Persistent compilation cache]
        _initialized = True
        # (the kernels layer's aten kernels, once the device has started: importing the
        # layer starts it)
        from torch_jax.kernels import _rnn

        _rnn.install(_install.library(), _install.REGISTERED)  # NOTE [Recurrent layers in one op]
    from torch_jax.device import _module

    _module.run_pending()  # NOTE [Seeds before the device starts]


def is_initialized() -> bool:
    return _initialized


_start.hand_in(initialize, is_initialized)
