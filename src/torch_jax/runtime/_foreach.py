"""The kernels of the foreach ops: one computation over the whole list where that
gives the per-tensor loop's results exactly, else the loop (NOTE [Foreach ops] in
ops/_foreach)."""

from __future__ import annotations

import torch

from torch_jax.ops._foreach import PER_TENSOR
from torch_jax.runtime import _executor, _install

Tensor = torch.Tensor
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _box(t):
    """``t``'s storage box, or None where the fast route cannot take ``t`` (a CPU
    tensor, a lazy conjugate or negative view)."""
    if t.__class__ is not Tensor and not isinstance(t, Tensor):
        return None
    if t.is_cpu or t.is_conj() or t.is_neg():
        return None
    return getattr(t.untyped_storage(), "_box", None)


def _fast(spec, args) -> bool:
    """Whether one computation over the lists gives what the per-tensor loop gives.

    The conditions of CUDA's fast route, made exact for our executor: every tensor on
    one jax device; the written tensors floating point, each in its own storage; each
    other list's element of the same shape and dtype as the written one; a single
    tensor operand 0-dim and real; scalars real. Then every element's result has the
    written tensor's dtype and shape (no in-place cast or resize can fail), and no
    element reads a storage that the loop would have written before reaching it (a
    tensor may read its own storage: ``_foreach_mul_(xs, xs)``)."""
    kinds = spec.kinds
    self = args[0]
    n = len(self)
    if n == 0:
        return False
    boxes = {}
    index = None
    for i, t in enumerate(self):
        box = _box(t)
        if box is None or t.dtype not in _FLOATS or id(box) in boxes:
            return False
        if index is None:
            index = box.index
        elif box.index != index:
            return False
        boxes[id(box)] = i
    for pos in range(1, len(args)):
        a, kind = args[pos], kinds[pos]
        if kind == _executor.TL:
            if len(a) != n:
                return False
            for i, (t, s) in enumerate(zip(a, self)):
                box = _box(t)
                if box is None or box.index != index or t.dtype != s.dtype or t.shape != s.shape:
                    return False
                if boxes.get(id(box), i) != i:
                    return False
        elif kind == _executor.T:
            box = _box(a)
            if box is None or box.index != index or a.dim() != 0 or a.is_complex() or id(box) in boxes:
                return False
        elif kind == _executor.SL:
            if len(a) != n or any(c.__class__ not in (int, float, bool) for c in a):
                return False
        elif kind == _executor.S and a.__class__ not in (int, float, bool):
            return False
    return True


def _loop(op, args):
    """PyTorch's slow route: the per-tensor op on each element."""
    per_op, arrange = PER_TENSOR[op]
    self = args[0]
    if not self:
        raise RuntimeError("Tensor list must have at least one tensor.")
    for pos, kind in enumerate(_executor.SPECS[op].kinds[1:], 1):
        if kind == _executor.TL and len(args[pos]) != len(self):
            raise RuntimeError(
                f"Tensor lists must have the same number of tensors, got {len(self)} and {len(args[pos])}"
            )
        if kind == _executor.SL and len(args[pos]) != len(self):
            raise RuntimeError("Tensor list must have same number of elements as scalar list.")
    elements = arrange(*args)
    if not _executor.SPECS[op].writes:
        return [_call(per_op, e) for e in elements]
    inplace = _inplace(per_op)
    for e in elements:
        _call(inplace, e)
    return None


def _call(op, args):
    """``op`` on arguments in schema order (keyword-only ones passed by name)."""
    if callable(op) and not isinstance(op, torch._ops.OpOverload):
        return op(*args)
    schema = op._schema.arguments
    positional = [a for a, s in zip(args, schema) if not s.kwarg_only]
    keywords = {s.name: a for a, s in zip(args, schema) if s.kwarg_only}
    return op(*positional, **keywords)


def _inplace(per_op):
    """The in-place form of ``per_op`` (``maximum``, which has none: its result copied
    into self, as PyTorch's loop does)."""
    if per_op is torch.ops.aten.zero_.default:
        return per_op
    inplace = _install._inplace_variant(per_op)
    if inplace is None:
        return lambda self, *rest: self.copy_(_call(per_op, (self, *rest)))
    return inplace


def run(op, args):
    spec = _executor.SPECS[op]
    if _fast(spec, args):
        return _executor.run(spec, args)
    return _loop(op, args)


def kernels():
    return [(op, _install._make_kernel(op, "return _run(_op, (ARGS))", {"_run": run, "_op": op})) for op in PER_TENSOR]
