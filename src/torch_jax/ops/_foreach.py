"""The foreach ops (``torch._foreach_add_(params, grads, alpha=-lr)``), each one
computation over a whole list of tensors, as CUDA's multi-tensor kernels are.

NOTE [Foreach ops]: PyTorch's CPU runs a foreach op as a loop of the per-tensor op
(``add_`` on each pair), and the ``torch.optim`` optimizers call them for every step
(AdamW: eight per step, each over every parameter). Lowered here, each element is the
per-tensor op's own lowering, so the values are the per-tensor op's, and the whole
list is one cached XLA computation in strict mode and one recorded node in fused mode
(a step of AdamW over 52 parameters: 8 ops instead of 416). The kernels in
runtime/_foreach take this route only where it cannot differ from the loop (the
conditions CUDA's fast route checks, and no tensor that the loop would read after
writing it); anything else runs the loop, as CUDA's slow route does.
"""

from __future__ import annotations

import jax.numpy as jnp

from torch_jax.ops import _context
from torch_jax.ops._registry import LOWERINGS, aten, lower

# foreach op -> (per-tensor op, how its arguments become each element's arguments);
# runtime/_foreach reads this table for the loop
PER_TENSOR: dict = {}


def _each(per_op, elements, out_dtypes):
    """The per-tensor op's lowering applied to each element's arguments, each traced in
    its own context (its output dtype; value checks go to the foreach op's)."""
    outer = _context.current()
    fn = LOWERINGS[per_op].fn
    results = []
    for args, dtype in zip(elements, out_dtypes):
        ctx = _context.TraceContext(per_op, [dtype], outer.index, checks=outer.checks)
        with _context.tracing(ctx):
            results.append(fn(*args))
    return results


def _register(op, per_op, arrange, inplace: bool, **options):
    PER_TENSOR[op] = (per_op, arrange)

    def lowering(*args):
        self = args[0]
        dtypes = [s.dtype for s in self] if inplace else _context.current().out_dtypes
        results = _each(per_op, arrange(*args), dtypes)
        return (results,) if inplace else results

    lower(op, **options)(lowering)


def _variants(name: str, overload: str, per_op, arrange, **options):
    """The functional and in-place overloads (those PyTorch has) of ``_foreach_<name>``."""
    for packet, inplace in ((f"_foreach_{name}", False), (f"_foreach_{name}_", True)):
        op = getattr(getattr(aten, packet, None), overload, None)
        if op is not None:
            _register(op, per_op, arrange, inplace, **options)


def _pairs(self, other, *rest):
    return [(s, o, *rest) for s, o in zip(self, other)]


def _with_scalar(self, scalar, *rest):
    return [(s, scalar, *rest) for s in self]


def _with_scalars(self, scalars):
    return [(s, c) for s, c in zip(self, scalars)]


def _triples(self, t1, t2, value):
    return [(s, a, b, value) for s, a, b in zip(self, t1, t2)]


def _triples_scalars(self, t1, t2, scalars):
    return [(s, a, b, c) for s, a, b, c in zip(self, t1, t2, scalars)]


def _lerp_lists(self, ends, weights):
    return [(s, e, w) for s, e, w in zip(self, ends, weights)]


def _lerp_scalar(self, ends, weight):
    return [(s, e, weight) for s, e in zip(self, ends)]


def _alone(self):
    return [(s,) for s in self]


for _name in ("add", "sub", "mul", "div"):
    _tensor, _scalar = getattr(aten, _name).Tensor, getattr(aten, _name).Scalar
    _variants(_name, "List", _tensor, _pairs)
    _variants(_name, "Tensor", _tensor, _with_scalar)  # (one tensor for every element)
    _variants(_name, "Scalar", _scalar, _with_scalar)
    _variants(_name, "ScalarList", _scalar, _with_scalars)

for _name in ("addcmul", "addcdiv"):
    _variants(_name, "Scalar", getattr(aten, _name).default, _triples)
    _variants(_name, "ScalarList", getattr(aten, _name).default, _triples_scalars)

_variants("lerp", "List", aten.lerp.Tensor, _lerp_lists)
_variants("lerp", "Scalar", aten.lerp.Scalar, _lerp_scalar)
_variants("lerp", "ScalarList", aten.lerp.Scalar, _lerp_lists)
_variants("maximum", "List", aten.maximum.default, _pairs)
_variants("minimum", "List", aten.minimum.default, _pairs)

for _name in ("sqrt", "abs", "neg", "sign", "reciprocal", "exp"):
    _variants(_name, "default", getattr(aten, _name).default, _alone)


def _norm_elements(self, ord, dtype):
    return [(s, ord, None, False, dtype) for s in self]


_variants("norm", "Scalar", aten.linalg_vector_norm.default, _norm_elements, static=("ord",))

PER_TENSOR[aten._foreach_zero_.default] = (aten.zero_.default, _alone)


@lower(aten._foreach_zero_.default)
def foreach_zero_(self):
    return ([jnp.zeros_like(s) for s in self],)
