"""Ray Train's workers on ``jax`` (NOTE [Ray Train on jax]).

NOTE [Ray Train on jax]: Ray Train (2.60) keeps one device manager per accelerator kind
(``ray/air/_internal/device_manager``: GPU, HPU, NPU, TPU) and picks a worker's from the
accelerator resources Ray gave it, or the CPU's; ``ray.train.torch.get_device()``,
``prepare_model`` and ``prepare_data_loader`` all ask that manager, and ``TorchConfig``
chooses gloo for the process group where no GPU was asked for. On jax workers they moved
a jax model back to the CPU, batches to the CPU, and DDP failed on the gloo group.

The one setting is the process group's backend, ``TorchConfig(backend="jax")``: it says
both that the workers' collectives run on jax and that their device is jax (as nccl means
CUDA). ``_TorchBackend.on_start``, which runs in Ray's controller before it sets the
workers' torchrun variables and creates their group, first tells each worker so: the
worker's manager becomes jax's (Ray caches one manager a process, which is what is
replaced), and Ray's lookup of a manager by device type, which raises for a type it does
not know, learns ``jax``. The manager gives ``jax:LOCAL_RANK``, each process's own device
(NOTE [The jax process group]), without starting the device: Ray asks for it before the
group exists (for ``ACCELERATE_TORCH_DEVICE``). As Ray makes the worker's CUDA device the
current one when the training function starts (``TorchConfigContextManager``), the jax
device is made current there, once the group exists, so ``.to("jax")`` in the function
reaches the worker's own device. jax has no side streams, so batches are copied on the
device's one queue, as on the CPU. Other backends, workers and processes keep Ray's
managers; nothing changes without the setting.

Nothing here imports Ray or JAX at import time (NOTE [Cheap autoload]): the patches run
when Ray imports ``ray.train.torch.config``, in the driver, the controller and each worker.
"""

from __future__ import annotations

import contextlib
import functools

import torch

NAME = "jax"


def patch_torch_config(config) -> None:
    """Wraps ``_TorchBackend.on_start`` and ``TorchConfigContextManager.__enter__`` of the
    module ``ray.train.torch.config`` (once)."""
    backend = getattr(config, "_TorchBackend", None)
    on_start = None if backend is None else backend.__dict__.get("on_start")
    if on_start is not None and not getattr(on_start, "_torch_jax", False):

        @functools.wraps(on_start)
        def on_start_jax(self, worker_group, backend_config):
            if getattr(backend_config, "backend", None) == NAME:
                worker_group.execute(use_jax)
            return on_start(self, worker_group, backend_config)

        on_start_jax._torch_jax = True
        backend.on_start = on_start_jax
    context = getattr(config, "TorchConfigContextManager", None)
    enter = None if context is None else context.__dict__.get("__enter__")
    if enter is not None and not getattr(enter, "_torch_jax", False):

        @functools.wraps(enter)
        def enter_jax(self):
            out = enter(self)
            if _jax_worker:
                torch.jax.set_device(JaxTorchDeviceManager().get_devices()[0])
            return out

        enter_jax._torch_jax = True
        context.__enter__ = enter_jax


_jax_worker = False  # (set in a Ray Train worker whose group is jax's)


def use_jax() -> None:
    """Run in each Ray Train worker (by ``on_start``) of a jax group: its device manager
    becomes jax's."""
    global _jax_worker
    import ray
    import ray.air._internal.device_manager as managers
    import ray.train.torch.config  # noqa: F401 (the train-function context, patched on import)
    import ray.train.torch.train_loop_utils as loop_utils

    if not hasattr(managers, "_torch_device_manager"):
        raise RuntimeError(
            f"torch_jax: Ray {ray.__version__} keeps its torch device manager where torch_jax does not "
            "look for it (ray.air._internal.device_manager._torch_device_manager; Ray 2.60 has it), so "
            'TorchConfig(backend="jax") cannot give its workers the jax device'
        )
    with managers._torch_device_manager_lock:
        managers._torch_device_manager = JaxTorchDeviceManager()
    for module in (managers, loop_utils):
        by_type = getattr(module, "get_torch_device_manager_by_device_type", None)
        if by_type is not None and not getattr(by_type, "_torch_jax", False):
            module.get_torch_device_manager_by_device_type = _by_type_or_jax(by_type)
    _jax_worker = True


def _by_type_or_jax(by_type):
    @functools.wraps(by_type)
    def wrapper(device_type: str):
        if device_type == NAME:
            return JaxTorchDeviceManager()
        return by_type(device_type)

    wrapper._torch_jax = True
    return wrapper


class JaxTorchDeviceManager:
    """Ray's ``TorchDeviceManager`` interface for the jax device (Ray's base class only
    documents the methods; nothing checks the type)."""

    def is_available(self) -> bool:
        return torch.jax.is_available()  # (does not start the device)

    def get_devices(self) -> list[torch.device]:
        import ray.train

        return [torch.device(NAME, ray.train.get_context().get_local_rank())]

    def set_device(self, device) -> None:
        torch.jax.set_device(device)

    def supports_stream(self) -> bool:
        return False

    def create_stream(self, device):
        return None

    def get_stream_context(self, stream):
        return contextlib.nullcontext()

    def get_current_stream(self):
        return None
