"""JAX functions as PyTorch operators on the ``jax`` device.

NOTE [JAX functions as operators]: :func:`jax_op` defines a ``torch.library`` operator
whose kernel on ``jax`` is the JAX function itself, put in the lowering table like an
aten op's lowering (NOTE [One lowering table] in ops/_registry). So the op runs in all
three executors with no code of its own: strict eager compiles it per argument key,
fused eager records it into the pending graph, and a ``torch.compile`` graph lowers
its node inside the graph's one computation. What PyTorch needs besides the kernel is
derived from the JAX function:

- the schema, from its annotations (``jax.Array`` is ``Tensor``), unless given;
- the fake (meta) implementation, from ``jax.eval_shape``;
- autograd, from ``jax.vjp``: the backward is a second operator, ``<name>_vjp``, whose
  lowering runs ``jax.vjp`` of the function on the saved inputs and the outputs'
  gradients. It recomputes the forward inside the backward's computation (XLA keeps
  what it needs; under ``torch.compile`` or fused eager the two share one program);
  a ``jax.custom_vjp`` function (a Pallas kernel: JAX cannot differentiate
  ``pallas_call``) brings its own rule, which ``jax.vjp`` uses;
- on the CPU, a clear error, or the CPU implementation the caller declares.

A mutating op (``mutates_args``) returns its outputs, then the new value of each
mutated argument, in schema order: JAX arrays are immutable, and the executor writes
the values back through the arguments' views as for ``add_``.
"""

from __future__ import annotations

import inspect
import types
import typing

import jax
import jax.numpy as jnp
import numpy as np
import torch

from torch_jax.ops import _registry
from torch_jax.runtime import _executor, _install, _stats
from torch_jax.tensor import _dtypes

_libraries: dict[str, torch.library.Library] = {}  # namespace -> the library our ops are defined in


def _library(namespace: str) -> torch.library.Library:
    lib = _libraries.get(namespace)
    if lib is None:
        lib = _libraries[namespace] = torch.library.Library(namespace, "FRAGMENT")  # noqa: TOR901
    return lib


def jax_op(name: str, fn=None, *, schema=None, mutates_args=(), static=(), traced=(), autograd=True, cpu=None):
    """Define the operator ``name`` ("namespace::op") whose kernel on ``jax`` is the JAX
    function ``fn``; returns its ``OpOverload`` (``torch.ops.namespace.op.default``).

    ``schema``: the argument and return types ("(Tensor x, float scale) -> Tensor"),
    inferred from ``fn``'s annotations when left out. ``mutates_args``: the names of the
    tensor arguments the op writes; ``fn`` returns the op's outputs, then their new values.
    ``static`` / ``traced``: as the lowering table's (ops/_registry.lower): number
    arguments are run-time inputs unless static, ``float`` arguments are compile-time
    constants unless traced. ``autograd``: derive the backward with ``jax.vjp`` (False:
    register your own with ``torch.library.register_autograd``). ``cpu``: a PyTorch
    function to run on CPU tensors; without it, CPU tensors raise an error.
    Usable as a decorator: ``@jax_op("mylib::softmax")``."""
    if fn is None:
        return lambda f: jax_op(
            name, f, schema=schema, mutates_args=mutates_args, static=static, traced=traced, autograd=autograd, cpu=cpu
        )
    namespace, _, opname = name.partition("::")
    if not namespace or not opname:
        raise ValueError(f'torch_jax.jax_op: the name is "namespace::op", got {name!r}')
    if schema is None:
        schema = infer_schema(fn, mutates_args)
    elif mutates_args:
        raise ValueError("torch_jax.jax_op: with a schema, mark the mutated arguments there (Tensor(a!) x)")
    lib = _library(namespace)
    lib.define(opname + schema)
    op = getattr(getattr(torch.ops, namespace), opname).default
    spec = _define(lib, op, _positional(fn, op), static, traced, name, cpu)
    if autograd and not spec.writes:
        _derive_autograd(lib, op, fn, static, traced, name)
    return op


def _define(lib, op, lowering_fn, static, traced, name, cpu):
    """Put ``op`` in the lowering table and register its kernels and fake implementation."""
    opname = op._schema.name.split("::")[1]

    def lowering(*vals):  # (lists as Python lists: torch.compile's graphs hold fx's own list type)
        return lowering_fn(*[list(v) if isinstance(v, list) else v for v in vals])

    _registry.lower(op, static=static, traced=traced, oracle=False)(lowering)
    spec = _executor.SPECS[op] = _executor.OpSpec(op, _registry.LOWERINGS[op], inplace=False)
    kernel = _install._functional_kernel(spec)
    if _stats.census is not None:  # config.census
        kernel = _stats.counted(kernel, op, "kernel")
    lib.impl(opname, kernel, "PrivateUse1")
    lib.impl(opname, cpu if cpu is not None else _no_cpu(name), "CPU")
    torch.library.register_fake(str(op._schema.name), _fake(spec), lib=lib)
    return spec


def _no_cpu(name: str):
    def kernel(*args, **kwargs):
        raise RuntimeError(
            f"{name} is a JAX op: it runs on jax tensors, and these are on the CPU. Move them with "
            f'.to("jax"), or give the op a CPU implementation (torch_jax.jax_op(..., cpu=fn))'
        )

    return kernel


def _positional(fn, op):
    """``fn`` called as a lowering is: every schema argument positionally."""
    names = [a.name for a in op._schema.arguments]
    kwonly = [a.kwarg_only for a in op._schema.arguments]
    if not any(kwonly):
        return fn

    def call(*vals):
        args = [v for v, k in zip(vals, kwonly) if not k]
        return fn(*args, **{n: v for n, v, k in zip(names, vals, kwonly) if k})

    return call


def _bind(spec, args, kwargs) -> list:
    """The op's arguments in schema order, defaults filled in."""
    vals = list(args)
    for a in spec.op._schema.arguments[len(args) :]:
        vals.append(kwargs[a.name] if a.name in kwargs else a.default_value if a.has_default_value() else None)
    return vals


def _fake(spec):
    """The fake implementation: the fresh outputs' shapes and dtypes from ``jax.eval_shape``
    of the lowering (tensors as shape structs, everything else as given)."""
    lowering = spec.lowering.fn

    def fake(*args, **kwargs):
        vals = _bind(spec, args, kwargs)
        device = next((t.device for t in _tensors(vals)), torch.device("jax"))
        slots, structs = [], []
        for i, v in enumerate(vals):
            if isinstance(v, torch.Tensor):
                slots.append((i, None))
                structs.append(_struct(v))
            elif isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
                for j, x in enumerate(v):
                    if isinstance(x, torch.Tensor):
                        slots.append((i, j))
                        structs.append(_struct(x))

        def run(*arrays):
            filled = [list(v) if isinstance(v, (list, tuple)) else v for v in vals]
            for (i, j), a in zip(slots, arrays):
                if j is None:
                    filled[i] = a
                else:
                    filled[i][j] = a
            return lowering(*filled)

        out = jax.eval_shape(run, *structs)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        fresh = [_empty(o, device) for o in outs[: None if spec.returns_list else spec.n_fresh]]
        if spec.returns_list:
            return fresh
        it = iter(fresh)
        rets = [next(it) if alias is None else vals[alias] for alias in spec.returns]
        return rets[0] if len(rets) == 1 else tuple(rets) if rets else None

    return fake


def _tensors(vals):
    for v in vals:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from (x for x in v if isinstance(x, torch.Tensor))


def _struct(t: torch.Tensor):
    return jax.ShapeDtypeStruct(tuple(int(n) for n in t.shape), _dtypes.to_np(t.dtype))


def _empty(aval, device):
    return torch.empty(aval.shape, dtype=_dtypes.to_torch(aval.dtype), device=device)


# ---------------------------------------------------------------- autograd


def _derive_autograd(lib, op, fn, static, traced, name):
    """The backward: ``<name>_vjp``, a JAX op of the forward's arguments and the outputs'
    gradients returning a gradient for each tensor argument that is not None."""
    args = op._schema.arguments
    schema = op._schema
    opname = schema.name.split("::")[1]
    grads_name = "grads"
    while any(a.name == grads_name for a in args):
        grads_name = "_" + grads_name
    # the forward's arguments, then the gradients (keyword-only, last)
    text = str(schema)
    params = text[text.index("(") + 1 : text.rindex(") ->")]
    star = "" if any(a.kwarg_only for a in args) else "*, "
    lib.define(f"{opname}_vjp({params}{', ' if params else ''}{star}Tensor?[] {grads_name}) -> Tensor[]")
    vjp_op = getattr(getattr(torch.ops, schema.name.split("::")[0]), f"{opname}_vjp").default
    forward = _positional(fn, op)
    kinds = [str(a.type) for a in args]

    def vjp_lowering(*vals):
        fvals, grads = vals[:-1], vals[-1]
        where = [i for i, k in enumerate(kinds) if "Tensor" in k and fvals[i] is not None]

        def f(*primals):
            filled = list(fvals)
            for i, p in zip(where, primals):
                filled[i] = p
            return forward(*filled)

        primals = [fvals[i] for i in where]
        out, pull = jax.vjp(f, *primals)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        cts = [_cotangent(o, g) for o, g in zip(outs, list(grads) + [None] * (len(outs) - len(grads)))]
        in_cts = pull(type(out)(cts) if isinstance(out, (tuple, list)) else cts[0])
        result = []
        for p, ct in zip(primals, in_cts):
            if isinstance(p, (list, tuple)):
                result.extend(_gradient(x, c) for x, c in zip(p, ct))
            else:
                result.append(_gradient(p, ct))
        return result

    vjp_spec = _define(lib, vjp_op, vjp_lowering, static, traced, f"{name}_vjp", None)
    assert vjp_op._schema.arguments[-1].name == grads_name
    tensor_positions = [i for i, k in enumerate(kinds) if "Tensor" in k]

    n_positional = sum(1 for a in args if not a.kwarg_only)

    def setup_context(ctx, inputs, output, keyword_only_inputs=None):
        inputs = list(inputs) + [keyword_only_inputs[a.name] for a in args if a.kwarg_only]
        saved, layout = [], []
        for i, v in enumerate(inputs):
            if i in tensor_positions and isinstance(v, (list, tuple)):
                layout.append(("list", len(v)))
                saved.extend(v)
            elif i in tensor_positions and v is not None:
                layout.append(("tensor",))
                saved.append(v)
            else:
                layout.append(("value", v))
        ctx.layout = layout
        ctx.save_for_backward(*saved)

    def backward(ctx, *grads):
        saved = iter(ctx.saved_tensors)
        vals = []
        for entry in ctx.layout:
            if entry[0] == "list":
                vals.append([next(saved) for _ in range(entry[1])])
            elif entry[0] == "tensor":
                vals.append(next(saved))
            else:
                vals.append(entry[1])
        call_args = [v for v, a in zip(vals, args) if not a.kwarg_only]
        call_kwargs = {a.name: v for v, a in zip(vals, args) if a.kwarg_only}
        call_kwargs[grads_name] = list(grads)
        flat = iter(vjp_op(*call_args, **call_kwargs))
        result = []
        for entry, v, needs in zip(ctx.layout[:n_positional], vals, ctx.needs_input_grad):
            if entry[0] == "list":
                result.append([_differentiable(x, next(flat)) for x in v])
            elif entry[0] == "tensor":
                g = next(flat)
                result.append(_differentiable(v, g) if needs else None)
            else:
                result.append(None)
        return tuple(result)

    torch.library.register_autograd(str(schema.name), backward, setup_context=setup_context, lib=lib)
    return vjp_spec


def _differentiable(x: torch.Tensor, grad):
    return grad if x.dtype.is_floating_point or x.dtype.is_complex else None


def _cotangent(out, grad):
    """The cotangent JAX's pullback takes for one output (an array or its shape struct):
    zeros where autograd gave None; float0 for outputs without gradients (integers and
    bools). Also ``call_jax``'s backward (kernels/_interop)."""
    if not jnp.issubdtype(out.dtype, jnp.inexact):
        return np.zeros(out.shape, dtype=jax.dtypes.float0)
    if grad is None:
        return jnp.zeros(out.shape, out.dtype)
    return grad.astype(out.dtype)


def _gradient(primal, ct):
    if ct is None or ct.dtype == jax.dtypes.float0:
        return jnp.zeros(jnp.shape(primal), jnp.result_type(primal))
    return ct


# ---------------------------------------------------------------- schema inference


def infer_schema(fn, mutates_args=()) -> str:
    """The schema of ``fn``'s arguments and returns from its annotations, ``jax.Array``
    read as ``torch.Tensor`` (PyTorch's ``torch.library.infer_schema`` does the rest)."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001  (string annotations it cannot resolve: as written)
        hints = dict(getattr(fn, "__annotations__", {}))
    sig = inspect.signature(fn)
    params = []
    for p in sig.parameters.values():
        if p.name not in hints:
            raise ValueError(
                f"torch_jax.jax_op: annotate {fn.__name__}'s argument {p.name!r} (jax.Array for a tensor, "
                "float, int, bool, ...) or give the op's schema"
            )
        params.append(p.replace(annotation=_torch_type(hints[p.name])))
    returns = _torch_type(hints["return"]) if "return" in hints else inspect.Signature.empty
    if returns is inspect.Signature.empty:
        raise ValueError(f"torch_jax.jax_op: annotate what {fn.__name__} returns (jax.Array, tuple[...], None)")

    def prototype():  # (infer_schema reads its signature; the annotations are objects, not strings)
        pass

    prototype.__signature__ = sig.replace(parameters=params, return_annotation=returns)
    return torch.library.infer_schema(prototype, mutates_args=tuple(mutates_args))


def _torch_type(t):
    if t is None or t is type(None):
        return None
    if t is torch.Tensor or (isinstance(t, type) and issubclass(t, jax.Array)):
        return torch.Tensor
    origin = typing.get_origin(t)
    if origin is None:
        return t
    inner = tuple(_torch_type(x) for x in typing.get_args(t))
    if origin is typing.Union or origin is types.UnionType:
        return typing.Optional[next(x for x in inner if x is not None)]  # noqa: UP045 (torch reads typing.Optional)
    if origin in (list, tuple) or str(origin) in ("collections.abc.Sequence", "typing.Sequence"):
        if origin is tuple and Ellipsis not in inner:
            return tuple[inner]
        return list[inner[0]]
    return t
