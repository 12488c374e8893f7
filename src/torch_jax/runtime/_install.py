"""Registers every kernel of the ``jax`` device with PyTorch's dispatcher.

For each op in the lowering table this registers the functional kernel and derives,
from the schemas, the in-place kernel (``add_.Tensor`` writes ``add.Tensor``'s result
into self) and the ``out=`` kernel (``add.out`` runs ``add.Tensor`` and copies into
out). Hand-written kernels (allocation, views, copies) are registered as they are.
"""

from __future__ import annotations

import atexit
import collections
import functools
import os
import sys
import warnings

import jax
import torch

from torch_jax._config import config
from torch_jax.runtime import _compile_cache, _executor, _stats

aten = torch.ops.aten
_TENSOR_OPTIONS = ("dtype", "layout", "device", "pin_memory")
_lib = None
REGISTERED: dict = {}  # op overload -> how it is implemented ("lowered", "inplace", "out", "kernel")


def _signature(op, skip=()):
    return tuple(
        (a.name, str(a.type))
        for a in op._schema.arguments
        if a.name not in skip and not (a.alias_info is not None and a.alias_info.is_write and a.kwarg_only)
    )


def _out_args(op):
    return [a.name for a in op._schema.arguments if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write]


def _inplace_variant(op):
    packet = getattr(aten, op._schema.name.split("::")[1] + "_", None)
    if packet is None:
        return None
    inplace = getattr(packet, op._overloadname, None)
    if inplace is None:
        return None
    args = inplace._schema.arguments
    if not args or args[0].alias_info is None or not args[0].alias_info.is_write:
        return None
    if _signature(inplace) != _signature(op):
        return None
    return inplace


def _out_variant(op):
    packet = getattr(aten, op._schema.name.split("::")[1])
    for name in packet.overloads():
        cand = getattr(packet, name)
        if cand is op or not _out_args(cand) or _list_out(cand):
            continue
        # tensor options the out= overload lacks come from the out tensor (cumsum.out keeps dtype)
        have = {a.name for a in cand._schema.arguments}
        if _signature(cand) == _signature(op, skip=[o for o in _TENSOR_OPTIONS if o not in have]):
            return cand
    return None


def _list_out(op) -> bool:
    """An out= overload writing a Tensor[] (``_foreach_add.List_out``): not derived,
    :func:`write_out` copies single tensors."""
    return any(str(a.type).startswith("List") for a in op._schema.arguments if a.name in _out_args(op))


def _make_kernel(op, body: str, namespace: dict):
    """A Python function with the op's schema as its signature (defaults included), so
    the dispatcher's positional and keyword arguments land in schema order."""
    params, names = [], []
    kw = False
    for i, a in enumerate(op._schema.arguments):
        name = _executor.safe_name(a.name)
        if a.kwarg_only and not kw:
            params.append("*")
            kw = True
        if a.has_default_value():
            namespace[f"_d{i}"] = a.default_value
            params.append(f"{name}=_d{i}")
        else:
            params.append(name)
        names.append(name)
    src = f"def kernel({', '.join(params)}):\n    {body.replace('ARGS', ', '.join(names) + ',')}\n"
    # (a file name inside the package: Dynamo's skip list names files, and a kernel that a
    # compiled function's eager part calls must be skipped as the rest of the runtime is,
    # NOTE [Dynamo skips the runtime] in compile/_route)
    exec(compile(src, os.path.join(os.path.dirname(__file__), f"<torch_jax kernel {op}>"), "exec"), namespace)
    kernel = namespace["kernel"]
    kernel.__name__ = str(op).replace(".", "_")
    return kernel


def _functional_kernel(spec):
    return _make_kernel(spec.op, "return _run(_spec, (ARGS))", {"_run": _executor.run, "_spec": spec})


def _out_kernel(out_op, spec):
    """``op.out(..., out=o)``: run the functional op, then resize and copy into ``o``."""
    functional_args = []
    out_names = _out_args(out_op)
    have = {a.name for a in out_op._schema.arguments}
    for a in spec.op._schema.arguments:
        if a.name in have:
            functional_args.append(_executor.safe_name(a.name))
        elif a.name == "dtype":
            functional_args.append(f"{out_names[0]}.dtype")
        elif a.name == "device":
            functional_args.append(f"{out_names[0]}.device")
        else:
            functional_args.append("None")
    body = (
        f"return _write_out(_run(_spec, ({', '.join(functional_args)},)), "
        f"({', '.join(_executor.safe_name(n) for n in out_names)},), ({', '.join(functional_args)},), _resize)"
    )
    ns = {"_run": _executor.run, "_spec": spec, "_write_out": write_out, "_resize": _FACTORY_RESIZE.get(out_op)}
    return _make_kernel(out_op, body, ns)


# NOTE [Factories' out= tensors]: the CPU's factory kernels resize their out= tensor
# themselves rather than through the resize check that warns: eye, full and randperm to
# the result's shape, silently; arange, linspace, logspace and range only when its number of
# elements differs (an out of the right size keeps its shape and is filled in order),
# arange with a warning of its own.
_FACTORY_RESIZE = {
    **dict.fromkeys(
        [aten.eye.out, aten.eye.m_out, aten.full.out, aten.randperm.out, aten.randperm.generator_out], "silent"
    ),
    **dict.fromkeys([aten.linspace.out, aten.logspace.out, aten.range.out, aten.range.out_], "numel"),
    **dict.fromkeys([aten.arange.out, aten.arange.start_out], "arange"),
}


def write_out(result, outs, inputs=(), resize=None):
    """Copy an op's result(s) into its out= tensors with PyTorch's rules: outputs are
    resized to the result's shape (warning if they held elements), except an output that
    is also an input (``ldexp_`` runs ``mul(self, ..., out=self)``); dtypes must be
    castable. ``resize``: how a factory resizes instead (NOTE [Factories' out= tensors])."""
    results = result if isinstance(result, (tuple, list)) else (result,)
    for r, o in zip(results, outs):
        if not torch.can_cast(r.dtype, o.dtype):
            raise RuntimeError(
                f"result type {_dtype_name(r.dtype)} can't be cast to the desired output type {_dtype_name(o.dtype)}"
            )
        if o.shape != r.shape and any(a is o for a in inputs):
            raise RuntimeError(f"output with shape {list(o.shape)} doesn't match the broadcast shape {list(r.shape)}")
        if resize in ("numel", "arange") and o.shape != r.shape and o.numel() == r.numel():
            r = r.reshape(o.shape)
        if o.shape != r.shape and resize is not None:
            if resize == "arange" and o.numel() != 0:
                warnings.warn(
                    f"The number of elements in the out tensor of shape {list(o.shape)} is {o.numel()} which does "
                    f"not match the computed number of elements {r.numel()}. Note that this may occur as a result "
                    f"of rounding error. The out tensor will be resized to a tensor of shape ({r.numel()},).",
                    stacklevel=3,
                )
            o.resize_(r.shape)
        elif o.shape != r.shape:
            if o.numel() != 0:
                warnings.warn(
                    f"An output with one or more elements was resized since it had shape {list(o.shape)}, "
                    f"which does not match the required output shape {list(r.shape)}. This behavior is "
                    "deprecated, and in a future PyTorch release outputs will not be resized unless they "
                    "have zero elements. You can explicitly reuse an out tensor t by resizing it, inplace, "
                    "to zero elements with t.resize_(0).",
                    stacklevel=3,
                )
            o.resize_(r.shape)
        o.copy_(r)
    return outs[0] if len(outs) == 1 else tuple(outs)


def _dtype_name(dtype) -> str:
    return {
        torch.float32: "Float",
        torch.float64: "Double",
        torch.float16: "Half",
        torch.bfloat16: "BFloat16",
        torch.int64: "Long",
        torch.int32: "Int",
        torch.int16: "Short",
        torch.int8: "Char",
        torch.uint8: "Byte",
        torch.bool: "Bool",
        torch.complex64: "ComplexFloat",
        torch.complex128: "ComplexDouble",
    }.get(dtype, str(dtype).replace("torch.", ""))


def _register(op, kernel, how: str):
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    if has(op.name(), "CompositeImplicitAutograd") and not has(op.name(), "Autograd"):
        # a backend kernel for an op whose autograd comes from its decomposition would
        # bypass autograd
        raise RuntimeError(f"torch_jax: {op} is CompositeImplicitAutograd; lower the ops it decomposes into")
    if op in REGISTERED:
        raise RuntimeError(f"torch_jax: two kernels for {op} ({REGISTERED[op]} and {how})")
    if _stats.census is not None:  # config.census
        kernel = _stats.counted(kernel, op, _PLACEMENT.get(how, how))
    _lib.impl(op, kernel, "PrivateUse1")
    REGISTERED[op] = how


# config.census's name for how each registered kind of kernel runs an op (a redirect
# runs other ops, which count too)
_PLACEMENT = {"inplace": "lowered", "out": "lowered", "redirect": "decomposed"}


_AUTOCAST = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)


def _below_autocast(kernel):
    """A kernel made of other ops runs them as one op: under ``torch.autocast("jax")``
    the ops it calls are not cast again (``addbmm_`` computes its ``addbmm`` in
    ``self``'s dtype, as a C++ backend kernel would)."""

    def run(*args, **kwargs):
        if not torch._C._is_autocast_available("jax") or not torch.is_autocast_enabled("jax"):
            return kernel(*args, **kwargs)
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST):
            return kernel(*args, **kwargs)

    run.__name__ = kernel.__name__
    return run


def _backward_on_calling_thread() -> None:
    """NOTE [Backward on jax:N]: the autograd engine sizes its device queues from the
    Python device guard, which reports one device; backward on jax:1 then trips an
    internal assert. Running backward on the calling thread avoids the device queues (and
    makes kernels run on the thread that called backward). The engine's switch for that is
    per thread, so every backward (``Tensor.backward``, ``autograd.backward`` and
    ``autograd.grad`` all go through ``_engine_run_backward``) turns it off for its own
    call: a backward on a thread other than the one that started the device (Ray Train's
    training thread, a DataLoader-style worker, a user's thread) used the queues before."""
    import torch.autograd.graph as graph

    torch.autograd.set_multithreading_enabled(False)
    run = graph._engine_run_backward
    if getattr(run, "_torch_jax", False):
        return

    @functools.wraps(run)
    def run_on_calling_thread(*args, **kwargs):
        if not torch._C._is_multithreading_enabled():
            return run(*args, **kwargs)
        with torch.autograd.set_multithreading_enabled(False):
            return run(*args, **kwargs)

    run_on_calling_thread._torch_jax = True
    # (torch.autograd imported the name from torch.autograd.graph; torch.compiler patches
    # both the same way for its tracing)
    graph._engine_run_backward = torch.autograd._engine_run_backward = run_on_calling_thread


def library() -> torch.library.Library:
    """The library that holds the device's aten kernels (the layers above add theirs)."""
    return _lib


def install():
    """Import JAX, register all kernels; returns the CPU fallback kernel."""
    global _lib
    jax.config.update("jax_enable_x64", True)  # PyTorch's int64/float64 are real
    from torch_jax import ops  # noqa: F401  (fills the lowering table)
    from torch_jax.ops._registry import LOWERINGS
    from torch_jax.runtime import _copy, _dynamic, _fallback, _foreach, _redirects
    from torch_jax.tensor import _kernels

    _lib = torch.library.Library("aten", "IMPL")  # noqa: TOR901
    if config.census:
        _stats.census = collections.Counter()
    with warnings.catch_warnings():
        # registering over the dispatcher's default PrivateUse1 kernels warns once per op
        warnings.simplefilter("ignore", UserWarning)
        for op, kernel in _kernels.kernels() + _foreach.kernels():
            _register(op, kernel, "kernel")
        # (transfers and data-dependent ops run JAX's Python: NOTE [Dynamo skips the runtime])
        for op, kernel in _copy.kernels():
            _register(op, _compile_cache.hook_off(kernel), "kernel")
        for op, kernel in _redirects.kernels():
            _register(op, _below_autocast(kernel), "redirect")
        for op, kernel in _dynamic.kernels():
            _register(op, _below_autocast(_compile_cache.hook_off(kernel)), "kernel")
        for op, kernel in _redirects.autograd_kernels():
            _lib.impl(op, kernel, "AutogradPrivateUse1")
            REGISTERED[op] = "autograd kernel"
        for op, lowering in LOWERINGS.items():
            spec = _executor.OpSpec(op, lowering, inplace=False)
            _executor.SPECS[op] = spec
            if op not in REGISTERED:
                _register(op, _functional_kernel(spec), "lowered")
            inplace = _inplace_variant(op)
            if inplace is not None and inplace not in LOWERINGS:
                ispec = _executor.OpSpec(inplace, lowering, inplace=True)
                _executor.SPECS[inplace] = ispec
                if inplace not in REGISTERED:
                    _register(inplace, _functional_kernel(ispec), "inplace")
            out = _out_variant(op)
            if out is not None and out not in LOWERINGS and out not in REGISTERED:
                _register(out, _out_kernel(out, spec), "out")
    from torch_jax.tensor import _nested

    _nested.install(_lib, _fallback._announce)  # strided nested tensors
    _backward_on_calling_thread()  # NOTE [Backward on jax:N]
    from torch_jax.runtime import _profiler

    _profiler.install()  # NOTE [Device time in torch.profiler]
    if config.debug >= 1:  # TORCH_JAX_DEBUG=1: the counters when the process ends
        atexit.register(lambda: print(f"[torch_jax] {_stats.snapshot()}", file=sys.stderr))
    return _compile_cache.hook_off(_fallback.cpu_fallback)
