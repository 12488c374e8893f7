"""The lowering table: aten op overload -> pure JAX function.

NOTE [One lowering table]: every executor runs the same table. A lowering is a pure
function from JAX arrays (and Python scalars) to JAX arrays, written once for the
functional overload of an op; the executor derives the in-place (``add_.Tensor``)
and ``out=`` (``add.out``) variants from the op's schema. A lowering receives every
schema argument positionally, in schema order, defaults filled in: Tensor arguments
as JAX arrays (or Python scalars, which PyTorch passes for wrapped numbers), Scalar
arguments as traced values (so a changing learning rate does not recompile), all
other arguments (ints, int lists, bools, dtypes, strings) as static Python values.

Ops that are deliberately not lowered are declared with :func:`cpu_fallback` and a
reason; anything else that reaches the device without a lowering also runs on the
CPU, but is reported as undeclared.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class Lowering:
    op: torch._ops.OpOverload
    fn: Callable
    static: frozenset  # Scalar arguments that are compile-time constants for this op
    random: bool  # the lowering draws random numbers (ctx.rng_key)
    trust_meta: bool  # output metadata from the Meta kernel (False: from JAX, where they disagree with CPU)
    traced: frozenset = frozenset()  # float arguments passed at run time (not compiled in)
    meta: bool = True  # False: PyTorch's Meta kernel rejects valid arguments; JAX gives the outputs
    oracle: bool = True  # False: the op's CPU kernel is not PyTorch's (a user's JAX op): no CPU replays


LOWERINGS: dict[torch._ops.OpOverload, Lowering] = {}
DECLARED_FALLBACKS: dict[torch._ops.OpOverload, str] = {}
overrides: tuple = ()  # (op, id(fn)) of the user functions in place of lowerings (NOTE [Overriding a lowering])


def lower(*ops, static=(), random=False, trust_meta=True, traced=(), meta=True, oracle=True):
    """Register ``fn`` as the lowering of each op overload in ``ops``.

    None in ``ops`` is an op this torch does not have (``_compat.aten_op``): skipped.
    Scalar (``number``) arguments are run-time inputs unless named in ``static``;
    ``float`` arguments are compile-time constants unless named in ``traced`` (a
    learning rate that a scheduler changes every step must not recompile the op)."""

    def deco(fn):
        for op in ops:
            if op is None:  # an op this torch does not have (torch_jax/_compat)
                continue
            if not isinstance(op, torch._ops.OpOverload):
                raise TypeError(f"lower() takes op overloads (aten.add.Tensor), got {op!r}")
            if op in LOWERINGS or op in DECLARED_FALLBACKS:
                raise RuntimeError(f"torch_jax: {op} is registered twice in the lowering table")
            LOWERINGS[op] = Lowering(op, fn, frozenset(static), random, trust_meta, frozenset(traced), meta, oracle)
        return fn

    return deco


def cpu_fallback(op, reason: str) -> None:
    """Declare that ``op`` runs through the CPU fallback on purpose."""
    if op in LOWERINGS or op in DECLARED_FALLBACKS:
        raise RuntimeError(f"torch_jax: {op} is registered twice in the lowering table")
    DECLARED_FALLBACKS[op] = reason
