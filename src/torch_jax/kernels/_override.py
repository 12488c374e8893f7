"""A user's JAX function in place of an aten op's lowering.

NOTE [Overriding a lowering]: :class:`override` puts a JAX function in the place of an
op's entry in the lowering table (NOTE [One lowering table] in ops/_registry), so every
executor runs it: strict and fused eager through the op's kernels (the op's in-place
variant, derived from the same lowering, too) and ``torch.compile`` graphs compiled
while it is in place. The function takes what the lowering takes (every schema argument
positionally, tensors as JAX arrays) and returns what it returns; the op keeps its
other properties (which arguments are compile-time constants, whether it draws random
numbers). Compiled computations are kept apart: the op's kernels get a cache of their
own for each function, and the key of a ``torch.compile`` graph's computation names the
overrides in place, so leaving the scope goes back to the default computations, compiled
once. Autograd is PyTorch's formula for the op, which calls the backward op's lowering
(override that too for a kernel of its own). :func:`check_override` compares the two
on given inputs, values and gradients.
"""

from __future__ import annotations

import dataclasses
import weakref

import torch

from torch_jax.ops import _registry
from torch_jax.runtime import _executor

_caches: dict = {}  # op -> {function: its kernels' compiled computations} (weak in the function)


class override:
    """Run ``fn`` for ``op`` (an aten op overload with a lowering), from now until
    :meth:`remove`, or for a ``with`` block::

        with torch_jax.override(torch.ops.aten._softmax.default, my_softmax):
            y = model(x)
    """

    def __init__(self, op, fn):
        if not isinstance(op, torch._ops.OpOverload):
            raise TypeError(f"torch_jax.override takes an op overload (torch.ops.aten._softmax.default), got {op!r}")
        old = _registry.LOWERINGS.get(op)
        if old is None or op not in _executor.SPECS:
            raise ValueError(
                f"torch_jax.override: {op} has no lowering on jax to override (define a new op with torch_jax.jax_op)"
            )
        self.op, self.fn = op, fn
        self._old = old
        self._specs = [s for s in _executor.SPECS.values() if s.lowering is old]
        self._saved = [s.cache for s in self._specs]
        new = dataclasses.replace(old, fn=fn)
        caches = _caches.setdefault(op, weakref.WeakKeyDictionary())
        per_spec = caches.setdefault(fn, {})
        _registry.LOWERINGS[op] = new
        for s in self._specs:
            s.lowering = new
            s.cache = per_spec.setdefault(s.op, {})
        _registry.overrides = (*_registry.overrides, (op, id(fn)))
        self._active = True

    def remove(self) -> None:
        """Go back to the lowering that was in place before."""
        if not self._active:
            return
        self._active = False
        _registry.LOWERINGS[self.op] = self._old
        for s, cache in zip(self._specs, self._saved):
            s.lowering = self._old
            s.cache = cache
        mine = (self.op, id(self.fn))
        i = len(_registry.overrides) - 1 - _registry.overrides[::-1].index(mine)
        _registry.overrides = _registry.overrides[:i] + _registry.overrides[i + 1 :]

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def check_override(op, fn, *args, rtol=None, atol=None, **kwargs) -> dict:
    """Run ``op(*args, **kwargs)`` with its default lowering and with ``fn`` in its place
    and compare the outputs and the gradients of the floating tensor arguments (of the
    outputs' sum weighted by fixed random numbers), as ``torch.testing.assert_close`` does
    (``rtol``/``atol``: its tolerances). Raises AssertionError naming what differs;
    returns the largest absolute difference of each output and gradient."""

    def run():
        inputs = [_leaf(a) for a in args]
        kw = {k: _leaf(v) for k, v in kwargs.items()}
        out = op(*inputs, **kw)
        outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(o, torch.Tensor)]
        leaves = [t for t in [*inputs, *kw.values()] if isinstance(t, torch.Tensor) and t.requires_grad]
        floats = [o for o in outs if o.requires_grad]
        grads = []
        if leaves and floats:
            gen = torch.Generator().manual_seed(0)
            total = sum((o * torch.rand(o.shape, generator=gen, dtype=o.dtype).to(o.device)).sum() for o in floats)
            grads = torch.autograd.grad(total, leaves, allow_unused=True)
        return [o.detach().cpu() for o in outs], [None if g is None else g.cpu() for g in grads]

    expected = run()
    with override(op, fn):
        got = run()
    report = {}
    for kind, gs, es in (("output", got[0], expected[0]), ("gradient", got[1], expected[1])):
        for i, (g, e) in enumerate(zip(gs, es)):
            if g is None or e is None:
                if (g is None) != (e is None):
                    raise AssertionError(f"{op} {kind} {i}: one run gives none")
                continue
            torch.testing.assert_close(g, e, rtol=rtol, atol=atol, msg=lambda m, k=kind, i=i: f"{op} {k} {i}: {m}")
            diff = (
                0.0
                if not g.numel()
                else float((g - e).abs().max())
                if g.is_complex()
                else float((g.double() - e.double()).abs().max())
            )
            report[f"{kind} {i}"] = diff
    return report


def _leaf(a):
    if not isinstance(a, torch.Tensor):
        return a
    t = a.detach().clone()
    if t.is_floating_point() or t.is_complex():
        t.requires_grad_(True)
    return t
