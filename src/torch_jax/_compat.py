"""What differs between the torch versions torch_jax supports, in one place.

Supported: torch 2.11 to 2.14 and jax 0.10 to 0.11 (``SUPPORTED``, pyproject's ranges).
NOTE [Autoload never breaks torch]: PyTorch imports torch_jax on every ``import torch`` and
turns any exception into "Failed to load the backend extension", which breaks every PyTorch
program in the environment. So a torch_jax that cannot register (an unsupported torch, a
private API that moved, a bad ``TORCH_JAX_*`` setting) warns once, in one line naming the
versions and the fix (``RegistrationWarning``), and leaves PyTorch working; using the device
then raises that error. A version outside the supported ranges that does register says so
once too.

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

NOTE [torch.Generator's metaclass]: from torch 2.13 ``torch.Generator`` (``torch._C.Generator``)
has a Python metaclass, whose ``__call__`` the device hooks so that
``torch.Generator(device="jax")`` makes a jax generator (NOTE [jax generators]). In torch
2.11 and 2.12 its metaclass is ``type``, which cannot be changed; there the device replaces
``torch.Generator`` by a subclass that makes PyTorch's generators (``type(torch.Generator())``
is ``torch._C.Generator``) and answers ``isinstance``/``issubclass`` for PyTorch's class, as
``torch.Stream`` does on every version. TorchScript's ``ann is torch.Generator`` then no longer
recognizes annotations made before torch_jax loaded (none in a user's program).

NOTE [XLA options across jaxlib versions]: the CPU compiler options the device chooses
(runtime/_xla_options) are XLA debug options, which come and go between jaxlib releases
(jaxlib 0.11 dropped ``xla_cpu_use_fusion_emitters``, and an unknown option fails the
compilation). Each option is tried once per process on a one-op computation, and only
those this XLA takes are passed: on jaxlib 0.11 small computations are compiled at LLVM
level 1 only. This one lives beside the options it filters.

NOTE [int64 arange's length]: torch 2.11 to 2.13 count the elements of an int64 ``arange`` in
int64, ``end`` truncated (``arange(2.5, dtype=torch.int64)`` has 2), torch 2.14 counts them
in double as for every other dtype (3 elements, ``[0, 1, 2]``). The lowering counts as the
installed torch's CPU kernel does, which is asked once.

NOTE [attn_mask with is_causal]: torch 2.14's CPU attention refuses an explicit ``attn_mask``
together with ``is_causal=True`` (its error below); 2.11 to 2.13 apply both. The device's
attention does what the installed torch's CPU does, which is asked once on tiny tensors.

NOTE [3-D attention before torch 2.13]: the Meta kernel of
``_scaled_dot_product_fused_attention_overrideable`` in torch 2.11 and 2.12 reads four dims
(``query.size(2)``, an IndexError for a 3-D ``(H, L, E)`` query); 2.13 takes 3-D and 4-D.
There, 3-D attention takes ``scaled_dot_product_attention``'s composite (its math path: the
same values, about 8 ops instead of one) instead of the device's one-op attention (NOTE
[Attention in one op]); the installed torch's Meta kernel is asked once.

NOTE [Stream.is_capturing]: torch 2.11 and 2.12 raise "Backend doesn't support stream capture
query" from ``torch.Stream.is_capturing()`` on a Python backend's stream, 2.13 answers False.
The device's ``torch.Stream`` answers False on every version: a jax stream never captures.
"""

from __future__ import annotations

import functools
import importlib.metadata
import warnings

import torch

from torch_jax._warnings import RegistrationWarning

# (first supported, first unsupported) release of each
SUPPORTED = {"torch": ((2, 11), (2, 15)), "jax": ((0, 10), (0, 12))}


def _release(version: str) -> tuple[int, int]:
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def _installed(name: str) -> str:
    if name == "torch":
        return torch.__version__
    try:
        return importlib.metadata.version(name)  # (does not import jax: NOTE [Cheap autoload])
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _ranges() -> str:
    return ", ".join(f"{n}>={lo[0]}.{lo[1]},<{hi[0]}.{hi[1]}" for n, (lo, hi) in SUPPORTED.items())


def _versions() -> str:
    return ", ".join(f"{name} {_installed(name)}" for name in SUPPORTED)


def unsupported() -> list[str]:
    """The installed packages outside ``SUPPORTED``."""
    out = []
    for name, (lo, hi) in SUPPORTED.items():
        try:
            release = _release(_installed(name))
        except ValueError:
            out.append(name)
            continue
        if not lo <= release < hi:
            out.append(name)
    return out


def warn_if_unsupported() -> None:
    """One warning when torch or jax lies outside the supported ranges (NOTE [Autoload never
    breaks torch])."""
    if unsupported():
        warnings.warn(
            f"torch_jax supports {_ranges()}; this is {_versions()}, untested: "
            f"install a supported version (pip install '{_ranges().split(', ')[0]}') if the jax device misbehaves",
            RegistrationWarning,
            stacklevel=3,
        )


def registration_failed(error: BaseException):
    """Warn once that the device could not register; return a function that raises the
    same error when the device is used (NOTE [Autoload never breaks torch])."""
    fix = f"install a supported version (pip install '{_ranges().split(', ')[0]}')" if unsupported() else "fix that"
    message = (
        f"torch_jax could not register the jax device ({type(error).__name__}: {error}) with {_versions()} "
        f"(supported: {_ranges()}): PyTorch works without it; {fix}, "
        "or set TORCH_DEVICE_BACKEND_AUTOLOAD=0 to stop loading it"
    )
    warnings.warn(message.replace("\n", " "), RegistrationWarning, stacklevel=3)

    def unregistered(*args, **kwargs):
        raise RuntimeError(message) from error

    return unregistered


def aten_op(name: str, overload: str = "default"):
    """``torch.ops.aten.<name>.<overload>``, or None where this torch has no such op."""
    packet = getattr(torch.ops.aten, name, None)
    return None if packet is None else getattr(packet, overload, None)


def in_accelerator(name: str) -> bool:
    """Whether this torch's ``torch.accelerator`` has ``name`` (NOTE [torch.accelerator
    across versions])."""
    return hasattr(torch.accelerator, name)


def generator_metaclass_hookable() -> bool:
    """Whether ``torch.Generator``'s metaclass is a Python class the device can hook
    (NOTE [torch.Generator's metaclass])."""
    return type(torch._C.Generator) is not type


@functools.cache
def int64_arange_counts_in_int64() -> bool:
    """NOTE [int64 arange's length]."""
    return torch.arange(2.5, dtype=torch.int64).numel() == 2


SDPA_MASK_WITH_CAUSAL = "_scaled_dot_product_attention: Explicit attn_mask should not be set when is_causal=True"


@functools.cache
def sdpa_refuses_mask_with_causal() -> bool:
    """NOTE [attn_mask with is_causal]."""
    q = torch.zeros(1, 1, 1, 2)
    try:
        torch.nn.functional.scaled_dot_product_attention(
            q, q, q, attn_mask=torch.ones(1, 1, dtype=torch.bool), is_causal=True
        )
    except RuntimeError:
        return True
    return False


@functools.cache
def overrideable_attention_takes_3d() -> bool:
    """NOTE [3-D attention before torch 2.13]."""
    q = torch.empty(2, 3, 4, device="meta")
    try:
        torch.ops.aten._scaled_dot_product_fused_attention_overrideable(q, q, q)
    except (IndexError, RuntimeError):
        return False
    return True
