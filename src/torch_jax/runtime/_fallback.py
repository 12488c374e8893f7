"""The CPU fallback: any aten op without a lowering runs on the CPU.

NOTE [CPU fallback]: each storage touched by the op is copied to the host once, and
every device tensor argument becomes a CPU view (same size, stride, offset and dtype)
of its storage's copy, so views that share a storage still share it on the CPU. The
CPU kernel runs; storages of mutated arguments are written back whole (so every other
view of them sees the write); results are copied to the device, and results that are
views of an argument become views of the device argument. It warns once per op, is
counted per op, and ``TORCH_JAX_FALLBACK=error`` turns it into an error.
"""

from __future__ import annotations

import os
import sys
import warnings

import torch

from torch_jax._config import config
from torch_jax._warnings import FallbackWarning
from torch_jax.device import _state as _devices
from torch_jax.ops._registry import DECLARED_FALLBACKS
from torch_jax.runtime import _copy, _stats
from torch_jax.tensor import _dtypes, _storage

Tensor = torch.Tensor


_warned: set = set()


_name = _stats.op_name
_LIBRARIES = (os.path.dirname(os.path.dirname(__file__)), os.path.dirname(torch.__file__))


def _caller_level() -> int:
    """For a warning made by the caller: the ``stacklevel`` of the first frame outside
    torch_jax and torch, the line that called the op."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_LIBRARIES):
        frame, level = frame.f_back, level + 1
    return level if frame is not None else 1


def _announce(op) -> None:
    name = _name(op)
    reason = DECLARED_FALLBACKS.get(op)
    why = f" ({reason})" if reason else ""
    if config.fallback == "error":
        raise NotImplementedError(
            f"torch_jax: {name} has no JAX lowering{why} and TORCH_JAX_FALLBACK=error forbids running "
            "it on the CPU. Set TORCH_JAX_FALLBACK=warn to allow the CPU fallback, and please report "
            "the op to the torch_jax issue tracker."
        )
    _stats.counters["fallbacks"] += 1
    _stats.fallback_ops[name] += 1
    if _stats.census is not None:
        _stats.census["cpu_fallback", name] += 1
    if config.debug >= 1:
        print(f"[torch_jax] CPU fallback: {name}")
    if config.fallback == "warn" and name not in _warned:
        _warned.add(name)
        warnings.warn(
            f"torch_jax: {name} has no JAX lowering{why}; it ran on the CPU, copying its inputs to the "
            "host and its results back (slow). Set TORCH_JAX_FALLBACK=silent to hide this warning or "
            "TORCH_JAX_FALLBACK=error to make it an error, and please report the op to the torch_jax "
            "issue tracker. torch_jax.stats() counts fallbacks per op.",
            FallbackWarning,
            stacklevel=_caller_level(),
        )


class _ToCpu:
    """Device tensors -> CPU views of one host copy per storage."""

    def __init__(self):
        self.storages = {}  # id(box) -> (box, flat CPU tensor of the box dtype)
        self.index = None
        self.pairs = []  # (device tensor, its CPU counterpart)

    def __call__(self, x):
        if isinstance(x, Tensor):
            if x.is_cpu:
                return x
            return self._tensor(x)
        if isinstance(x, (list, tuple)):
            return type(x)(self(y) for y in x)
        if isinstance(x, torch.device) and x.type == _devices_type():
            if self.index is None:
                self.index = _devices.index_of(x)
            return torch.device("cpu")
        return x

    def _tensor(self, x):
        box = _storage.box_of(x)
        if self.index is None:
            self.index = box.index
        entry = self.storages.get(id(box))
        if entry is None:
            flat = torch.empty(box.numel, dtype=box.dtype)
            if box.arr is not None:
                arr = _storage.array(box, "CPU fallback")
                flat.copy_(_dtypes.numpy_to_tensor(_copy.to_numpy(arr).reshape(-1)))
            else:
                flat.zero_()
            entry = self.storages[id(box)] = (box, flat)
        flat = entry[1]
        base = flat if x.dtype == box.dtype else flat.view(x.dtype)
        c = base.as_strided(x.shape, x.stride(), x.storage_offset())
        if x.is_conj():  # NOTE [Conjugate and negative views] (runtime/_executor.py)
            c = c.conj()
        if x.is_neg():
            c = c._neg_view()
        self.pairs.append((x, c))
        return c


def _devices_type() -> str:
    return torch._C._get_privateuse1_backend_name()


def cpu_fallback(op, *args, **kwargs):
    _announce(op)
    to_cpu = _ToCpu()
    cargs = to_cpu(args)
    ckwargs = {k: to_cpu(v) for k, v in kwargs.items()}
    index = _devices.current() if to_cpu.index is None else to_cpu.index
    out = op(*cargs, **ckwargs)
    schema = op._schema
    written = set()
    for i, a in enumerate(schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        orig = args[i] if i < len(args) else kwargs.get(a.name)
        new = cargs[i] if i < len(cargs) else ckwargs.get(a.name)
        for o, c in zip(*(_flat(orig), _flat(new))):
            if isinstance(o, Tensor) and not o.is_cpu:
                _write_back(o, c, to_cpu, written)
    cpu_to_dev = {id(c): d for d, c in to_cpu.pairs}
    return _results(out, schema, cpu_to_dev, to_cpu, index)


def _flat(x):
    if isinstance(x, (list, tuple)):
        return list(x)
    return [x]


def _write_back(orig: Tensor, c: Tensor, to_cpu: _ToCpu, written: set) -> None:
    box = _storage.box_of(orig)
    _, flat = to_cpu.storages[id(box)]
    same_storage = c.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
    if same_storage and c.shape == orig.shape and c.stride() == orig.stride():
        if id(box) not in written:
            written.add(id(box))
            box.arr = _copy.upload(_dtypes.tensor_to_numpy(flat), box.index)
        return
    # the CPU kernel resized or re-pointed the argument: give it the same layout on a
    # storage of its own, then copy the values
    numel = _storage.storage_numel(c.shape, c.stride(), c.storage_offset())
    fresh = _storage.new_tensor([numel], orig.dtype, box.index)
    orig.set_(fresh.untyped_storage(), c.storage_offset(), c.shape, c.stride())
    _copy.copy_(orig, c)


def _results(out, schema, cpu_to_dev, to_cpu, index):
    if isinstance(out, Tensor):
        return _result(out, schema.returns[0] if schema.returns else None, cpu_to_dev, to_cpu, index)
    if isinstance(out, (tuple, list)):
        rets = schema.returns
        if len(rets) == 1:  # a Tensor[] return
            return type(out)(_result(r, rets[0], cpu_to_dev, to_cpu, index) for r in out)
        return type(out)(_result(r, ret, cpu_to_dev, to_cpu, index) for r, ret in zip(out, rets))
    return out


def _result(r, ret, cpu_to_dev, to_cpu, index):
    if not isinstance(r, Tensor):
        return r
    dev = cpu_to_dev.get(id(r))
    if dev is not None:
        return dev
    alias = ret.alias_info if ret is not None else None
    if alias is not None and not alias.is_write:
        view = _as_device_view(r, to_cpu)
        if view is not None:
            return view
    return _upload_result(r, index)


def _as_device_view(r: Tensor, to_cpu: _ToCpu):
    """A device view that matches the CPU view ``r`` of an argument's storage."""
    ptr = r.untyped_storage().data_ptr()
    for d, c in to_cpu.pairs:
        if c.untyped_storage().data_ptr() == ptr:
            base = d.resolve_conj().resolve_neg() if d.is_conj() or d.is_neg() else d
            base = base if base.dtype == r.dtype else base.view(r.dtype)
            view = base.as_strided(r.shape, r.stride(), r.storage_offset())
            if r.is_conj():
                view = view.conj()
            if r.is_neg():
                view = view._neg_view()
            return view
    return None


def _upload_result(r: Tensor, index: int) -> Tensor:
    if r.is_nested:  # (eval-mode nn.TransformerEncoder with a padding mask, under no_grad)
        from torch_jax.tensor import _nested

        return _nested.moved(r, torch.device("jax", index))
    if _storage.dense_perm(r.shape, r.stride()) is not None:
        stride = r.stride()
    else:
        stride = None
        r = r.contiguous()
    t = _storage.new_tensor(r.shape, r.dtype, index, None, stride)
    return _copy.copy_(t, r)
