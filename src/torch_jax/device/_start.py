"""Starting the device from the layers below the one that installs them.

NOTE [One place installs the layers]: the device starts on its first use (JAX imported,
every kernel registered), and the code that starts it installs every layer: it lives
above all of them, in torch_jax/_registration.py. The layers below that need the device
started (the device module, torch.compile's backend, the distributed backend, the
kernels' API) call ``start()`` here, which runs what the installer handed in when it was
imported (``import torch_jax`` imports it before any layer), so that no layer imports a
layer above it (tests/test_layers.py checks the import graph)."""

from __future__ import annotations

_start = None
_started = None


def hand_in(start, started) -> None:
    """The installer's: ``start()`` starts the device, ``started()`` says whether it has."""
    global _start, _started
    _start, _started = start, started


def start() -> None:
    """Start the device (once; cheap after)."""
    if _start is None:  # (torch_jax/_registration did not import: its RegistrationWarning says why)
        raise RuntimeError("torch_jax: the jax device is not registered; see the RegistrationWarning")
    _start()


def started() -> bool:
    return _started is not None and _started()
