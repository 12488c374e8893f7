"""Python-level fixes for PyTorch behaviour that a C++ backend gets from C++ and a
Python PrivateUse1 backend does not. Each leaves every other device untouched."""

from __future__ import annotations

import io
import threading

import torch

NAME = "jax"


def install() -> None:
    _patch_storage_pickle()
    _patch_module_apply()


def _patch_storage_pickle() -> None:
    """NOTE [Pickling storages]: ``pickle``/``multiprocessing`` reduce a tensor to its
    storage, and PyTorch reduces a storage with the legacy ``torch.save`` format, which
    reads device storages through ``from_blob`` on the raw data pointer: a new
    StorageImpl without our payload. jax storages are reduced with the current format
    instead (the one ``torch.save`` uses), which copies them through the storage itself
    and restores them on the same jax device."""
    for cls in (torch.UntypedStorage, torch.storage.TypedStorage):
        reduce = cls.__reduce__

        def __reduce__(self, _reduce=reduce):
            if getattr(self, "_untyped_storage", self).device.type != NAME:  # (TypedStorage.device warns)
                return _reduce(self)
            buf = io.BytesIO()
            torch.save(self, buf)
            return (torch.storage._load_from_bytes, (buf.getvalue(),))

        cls.__reduce__ = __reduce__


_applying = threading.local()


def _patch_module_apply() -> None:
    """NOTE [Tied parameters across .to("jax")]: ``Module._apply`` (``.to``, ``.half``...)
    keeps each Parameter object and swaps its data with ``param.data = new`` only when
    PyTorch's C++ ``_has_compatible_shallow_copy_type`` says the two tensor types match,
    which it says for CPU/CUDA/XPU/... but not for PrivateUse1. Otherwise it wraps every
    converted tensor in a new Parameter, slot by slot, so a parameter shared by two
    modules (tied embeddings and output layer) would become two. After the outermost
    ``_apply``, slots that shared one Parameter before and now hold jax parameters get one
    Parameter again, as on CUDA (and back from jax to the CPU)."""
    apply = torch.nn.Module._apply

    def _apply(self, fn, recurse=True):
        if getattr(_applying, "active", False):
            return apply(self, fn, recurse)
        slots: dict[int, list[tuple[torch.nn.Module, str]]] = {}
        modules = self.modules() if recurse else (self,)
        for m in modules:
            for key, p in m._parameters.items():
                if p is not None:
                    slots.setdefault(id(p), []).append((m, key))
        tied = [(s, _is_jax(s[0][0]._parameters[s[0][1]])) for s in slots.values() if len(s) > 1]
        _applying.active = True
        try:
            out = apply(self, fn, recurse)
        finally:
            _applying.active = False
        for group, was_jax in tied:
            first = group[0][0]._parameters[group[0][1]]
            if not (was_jax or _is_jax(first)):
                continue
            for m, key in group[1:]:
                m._parameters[key] = first
        return out

    torch.nn.Module._apply = _apply


def _is_jax(t) -> bool:
    return t is not None and t.device.type == NAME
