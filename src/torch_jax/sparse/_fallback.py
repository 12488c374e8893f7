"""The CPU fallback for sparse tensors: an op with a sparse jax argument and no kernel of
its own runs on the CPU.

NOTE [Sparse CPU fallback]: the dense fallback (runtime/_fallback.py) maps device tensors
to CPU views of their storages; a sparse tensor has no storage, so here every jax tensor
argument, sparse or dense, is copied to the CPU whole (``.cpu()``), the CPU op runs, the
arguments it mutated are copied back into the jax tensors (``copy_``, which for a sparse
tensor replaces its indices and values), and results move to the argument's device.
Results of the CPU op that alias an argument are copies on jax. Warnings, counts and
``TORCH_JAX_FALLBACK=error`` are the dense fallback's (``_announce``).
"""

from __future__ import annotations

import torch

from torch_jax.runtime import _fallback

Tensor = torch.Tensor


def _device_of(args, kwargs):
    for x in (*args, *kwargs.values()):
        for t in x if isinstance(x, (list, tuple)) else (x,):
            if isinstance(t, Tensor) and t.device.type != "cpu":
                return t.device
    return None


def _to(x, device):
    if isinstance(x, Tensor):
        # (below autograd the copy would not require grad; some CPU kernels read the flag:
        # _sparse_mm_reduce_impl returns the arg-max indices its backward needs only then)
        return x.to(device).requires_grad_(x.requires_grad)
    if isinstance(x, (list, tuple)):
        return type(x)(_to(y, device) for y in x)
    if isinstance(x, torch.device) and x.type != "cpu" and device.type == "cpu":
        return device
    return x


def _from_cpu(x, device):
    if isinstance(x, Tensor):
        return x if x.device == device else x.to(device)
    if isinstance(x, (list, tuple)):
        return type(x)(_from_cpu(y, device) for y in x)
    return x


def sparse_fallback(op, *args, **kwargs):
    """Run ``op`` on the CPU (see NOTE [Sparse CPU fallback])."""
    _fallback._announce(op)
    device = _device_of(args, kwargs)
    cpu = torch.device("cpu")
    cargs = _to(args, cpu)
    ckwargs = {k: _to(v, cpu) for k, v in kwargs.items()}
    out = op(*cargs, **ckwargs)
    written = {}
    for i, a in enumerate(op._schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        orig = args[i] if i < len(args) else kwargs.get(a.name)
        new = cargs[i] if i < len(cargs) else ckwargs.get(a.name)
        if isinstance(orig, Tensor) and orig.device.type != "cpu":
            _write_back(orig, new)
            written[id(new)] = orig
    if device is None:
        return out
    if isinstance(out, (tuple, list)):
        return type(out)(written.get(id(r)) or _from_cpu(r, device) for r in out)
    if isinstance(out, Tensor) and id(out) in written:
        return written[id(out)]
    return _from_cpu(out, device)


def _write_back(orig: Tensor, new: Tensor) -> None:
    if orig.layout != new.layout:
        raise NotImplementedError(f"torch_jax: the CPU fallback changed the layout of an argument to {new.layout}")
    if orig.layout == torch.strided and orig.shape != new.shape:
        orig.resize_(new.shape)
    orig.copy_(new)
