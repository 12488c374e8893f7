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

Ray Train v2 sends ``train_loop_config`` to each worker inside the train context, which
the worker unpickles before ``on_start``: a jax tensor in the config started the device
there as a single process, before Ray had set torchrun's variables, and the group then
had no ``jax:LOCAL_RANK`` beyond 0. So, for a jax group of several workers, the controller
first gives each worker torchrun's variables (ranks from Ray's own ranking, the address
and a free port of worker 0, as ``on_start`` takes them), and a device started by the
unpickling starts JAX's runtime for the whole group (NOTE [Any order under a launcher]);
``on_start`` later sets its own port for the group's store, which is then a second
rendezvous of processes whose runtime already runs. (The controller unpickles the config
too, outside any group: there a jax tensor is a single process's, as in the driver.)

Nothing here imports Ray or JAX at import time (NOTE [Cheap autoload]): the patches run
when Ray imports ``ray.train.torch.config``, in the driver, the controller and each worker.
"""

from __future__ import annotations

import contextlib
import functools
import os

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


def patch_worker_group(module) -> None:
    """Wraps ``WorkerGroup._init_train_context`` of Ray Train v2's module
    ``ray.train.v2._internal.execution.worker_group.worker_group`` (once): a jax group's
    workers get torchrun's variables before their train context, with the config in it,
    is unpickled (NOTE [Ray Train on jax])."""
    group = getattr(module, "WorkerGroup", None)
    init = None if group is None else group.__dict__.get("_init_train_context")
    if init is None or getattr(init, "_torch_jax", False):
        return

    @functools.wraps(init)
    def init_jax(self, workers, *args, **kwargs):
        config = getattr(getattr(self, "_train_run_context", None), "backend_config", None)
        if getattr(config, "backend", None) == NAME:
            _give_launch_variables(workers)
        return init(self, workers, *args, **kwargs)

    init_jax._torch_jax = True
    group._init_train_context = init_jax


def _give_launch_variables(workers) -> None:
    """Sets torchrun's variables in each of a whole group's workers (a group of one, or
    some workers replacing others in a running group, is left to Ray's ``on_start``)."""
    import ray
    from ray.train._internal.utils import get_address_and_port

    contexts = [getattr(worker, "distributed_context", None) for worker in workers]
    if len(workers) < 2 or any(c is None or c.world_size != len(workers) for c in contexts):
        return
    address, port = ray.get(workers[0].execute_async(get_address_and_port))
    ray.get(
        [
            worker.execute_async(_set_launch_variables, context, address, port)
            for worker, context in zip(workers, contexts)
        ]
    )


def _set_launch_variables(context, address: str, port: int) -> None:
    """Run in a Ray Train worker: torchrun's variables for its place in the group (as Ray's
    ``on_start`` sets them, from the same ranks)."""
    os.environ.update(
        RANK=str(context.world_rank),
        WORLD_SIZE=str(context.world_size),
        LOCAL_RANK=str(context.local_rank),
        LOCAL_WORLD_SIZE=str(context.local_world_size),
        NODE_RANK=str(context.node_rank),
        MASTER_ADDR=address,
        MASTER_PORT=str(port),
    )


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
