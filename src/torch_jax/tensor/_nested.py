"""Strided nested tensors on the jax device.

A strided nested tensor (``torch.nested.nested_tensor(ts, device="jax")``) is a
``NestedTensorImpl``: one flat dense buffer, here a dense jax tensor, plus the
components' sizes, strides and offsets as CPU tensors. Its dispatch key is
``NestedTensorPrivateUse1``, for which PyTorch registers no kernels.

NOTE [Nested kernels redispatch to the CPU's]: most of PyTorch's nested kernels are
registered for ``NestedTensorCPU`` and ``NestedTensorCUDA`` with one C++ function that
only rearranges metadata and calls ``at::`` ops on the buffer (``sin`` runs ``at::sin``
on the buffer and wraps the result with the same metadata). Those kernels are
device-generic: registered for ``NestedTensorPrivateUse1`` as a redispatch to the
``NestedTensorCPU`` kernel, the ops they call on the buffer dispatch to the dense jax
kernels, so a nested op runs through the same lowerings as a dense (or jagged) one.
A few CPU kernels instead read the buffer's memory through its data pointer, which
on this device is a fake address: run on a jax buffer they would crash the process.
Only the ops in ``_REDISPATCH`` redispatch: each was run on jax by the programs of
tests/test_nested.py, in a subprocess so that a crash could not take the prober down,
and matched the CPU; every other op with a ``NestedTensorCPU`` kernel
runs on the CPU through :func:`_cpu_fallback`, announced and counted like the dense
CPU fallback.
"""

from __future__ import annotations

import torch
from torch._C import DispatchKey, DispatchKeySet

_KEY = "NestedTensorPrivateUse1"
_CPU = DispatchKeySet(DispatchKey.NestedTensorCPU)

# NestedTensorCPU kernels that ran on jax nested tensors and matched the CPU (NOTE
# [Nested kernels redispatch to the CPU's]); add an op only with a case in
# tests/test_nested.py that reaches it, run first in a subprocess. Kept out, on the CPU fallback: sum.dim_IntList and _nested_sum_backward
# (they read the buffer through its data pointer: a segfault on jax), the transformer
# fast-path kernels (_native_multi_head_attention, _transformer_encoder_layer_fwd,
# _transform_bias_rescale_qkv, _nested_tensor_softmax_with_shape, _fused_sdp_choice:
# CPU kernels, not probed), and the rest that no test runs. native_layer_norm and the
# scalar ops have Python kernels (_PYTHON_KERNELS, _SCALAR_OPS).
_REDISPATCH = frozenset(
    "aten::" + name
    for name in """
    _nested_from_padded_and_nested_example _nested_select_backward _nested_tensor_size
    _nested_tensor_storage_offsets _nested_tensor_strides _safe_softmax _softmax
    _softmax_backward_data _to_copy abs abs_ add.Tensor add_.Tensor alias all.dim bmm cat
    chunk clone copy_ cos detach div.Tensor embedding empty_like eq.Tensor fill_.Scalar
    fill_.Tensor gelu gelu_ gelu_backward is_same_size isinf isnan isneginf isposinf
    linear linear_backward logical_not logical_not_ masked_fill.Scalar matmul
    matmul_backward mul.Tensor mul_.Tensor narrow native_dropout native_dropout_backward
    neg neg_ normal_ ones_like relu relu_ select.int sgn sgn_ silu silu_ silu_backward sin
    split_with_sizes sqrt squeeze squeeze.dim squeeze.dims sub.Tensor tanh tanh_ threshold_backward
    to_padded_tensor transpose.int unbind.int unsqueeze values view where.self_out zero_
    """.split()
)


def _overload(name: str):
    """``"aten::add.Tensor"`` -> ``torch.ops.aten.add.Tensor``."""
    base, _, overload = name.split("::", 1)[1].partition(".")
    return getattr(getattr(torch.ops.aten, base), overload or "default")


def nested_cpu_ops() -> list[str]:
    """Every aten op with a NestedTensorCPU kernel, as ``"aten::name.overload"``."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    names = torch._C._dispatch_get_all_op_names()
    return sorted(n for n in names if n.startswith("aten::") and has(n, "NestedTensorCPU"))


def _redispatch(op, keys=_CPU):
    def kernel(*args, **kwargs):
        return op.redispatch(keys, *args, **kwargs)

    kernel.__name__ = f"nested_{op._opname}"
    return kernel


# NOTE [Nested ops with a scalar]: a nested kernel whose other operand is a Python
# scalar (``nt > 0.5``, ``nt * 3``) calls the dense op on the buffer with a "wrapped
# number" tensor, which reaches a Python kernel as a Python scalar where the schema says
# Tensor (``gt.Tensor(buffer, 0.5)``), and a redispatch of ``add.Tensor(nt, 2.5)``
# cannot take the scalar either. These run here instead, as the CPU kernels do: the
# op's dense ``.Scalar`` overload on the whole buffer, the result wrapped with the
# operand's sizes, strides and offsets (an in-place op writes the buffer itself).
_SCALAR_OPS = frozenset(
    {"aten::mul.Scalar", "aten::mul_.Scalar", "aten::div.Scalar", "aten::eq.Scalar", "aten::ge.Scalar"}
    | {"aten::gt.Scalar", "aten::add.Tensor", "aten::add_.Tensor", "aten::sub.Tensor", "aten::mul.Tensor"}
    | {"aten::mul_.Tensor", "aten::div.Tensor", "aten::eq.Tensor"}
)


def _with_scalars(op, tensor_kernel):
    """``op``'s kernel: on the buffer when its second operand is a Python scalar,
    ``tensor_kernel`` otherwise (NOTE [Nested ops with a scalar])."""
    packet = getattr(torch.ops.aten, op._schema.name.split("::")[1])
    scalar_op = getattr(packet, "Scalar", op)
    inplace = op._schema.arguments[0].alias_info is not None

    def kernel(self, other, *args, **kwargs):
        if isinstance(other, torch.Tensor):
            return tensor_kernel(self, other, *args, **kwargs)
        buffer = torch.ops.aten.values.default(self)  # the whole storage, 1-d
        result = scalar_op(buffer, other, *args, **kwargs)
        return self if inplace else _wrap_like(self, result)

    kernel.__name__ = f"nested_scalar_{op._opname}"
    return kernel


def _wrap_like(nt, buffer):
    """A nested tensor over ``buffer`` with ``nt``'s sizes, strides and offsets."""
    meta = (nt._nested_tensor_size(), nt._nested_tensor_strides(), nt._nested_tensor_storage_offsets())
    return torch._nested_view_from_buffer(buffer, *(m.clone() for m in meta))


# NOTE [Nested layer_norm on the buffer]: the CPU's nested layer_norm calls the CPU's
# LayerNorm kernel stub on the buffer (on jax: "DispatchStub: missing kernel"). For a
# contiguous nested tensor whose components share the normalized trailing shape, the
# buffer is the rows of a dense (M, N) matrix, so the dense lowerings do the work;
# mean and rstd are (M,), as the CPU's. Any other input takes the CPU fallback, which
# raises the CPU's error where the CPU does.
def _layer_norm_rows(nt, normalized_shape):
    """``nt``'s buffer as a dense (M, N) matrix, or None when it is not one."""
    n = 1
    for s in normalized_shape:
        n *= s
    if not nt.is_contiguous() or n == 0 or nt.numel() % n:
        return None
    sizes = nt._nested_tensor_size()
    k = len(normalized_shape)
    if (
        sizes.size(0) == 0
        or sizes.size(1) < k
        or (sizes[:, sizes.size(1) - k :] != torch.tensor(normalized_shape)).any()
    ):
        return None
    return torch.ops.aten.values.default(nt)[: nt.numel()].view(-1, n)


def _native_layer_norm(fallback):
    def kernel(input, normalized_shape, weight=None, bias=None, eps=1e-5):
        rows = _layer_norm_rows(input, normalized_shape)
        if rows is None or weight is None or bias is None:
            return fallback(input, normalized_shape, weight, bias, eps)
        out, mean, rstd = torch.ops.aten.native_layer_norm.default(
            rows, [rows.size(1)], weight.view(-1), bias.view(-1), eps
        )
        return _wrap_like(input, out.view(-1)), mean.view(-1), rstd.view(-1)

    return kernel


def _native_layer_norm_backward(fallback):
    def kernel(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
        rows = _layer_norm_rows(input, normalized_shape)
        if rows is None or weight is None or bias is None or not grad_out.is_nested:
            return fallback(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask)
        grad_rows = torch.ops.aten.values.default(grad_out.contiguous())[: rows.numel()].view(rows.shape)
        dx, dw, db = torch.ops.aten.native_layer_norm_backward.default(
            grad_rows,
            rows,
            [rows.size(1)],
            mean.view(-1, 1),
            rstd.view(-1, 1),
            weight.view(-1),
            bias.view(-1),
            output_mask,
        )
        dx = _wrap_like(input, dx.reshape(-1)) if dx is not None else None
        dw = dw.view(weight.shape) if dw is not None else None
        db = db.view(bias.shape) if db is not None else None
        return dx, dw, db

    return kernel


# NOTE [Nested sum by component]: the CPU's nested sum (last dim, keepdim only) and its
# backward read the buffer through its data pointer, so they cannot run on jax; these
# compose dense ops on the components (unbind is a view of the buffer) and pack the
# results into a new nested tensor. Other arguments take the CPU fallback, which raises
# the CPU's error.
def _is_last(nt, dim) -> bool:
    return dim is not None and len(dim) == 1 and dim[0] in (-1, nt.dim() - 1)


def _sum_dim(fallback):
    def kernel(self, dim, keepdim=False, *, dtype=None):
        if not (_is_last(self, dim) and keepdim):
            return fallback(self, dim, keepdim, dtype=dtype)
        parts = [c.sum(-1, keepdim=True, dtype=dtype) for c in self.unbind()]
        return torch._nested_tensor_from_tensor_list(parts)

    return kernel


def _nested_sum_backward(fallback):
    def kernel(grad, self, dim, keepdim=False):
        if not (_is_last(self, dim) and keepdim and grad.is_nested):
            return fallback(grad, self, dim, keepdim)
        parts = [g.expand(c.shape) for g, c in zip(grad.unbind(), self.unbind())]
        return torch._nested_tensor_from_tensor_list(parts)

    return kernel


_PYTHON_KERNELS = {
    "aten::sum.dim_IntList": _sum_dim,
    "aten::_nested_sum_backward": _nested_sum_backward,
    "aten::native_layer_norm": _native_layer_norm,
    "aten::native_layer_norm_backward": _native_layer_norm_backward,
}


# dense ops that make a nested tensor from a jax tensor: the CPU kernels only build
# the nested tensor's metadata and call at:: ops (NOTE [Nested kernels redispatch to the CPU's]);
# _nested_tensor_from_mask reads the mask with at:: ops (cumsum, argmin, equal) and
# calls _nested_from_padded
_DENSE_REDISPATCH = ("aten::_nested_view_from_buffer", "aten::_nested_from_padded", "aten::_nested_tensor_from_mask")
_DENSE_CPU = DispatchKeySet(DispatchKey.CPU)


def _map(fn, x):
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_map(fn, y) for y in x)
    return x


def _is_device(x) -> bool:
    return isinstance(x, torch.Tensor) and not x.is_cpu


def _cpu_fallback(op):
    """Run ``op`` on CPU copies of its jax arguments (nested or dense); copy what it
    wrote back into the jax arguments and move its results to the jax device."""
    writes = [i for i, a in enumerate(op._schema.arguments) if a.alias_info is not None and a.alias_info.is_write]

    def kernel(*args, **kwargs):
        _announce(op)
        device = next(t.device for t in _flat(args, kwargs) if _is_device(t))
        to_cpu = {}

        def cpu(t):
            if not _is_device(t):
                return t
            return to_cpu.setdefault(id(t), (t, moved(t, "cpu")))[1]

        out = op(*_map(cpu, args), **{k: _map(cpu, v) for k, v in kwargs.items()})
        back = {id(c): t for t, c in to_cpu.values()}
        for i in writes:
            orig = args[i] if i < len(args) else kwargs.get(op._schema.arguments[i].name)
            if _is_device(orig):
                _write_back(orig, to_cpu[id(orig)][1])
        return _map(lambda r: back[id(r)] if id(r) in back else moved(r, device), out)

    kernel.__name__ = f"nested_cpu_{op._opname}"
    return kernel


def moved(t, device):
    """``t`` on ``device``; a nested tensor keeps its layout (strides and offsets) over a
    copy of its whole buffer (``.to`` would need a contiguous one)."""
    if not t.is_nested:
        return t.to(device)
    return _wrap_like(t, torch.ops.aten.values.default(t).to(device))


def _write_back(orig, cpu):
    if orig.is_nested:
        torch.ops.aten.values.default(orig).copy_(torch.ops.aten.values.default(cpu))
    else:
        orig.copy_(cpu)


def _flat(args, kwargs):
    out = []
    for x in (*args, *kwargs.values()):
        out.extend(x if isinstance(x, (list, tuple)) else [x])
    return out


_announce = None  # the runtime's CPU-fallback announcement (warns once, counts), handed in by install


def install(lib, announce) -> None:
    """Register the strided nested tensor kernels (NestedTensorPrivateUse1) into ``lib``;
    ``announce(op)`` reports an op run through the CPU fallback (runtime/_fallback's: the
    runtime sits above this layer)."""
    global _announce
    _announce = announce
    for name in nested_cpu_ops():
        op = _overload(name)
        kernel = _redispatch(op) if name in _REDISPATCH else _cpu_fallback(op)
        if name in _PYTHON_KERNELS:
            kernel = _PYTHON_KERNELS[name](kernel)
        if name in _SCALAR_OPS:
            kernel = _with_scalars(op, kernel)
        lib.impl(op, kernel, _KEY)
    for name in _DENSE_REDISPATCH:
        lib.impl(_overload(name), _redispatch(_overload(name), _DENSE_CPU), "PrivateUse1")
