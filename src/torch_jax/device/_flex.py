"""FlexAttention's device check, opened for ``jax`` (NOTE [FlexAttention on jax]).

NOTE [FlexAttention on jax]: ``torch.nn.attention.flex_attention.flex_attention`` starts
with ``_validate_device``, which accepts a fixed set of device types (CUDA, CPU, XPU, HPU
and, from torch 2.13, MPS; torch 2.11 to 2.14 all name the function and its arguments
alike) and raises "FlexAttention is only supported on ..." for any other. Nothing else in
FlexAttention depends on the device type: the higher-order op's dense implementation (what
eager mode runs) is made of aten ops, and its autograd rule, unlike the CPU's check, allows
gradients. So the check is wrapped: query on ``jax`` passes, every other device gets
PyTorch's own function and error.

Under ``torch.compile`` Dynamo traces ``flex_attention`` (its module is on Dynamo's inline
list) and so reaches the wrapper, which lives in torch_jax, a package on Dynamo's skip
list (NOTE [Dynamo skips the runtime] in compile/_route): a call to a skipped function is
a graph break, and with ``fullgraph=True`` an error. So, once Dynamo is imported, the
wrapper is wrapped once more in ``torch._dynamo.dont_skip_tracing`` (torch 2.11 to 2.14
have it), a context manager that Dynamo traces and that lets it trace into the wrapper,
whose body only reads the device type, a constant of the trace. What the compiled graph
holds is then the higher-order op, which compile/_flex lowers blockwise.

Eager ``flex_attention`` runs the op's dense implementation (PyTorch compiles the op alone
with Dynamo's "eager" backend), which builds the full L x L scores, as on every device
without a fused kernel; only the compiled path is blockwise.

Nothing here imports JAX or Dynamo (NOTE [Cheap autoload]).
"""

from __future__ import annotations

import functools

NAME = "jax"


def allow_jax(flex_attention) -> None:
    """Wraps ``_validate_device`` of the module ``flex_attention`` (once)."""
    check = getattr(flex_attention, "_validate_device", None)
    if check is None or getattr(check, "_torch_jax", False):
        return

    @functools.wraps(check)
    def _validate_device(query, key, value):
        if query.device.type == NAME:
            return None
        return check(query, key, value)

    _validate_device._torch_jax = True
    flex_attention._validate_device = _validate_device
    from torch_jax.device._patches import on_import

    on_import("torch._dynamo", functools.partial(_traceable, flex_attention, _validate_device))


def _traceable(flex_attention, wrapper, dynamo) -> None:
    """The wrapper as Dynamo may trace it (NOTE [FlexAttention on jax])."""
    if flex_attention._validate_device is not wrapper:
        return
    traced = functools.wraps(wrapper)(dynamo.dont_skip_tracing(wrapper))
    traced._torch_jax = True
    flex_attention._validate_device = traced
