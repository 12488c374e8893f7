"""``torch.distributed`` on ``jax``: the ``jax`` c10d backend (NOTE [The jax process
group] in distributed/_backend).

Registered when ``torch.distributed.distributed_c10d`` is imported (without importing
JAX), for the ``jax`` device, so that ``dist.init_process_group()`` without a backend, or
``backend="jax"``, covers tensors on ``jax`` (through XLA's collectives across JAX
processes) and tensors on the CPU (through gloo, which the group holds beside).
"""

from __future__ import annotations

NAME = "jax"


def install() -> None:
    from torch_jax.device import _patches

    _patches.on_import("torch.distributed.distributed_c10d", _register)


def _register(c10d) -> None:
    if NAME in c10d.Backend.backend_list:
        return

    def create(store, rank, world_size, timeout):
        from torch_jax.distributed import _backend

        return _backend.JaxProcessGroup(store, rank, world_size, timeout)

    # (the group runs CPU tensors' collectives through the gloo group it holds)
    c10d.Backend.register_backend(NAME, create, devices=["jax", "cpu"])
