"""What differs between the torch versions torch_jax supports, in one place.

Everything that depends on which torch is installed (ops added or removed, schema
changes, private APIs the device relies on) is decided here, one NOTE per difference,
so that the rest of the code reads the same on every version.

NOTE [aten.cholesky]: torch 2.14 removed the deprecated ``aten::cholesky`` (``torch.cholesky``
had warned since 1.9 to use ``torch.linalg.cholesky``, which is ``linalg_cholesky_ex``).
Where it exists it is lowered; where it does not, it is simply absent from the table.

NOTE [torch.accelerator across versions]: ``torch.accelerator`` gains functions from
version to version (torch 2.11 has no ``empty_host_cache``). The device routes each of its
functions that the installed torch has (device/_accelerator), and leaves a missing one
missing, as it is for CUDA with that torch: routing it would raise AttributeError while
``import torch`` loads the backend, which breaks every program in the environment.
"""

from __future__ import annotations

import torch


def aten_op(name: str, overload: str = "default"):
    """``torch.ops.aten.<name>.<overload>``, or None where this torch has no such op."""
    packet = getattr(torch.ops.aten, name, None)
    return None if packet is None else getattr(packet, overload, None)


def in_accelerator(name: str) -> bool:
    """Whether this torch's ``torch.accelerator`` has ``name`` (NOTE [torch.accelerator
    across versions])."""
    return hasattr(torch.accelerator, name)
