"""``torch.distributed`` on ``jax``: the ``jax`` c10d backend (NOTE [The jax process
group] in distributed/_backend).

Registered when ``torch.distributed.distributed_c10d`` is imported (without importing
JAX), for the ``jax`` device, so that ``dist.init_process_group()`` without a backend, or
``backend="jax"``, covers tensors on ``jax`` (through XLA's collectives across JAX
processes) and tensors on the CPU (through gloo, which the group holds beside).
"""

from __future__ import annotations

import os

NAME = "jax"
_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def launched() -> bool:
    """Whether the environment says this process is one of a multi-process job (torchrun's
    variables; NOTE [Any order under a launcher] in distributed/_backend)."""
    if not all(os.environ.get(name) for name in _LAUNCH_VARS):
        return False
    try:
        return int(os.environ["WORLD_SIZE"]) > 1
    except ValueError:
        return False


def install() -> None:
    from torch_jax.device import _patches

    _patches.on_import("torch.distributed.distributed_c10d", _register)
    _patches.on_import("torch.distributed.fsdp._fully_shard._fsdp_param", _fsdp_storages)
    _patches.on_import("torch.nn.parallel.distributed", _ddp_reducer)


def _ddp_reducer(module) -> None:
    from torch_jax.distributed import _ddp

    _ddp.install(module)


def _fsdp_storages(module) -> None:
    """NOTE [FSDP2's storages on jax]: FSDP2 frees an unsharded parameter between uses by
    resizing its storage to 0 bytes and back, which a Python backend cannot do (PyTorch
    asks a C++ hook for it). On jax the storage keeps its size and lets go of its array
    instead (a storage without an array reads as zeros until written, as FSDP2's
    all-gather does before any read)."""
    free, alloc = module.free_storage, module.alloc_storage

    def free_storage(tensor) -> None:
        if tensor.device.type != NAME:
            return free(tensor)
        from torch_jax.tensor import _storage

        _storage.box_of(tensor).arr = None

    def alloc_storage(tensor) -> None:
        if tensor.device.type != NAME:
            return alloc(tensor)

    module.free_storage, module.alloc_storage = free_storage, alloc_storage


def _register(c10d) -> None:
    if NAME in c10d.Backend.backend_list:
        return

    def create(store, rank, world_size, timeout):
        from torch_jax.distributed import _backend

        return _backend.JaxProcessGroup(store, rank, world_size, timeout)

    # (the group runs CPU tensors' collectives through the gloo group it holds)
    c10d.Backend.register_backend(NAME, create, devices=["jax", "cpu"])
