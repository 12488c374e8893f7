"""Strided nested tensors on jax match the CPU.

Each case is a program run twice, on CPU and on jax; everything it returns (nested
tensors are compared component by component) must match in values, dtype and shape,
and a nested result must be nested, on jax, with the CPU's nested sizes, strides and
storage offsets. The cases cover what PyTorch's own strided nested tests exercise
(test/test_nestedtensor.py: TestNestedTensor, TestNestedTensorDeviceType,
TestNestedTensorAutograd), the errors included (ERROR_CASES).
"""

from __future__ import annotations

import io
import warnings

import pytest
import torch
import torch.nn.functional as F

import torch_jax
from conftest import config_as, fused_share

# (constructing a strided nested tensor warns that the API is a prototype)
pytestmark = pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")

SHAPES = [(2, 3), (4, 3)]  # two components: (*, 3), ragged in dim 0


def parts(shapes=SHAPES, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=dtype) for s in shapes]


def nt(d, shapes=SHAPES, seed=0, dtype=torch.float32):
    return torch.nested.nested_tensor(parts(shapes, seed, dtype), device=d)


def ints(d, shapes=((3,), (5,)), high=10):
    g = torch.Generator().manual_seed(1)
    return torch.nested.nested_tensor([torch.randint(high, s, generator=g) for s in shapes], device=d)


def dense(d, *shape, seed=7):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(d)


def _then(x, *writes):
    return x


def _backward(d, program, shapes=SHAPES):
    """Gradients of the components of an ``as_nested_tensor`` through ``program``."""
    leaves = [p.to(d).requires_grad_() for p in parts(shapes)]
    _reduce(d, program(torch.nested.as_nested_tensor(leaves))).backward()
    return [leaf.grad for leaf in leaves]


def _leaf_backward(d, program, shapes=SHAPES):
    """The gradient of a nested leaf (``nested_tensor(..., requires_grad=True)``), a
    nested tensor, through ``program``."""
    leaf = torch.nested.nested_tensor(parts(shapes), device=d, requires_grad=True)
    _reduce(d, program(leaf)).backward()
    return leaf.grad


def _reduce(d, out):
    out = torch.nested.to_padded_tensor(out, 0.0) if out.is_nested else out
    return (out * dense(d, *out.shape)).sum()


def _nested_backward(d, program, shapes=SHAPES):
    """``program``'s nested result's backward from a nested gradient: the leaf's gradient."""
    leaf = torch.nested.nested_tensor(parts(shapes), device=d, requires_grad=True)
    out = program(leaf)
    out.backward(out.detach().clone() * 2)
    return leaf.grad


def _module(d, cls, *args):
    """``cls(*args)`` on ``d``, its parameters drawn from a fixed seed."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return cls(*args).to(d)


def _weights_backward(d, module, x):
    """The gradients of ``module``'s parameters through ``module(x)``."""
    _reduce(d, module(x)).backward()
    return [p.grad for p in module.parameters()]


def _input_backward(d, program, *shape):
    """The gradient of a dense leaf of ``shape`` through ``program``, which makes a
    nested tensor of it."""
    data = dense(d, *shape).requires_grad_()
    _reduce(d, program(data)).backward()
    return data.grad


def _as_nested_backward(d, grad):
    """The components' gradients of ``as_nested_tensor``, from a nested gradient."""
    leaves = [p.to(d).requires_grad_() for p in parts()]
    torch.nested.as_nested_tensor(leaves).backward(grad)
    return [leaf.grad for leaf in leaves]


def _dropout_grad(d):
    """Dropout's gradient, from a gradient equal to the input, equals its result: their
    difference (0, not random)."""
    leaf = nt(d).requires_grad_()
    out = F.dropout(leaf, 0.2)
    out.backward(leaf.detach().clone())
    return leaf.grad - out


def _mask(d):
    return torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool).to(d)


def _saved(x):
    buffer = io.BytesIO()
    torch.save(x, buffer)
    buffer.seek(0)
    return torch.load(buffer)


def _sdpa(d, q_shapes, kv_shapes, **kwargs):
    q = nt(d, q_shapes)
    k, v = nt(d, kv_shapes, seed=1), nt(d, kv_shapes, seed=2)
    return F.scaled_dot_product_attention(q, k, v, **kwargs)


def _text(d, s):
    """A string as a tensor of its bytes on ``d`` (for the comparison), the device left out."""
    return torch.tensor(list(s.replace(", device='jax:0'", "").encode())).to(d)


def empty(d):
    return torch.nested.nested_tensor([], device=d)


CASES = {
    # creation and transfers
    "nested_tensor": lambda d: nt(d),
    "as_nested_tensor": lambda d: torch.nested.as_nested_tensor([p.to(d) for p in parts()]),
    "to_device": lambda d: nt("cpu").to(d),
    "to_dtype": lambda d: nt(d).to(torch.float64),
    "nested_from_padded": lambda d: torch._nested_from_padded(dense(d, 2, 4, 3), torch.tensor([[2, 3], [4, 3]])),
    "nested_from_padded_fused": lambda d: torch._nested_from_padded(
        dense(d, 2, 2, 2, 4), torch.tensor([[1, 8], [2, 8]]), fuse_transform_0213=True
    ),
    "nested_from_mask": lambda d: torch._nested_tensor_from_mask(dense(d, 2, 4, 3), _mask(d)),
    "nested_tensor_int_lists": lambda d: torch.nested.nested_tensor([[1, 2, 3], [4]], dtype=torch.int64, device=d),
    "nested_tensor_float_lists": lambda d: torch.nested.nested_tensor(
        [[[1.0, 2.0]], [[3.0, 4.0], [5.0, 6.0]]], device=d
    ),
    "nested_tensor_empty": empty,
    "nested_tensor_empty_component": lambda d: nt(d, [(0, 3), (2, 3)]),
    "metadata": lambda d: (lambda x: (x.dim(), x.numel(), x.size(0), x.size(2), x.is_contiguous()))(nt(d)),
    "metadata_empty": lambda d: (empty(d).dim(), empty(d).numel(), empty(d).size(0), empty(d).is_contiguous()),
    "is_contiguous": lambda d: (
        nt(d).transpose(1, 2).is_contiguous(),
        nt(d).is_contiguous(memory_format=torch.contiguous_format),
        nt(d, [(2, 4), (1, 4)]).chunk(2, -1)[0].is_contiguous(),
    ),
    "repr": lambda d: _text(d, repr(ints(d, [(2,), (1,)]))),
    "repr_empty": lambda d: _text(d, repr(empty(d))),
    "save_load": lambda d: _saved(nt(d)),
    "save_load_transposed": lambda d: _saved(nt(d).transpose(1, 2)),
    "to_same": lambda d: (lambda x: (x.to(x) is x, x.to(x.dtype) is x, x.to(torch.empty_like(x)) is x, x.to(d) is x))(
        nt(d)
    ),
    "to_copy": lambda d: (lambda x: (lambda y: (y is x, y))(x.to(x, copy=True)))(nt(d)),
    "to_device_dtype": lambda d: nt("cpu").to(d, torch.float64),
    "to_cpu_and_back": lambda d: nt(d).to("cpu").sin().to(d),
    # unary elementwise
    "sin": lambda d: nt(d).sin(),
    "cos": lambda d: nt(d).cos(),
    "abs": lambda d: nt(d).abs(),
    "neg": lambda d: -nt(d),
    "sgn": lambda d: nt(d).sgn(),
    "sqrt": lambda d: nt(d).abs().sqrt(),
    "tanh": lambda d: nt(d).tanh(),
    "relu": lambda d: F.relu(nt(d)),
    "gelu": lambda d: F.gelu(nt(d)),
    "gelu_tanh": lambda d: F.gelu(nt(d), approximate="tanh"),
    "silu": lambda d: F.silu(nt(d)),
    "logical_not": lambda d: (nt(d) > 0).logical_not(),
    "isnan": lambda d: (nt(d).abs().sqrt() * 0 + nt(d).sqrt()).isnan(),
    "isinf": lambda d: (nt(d) / 0).isinf(),
    "isposinf": lambda d: (nt(d) / 0).isposinf(),
    "isneginf": lambda d: (nt(d) / 0).isneginf(),
    "abs_": lambda d: nt(d).abs_(),
    "neg_": lambda d: nt(d).neg_(),
    "tanh_": lambda d: nt(d).tanh_(),
    "relu_": lambda d: nt(d).relu_(),
    "gelu_": lambda d: torch.ops.aten.gelu_(nt(d)),
    "silu_": lambda d: F.silu(nt(d), inplace=True),
    "sgn_": lambda d: nt(d).sgn_(),
    "logical_not_": lambda d: (nt(d) > 0).logical_not_(),
    # binary elementwise
    "add": lambda d: nt(d) + nt(d, seed=1),
    "add_alpha": lambda d: torch.add(nt(d), nt(d, seed=1), alpha=2),
    "sub": lambda d: nt(d) - nt(d, seed=1),
    "mul": lambda d: nt(d) * nt(d, seed=1),
    "div": lambda d: nt(d) / nt(d, seed=1),
    "add_scalar": lambda d: nt(d) + 2.5,
    "mul_scalar": lambda d: nt(d) * 3,
    "div_scalar": lambda d: nt(d) / 4,
    "add_0dim": lambda d: nt(d) + torch.tensor(2.0).to(d),
    "sub_scalar": lambda d: nt(d) - 1,
    "add_": lambda d: nt(d).add_(nt(d, seed=1)),
    "mul_": lambda d: nt(d).mul_(nt(d, seed=1)),
    "mul_scalar_": lambda d: nt(d).mul_(-2),
    "mul_scalar_transposed": lambda d: nt(d).transpose(1, 2) * 2,
    "gt_scalar_narrowed": lambda d: nt(d, [(2, 3), (4, 3), (1, 3)]).narrow(0, 1, 2) > 0,
    "add_scalar_int": lambda d: ints(d) + 1.5,
    "eq_scalar": lambda d: nt(d).relu() == 0,
    "eq_tensor": lambda d: (nt(d) > 0) == torch.tensor(True).to(d),
    "ge_scalar": lambda d: nt(d) >= 0,
    "gt_scalar": lambda d: nt(d) > 0.5,
    "ge_scalar_transposed": lambda d: nt(d).transpose(1, 2) >= 0.0,
    "eq_scalar_transposed": lambda d: nt(d).relu().transpose(1, 2) == 0.0,
    "add_transposed": lambda d: nt(d, [(2, 3, 3), (1, 3, 3)]) + nt(d, [(2, 3, 3), (1, 3, 3)], seed=1).transpose(2, 3),
    "sub_transposed": lambda d: nt(d, [(2, 3, 3), (1, 3, 3)]) - nt(d, [(2, 3, 3), (1, 3, 3)], seed=1).transpose(2, 3),
    "div_transposed": lambda d: nt(d).transpose(1, 2) / nt(d, seed=1).transpose(1, 2),
    "div_scalar_transposed": lambda d: nt(d).transpose(1, 2) / 4.0,
    "rmul_scalar": lambda d: 10.0 * nt(d),
    "mul_0dim": lambda d: nt(d) * torch.tensor(10.0).to(d),
    "rmul_0dim": lambda d: torch.tensor(10.0).to(d) * nt(d),
    "mul_0dim_": lambda d: nt(d).mul_(torch.tensor(10.0).to(d)),
    "masked_fill_from_mask": lambda d: (lambda x: x.masked_fill(x.detach().clone().to(bool), 0))(nt(d).relu()),
    "masked_fill": lambda d: nt(d).masked_fill(nt(d, seed=1) > 0, -1.0),
    "threshold_backward": lambda d: torch.ops.aten.threshold_backward(nt(d), nt(d, seed=1), 0.0),
    "gelu_backward": lambda d: torch.ops.aten.gelu_backward(nt(d), nt(d, seed=1)),
    "silu_backward": lambda d: torch.ops.aten.silu_backward(nt(d), nt(d, seed=1)),
    # reductions and normalization
    "sum_last": lambda d: nt(d).sum(-1, keepdim=True),
    "sum_ragged_last": lambda d: nt(d, [(2, 3), (4, 5)]).sum(-1, keepdim=True),
    "sum_1d": lambda d: nt(d, [(3,), (5,)]).sum(-1, keepdim=True),
    "sum_3d": lambda d: nt(d, [(2, 3, 4), (1, 2, 4)]).sum(-1, keepdim=True),
    "sum_empty_components": lambda d: nt(d, [(0, 3), (2, 0), (1, 2)]).sum(-1, keepdim=True),
    "all_last": lambda d: (nt(d) > -1).all(-1),
    "all_keepdim": lambda d: torch.ops.aten.all.dim(nt(d) > 0, -1, True),
    "cat_last": lambda d: torch.cat([nt(d), nt(d, seed=1)], -1),
    "cat_batch": lambda d: torch.cat([nt(d), nt(d, [(1, 3)], seed=1)], 0),
    "cat_middle": lambda d: torch.cat([nt(d, [(2, 2, 3), (1, 2, 3)]), nt(d, [(2, 4, 3), (1, 4, 3)], seed=1)], 2),
    "safe_softmax": lambda d: torch.ops.aten._safe_softmax(nt(d), -1),
    "softmax": lambda d: nt(d).softmax(-1),
    "softmax_ragged_dim": lambda d: nt(d).softmax(1),
    "softmax_module": lambda d: torch.nn.Softmax(1)(nt(d)),
    "softmax_transposed": lambda d: nt(d).transpose(1, 2).softmax(-1),
    "softmax_empty": lambda d: F.softmax(empty(d), 1),
    "layer_norm": lambda d: F.layer_norm(nt(d), (3,), dense(d, 3), dense(d, 3, seed=8)),
    "layer_norm_eps": lambda d: F.layer_norm(nt(d, [(2, 5), (1, 5)]), (5,), dense(d, 5), dense(d, 5), eps=0.5),
    "layer_norm_module": lambda d: _module(d, torch.nn.LayerNorm, 3)(nt(d)),
    "layer_norm_trailing_dims": lambda d: F.layer_norm(
        nt(d, [(2, 3, 4), (1, 3, 4)]), (3, 4), dense(d, 3, 4), dense(d, 3, 4, seed=8)
    ),
    "layer_norm_last_of_3": lambda d: F.layer_norm(nt(d, [(2, 3, 4), (1, 3, 4)]), (4,), dense(d, 4), dense(d, 4)),
    # matrix products
    "bmm": lambda d: nt(d).bmm(nt(d, [(3, 5), (3, 2)], seed=1)),
    "matmul": lambda d: torch.matmul(nt(d), nt(d, [(3, 5), (3, 2)], seed=1)),
    "matmul_4d": lambda d: torch.matmul(nt(d, [(2, 3, 4), (2, 5, 4)]), nt(d, [(2, 4, 3), (2, 4, 1)], seed=1)),
    "matmul_4d_transposed": lambda d: torch.matmul(
        nt(d, [(3, 2, 4), (2, 2, 4)]).transpose(1, 2),
        nt(d, [(3, 2, 4), (2, 2, 4)], seed=1).transpose(1, 2).transpose(2, 3),
    ),
    "matmul_dense": lambda d: torch.matmul(nt(d, [(2, 4, 5), (3, 4, 5)]), dense(d, 5, 6)),
    "bmm_transposed": lambda d: (
        nt(d, [(5, 2), (5, 3)]).transpose(1, 2).bmm(nt(d, [(4, 5), (6, 5)], seed=1).transpose(1, 2))
    ),
    "bmm_dense": lambda d: nt(d, [(2, 7), (3, 7)]).bmm(dense(d, 2, 7, 5)),
    "bmm_dense_transposed": lambda d: nt(d, [(2, 7), (3, 7)]).bmm(dense(d, 2, 5, 7).transpose(1, 2)),
    "dense_bmm": lambda d: dense(d, 2, 5, 7).bmm(nt(d, [(7, 6), (7, 5)])),
    "linear_module": lambda d: _module(d, torch.nn.Linear, 3, 2)(nt(d)),
    "sdpa_3d": lambda d: _sdpa(d, [(2, 8), (3, 8)], [(3, 8), (4, 8)]),
    "linear": lambda d: F.linear(nt(d), dense(d, 5, 3)),
    "linear_bias": lambda d: F.linear(nt(d), dense(d, 5, 3), dense(d, 5, seed=8)),
    "embedding": lambda d: F.embedding(ints(d), dense(d, 10, 4)),
    # shapes and views
    "unbind": lambda d: nt(d).unbind(),
    "unbind_transposed": lambda d: nt(d).transpose(1, 2).unbind(),
    "unbind_empty_components": lambda d: nt(d, [(0,), (2,)]).unbind(),
    "alias": lambda d: torch.ops.aten.alias(nt(d)),
    "alias_write": lambda d: _then(x := nt(d), torch.ops.aten.alias(x).mul_(2)),
    "from_padded_and_example": lambda d: torch.ops.aten._nested_from_padded_and_nested_example(
        dense(d, 2, 4, 3), nt(d)
    ),
    "transpose": lambda d: nt(d).transpose(1, 2),
    "transpose_contiguous": lambda d: nt(d).transpose(1, 2).contiguous(),
    "view": lambda d: nt(d, [(2, 6), (4, 6)]).view(2, -1, 2, 3),
    "reshape": lambda d: nt(d, [(2, 6), (4, 6)]).reshape(2, -1, 3, 2),
    "reshape_noncontiguous": lambda d: nt(d).transpose(1, 2).reshape(2, 3, -1),
    "squeeze_unsqueeze": lambda d: nt(d).unsqueeze(-1).squeeze(-1),
    "unsqueeze": lambda d: nt(d).unsqueeze(1),
    "squeeze_dim": lambda d: nt(d, [(2, 1, 3), (4, 1, 3)]).squeeze(2),
    "squeeze_dims": lambda d: nt(d, [(2, 1, 3, 1), (4, 1, 3, 1)]).squeeze((2, 4)),
    "squeeze_not_one": lambda d: nt(d).squeeze(-1),
    "unsqueeze_each_dim": lambda d: [nt(d).unsqueeze(i) for i in (-2, -1, 1, 2, 3)],
    "unsqueeze_squeeze_each_dim": lambda d: [nt(d).unsqueeze(i).squeeze(i) for i in (-2, -1, 1, 2, 3)],
    "view_noncontiguous_result": lambda d: nt(d, [(2, 20), (3, 20)]).view(2, -1, 5, 4).unbind(),
    "narrow": lambda d: nt(d, [(2, 3), (4, 3), (1, 3)]).narrow(0, 1, 2),
    "narrow_4d_is_view": lambda d: (lambda x: (lambda y: (y, y._base is x))(x.narrow(0, 1, 2)))(
        nt(d, [(2, 3, 1), (1, 2, 2), (3, 1, 2)])
    ),
    "chunk_contiguous": lambda d: [c.contiguous() for c in nt(d, [(2, 10), (4, 10)]).chunk(5, -1)],
    "chunk": lambda d: nt(d, [(2, 4), (4, 4)]).chunk(2, -1),
    "split_with_sizes": lambda d: nt(d, [(2, 5), (4, 5)]).split_with_sizes([2, 3], -1),
    "select_batch": lambda d: nt(d).select(0, 1),
    "getitem": lambda d: nt(d)[0],
    "getitem_inner": lambda d: nt(d)[1, 2],
    "getitem_negative": lambda d: nt(d)[-1],
    "getitem_ellipsis": lambda d: nt(d)[...],
    "getitem_tuples": lambda d: (lambda x: (x[0, 0, 0], x[0, 1, :], x[1, ...]))(nt(d)),
    "getitem_transposed": lambda d: nt(d).transpose(1, 2)[1],
    "getitem_write": lambda d: _then(x := nt(d), x[0].fill_(100.0), x[1, 1, :].fill_(200.0)),
    "select_inner": lambda d: (nt(d).select(1, 0), nt(d).select(2, 1)),
    "to_padded": lambda d: torch.nested.to_padded_tensor(nt(d), 0.0),
    "to_padded_value": lambda d: torch.nested.to_padded_tensor(nt(d), -1.5),
    "to_padded_output_size": lambda d: torch.nested.to_padded_tensor(nt(d), 0.0, (2, 5, 4)),
    "to_padded_3d": lambda d: torch.nested.to_padded_tensor(nt(d, [(2, 3, 4), (1, 2, 4)]), 0.0),
    "to_padded_transposed": lambda d: torch.nested.to_padded_tensor(nt(d).transpose(1, 2).contiguous(), 0.0),
    "to_padded_1d": lambda d: torch.nested.to_padded_tensor(nt(d, [(3,), (5,), (1,)]), 42.0),
    "to_padded_4d": lambda d: torch.nested.to_padded_tensor(nt(d, [(2, 3, 2), (3, 2, 1)]), 1.0, (2, 4, 4, 3)),
    "to_padded_method": lambda d: nt(d).to_padded_tensor(4),
    "to_padded_empty": lambda d: torch.nested.to_padded_tensor(empty(d), 4),
    "is_same_size": lambda d: torch.ones(1).to(d) * nt(d).is_same_size(nt(d, seed=3)),
    # copies, fills and factories
    "clone": lambda d: nt(d).clone(),
    "clone_preserve": lambda d: nt(d).transpose(1, 2).clone(memory_format=torch.preserve_format),
    "clone_contiguous_format": lambda d: nt(d).transpose(1, 2).clone(memory_format=torch.contiguous_format),
    "clone_is_a_copy": lambda d: (lambda x: (x, x.clone().mul_(x)))(nt(d)),
    "detach_mul": lambda d: (lambda y: (y.requires_grad, y))(nt(d).requires_grad_().detach() * 4),
    "detach": lambda d: nt(d).detach(),
    "copy_": lambda d: nt(d).copy_(nt(d, seed=1)),
    "fill_": lambda d: nt(d).fill_(2.0),
    "fill_tensor": lambda d: nt(d).fill_(torch.tensor(3.0).to(d)),
    "zero_": lambda d: nt(d).zero_(),
    "ones_like": lambda d: torch.ones_like(nt(d)),
    "zeros_like": lambda d: torch.zeros_like(nt(d)),
    "randn_like": lambda d: torch.randn_like(nt(d)).isnan(),
    "empty_like_dtype": lambda d: torch.empty_like(nt(d), dtype=torch.float64).zero_(),
    "empty_like_transposed": lambda d: (lambda y: (y.is_contiguous(), y._nested_tensor_strides().tolist()))(
        torch.empty_like(nt(d).transpose(1, 2))
    ),
    "empty_like_contiguous_format": lambda d: torch.empty_like(
        nt(d).transpose(1, 2), memory_format=torch.contiguous_format
    ).zero_(),
    "empty_like_requires_grad": lambda d: torch.empty_like(nt(d), requires_grad=True).requires_grad,
    "empty_like_shape": lambda d: torch.empty_like(nt(d)).zero_(),
    "dropout_eval": lambda d: F.dropout(nt(d), 0.5, training=False),
    "dropout_p0": lambda d: F.dropout(nt(d), 0.0),
    "dropout_p1": lambda d: F.dropout(nt(d), 1.0),
    "dropout_module": lambda d: (torch.nn.Dropout(0.0)(nt(d)), torch.nn.Dropout(1.0)(nt(d))),
    "dropout_empty": lambda d: F.dropout(empty(d), 0.5),
    # (random ops: what does not depend on the random numbers; y is 0 or 2x)
    "dropout_scale": lambda d: (lambda x, y: (y * (y - 2 * x) == 0).all(-1))(x := nt(d), F.dropout(x, 0.5)),
    "dropout_scale_transposed": lambda d: (lambda x, y: (y * (y - 2 * x) == 0).all(-1))(
        nt(d).transpose(1, 2).contiguous(), F.dropout(nt(d).transpose(1, 2), 0.5).contiguous()
    ),
    "normal_": lambda d: nt(d).normal_().isnan(),
    # autograd: gradients reach the components of as_nested_tensor
    "grad_sin": lambda d: _backward(d, torch.sin),
    "grad_mul_add": lambda d: _backward(d, lambda x: x * x + x),
    "grad_relu": lambda d: _backward(d, F.relu),
    "grad_gelu": lambda d: _backward(d, F.gelu),
    "grad_softmax": lambda d: _backward(d, lambda x: x.softmax(-1)),
    "grad_linear": lambda d: _backward(d, lambda x: F.linear(x, dense(d, 5, 3))),
    "grad_layer_norm": lambda d: _backward(d, lambda x: F.layer_norm(x, (3,), dense(d, 3), dense(d, 3, seed=8))),
    "grad_sum": lambda d: _backward(d, lambda x: x.sum(-1, keepdim=True)),
    "grad_transpose_bmm": lambda d: _backward(d, lambda x: x.bmm(x.transpose(1, 2))),
    "grad_unbind": lambda d: _backward(d, lambda x: x.unbind()[1] * 2),
    "grad_select": lambda d: _backward(d, lambda x: x[1] * 2),
    "grad_matmul": lambda d: _backward(d, lambda x: torch.matmul(x, nt(d, [(3, 5), (3, 2)], seed=1))),
    "grad_dropout_eval": lambda d: _backward(d, lambda x: F.dropout(x, 0.3, training=False)),
    "grad_scalar_ops": lambda d: _backward(d, lambda x: (x * 3 + 1) / 2),
    "grad_masked_fill": lambda d: _backward(d, lambda x: x.masked_fill(nt(d, seed=1) > 0, 0.0)),
    "grad_abs": lambda d: _backward(d, torch.abs),
    "grad_silu": lambda d: _backward(d, F.silu),
    "grad_detach": lambda d: _backward(d, lambda x: x + (x * 2).detach()),
    "grad_sub_transposed": lambda d: _backward(d, lambda x: x - nt(d, [(3, 2), (3, 4)], seed=1).transpose(1, 2)),
    "grad_transpose": lambda d: _nested_backward(d, lambda x: x.transpose(-2, -1)),
    "grad_reshape": lambda d: _backward(d, lambda x: x.reshape(2, -1, 2, 3), [(2, 6), (3, 6)]),
    "grad_squeeze": lambda d: _backward(d, lambda x: x.squeeze(-1), [(2, 3, 1), (4, 3, 1)]),
    "grad_unsqueeze": lambda d: _backward(d, lambda x: x.unsqueeze(-1)),
    "grad_matmul_4d": lambda d: _backward(
        d, lambda x: torch.matmul(x, nt(d, [(2, 3, 4), (2, 3, 5)], seed=1)), [(2, 2, 3), (2, 3, 3)]
    ),
    "grad_linear_bias": lambda d: _backward(d, lambda x: F.linear(x, dense(d, 5, 3), dense(d, 5, seed=8))),
    "grad_linear_weights": lambda d: _weights_backward(
        d, _module(d, torch.nn.Linear, 3, 2), torch.nested.as_nested_tensor([p.to(d) for p in parts()])
    ),
    "grad_layer_norm_weights": lambda d: _weights_backward(d, _module(d, torch.nn.LayerNorm, 3), nt(d)),
    "grad_layer_norm_trailing_dims": lambda d: _backward(
        d, lambda x: F.layer_norm(x, (3, 4), dense(d, 3, 4), dense(d, 3, 4, seed=8)), [(2, 3, 4), (1, 3, 4)]
    ),
    "grad_values": lambda d: _backward(d, lambda x: x.values()),
    "grad_values_exp": lambda d: _backward(d, lambda x: (x.values() * 2).exp()),
    "grad_unbind_transposed": lambda d: _backward(d, lambda x: x.transpose(-1, -2).unbind()[0].pow(2)),
    "grad_split_with_sizes": lambda d: _backward(
        d, lambda x: x.split_with_sizes([2, 3], dim=-1)[1].unbind()[0].pow(2), [(2, 5), (4, 5)]
    ),
    "grad_to_padded_value": lambda d: _backward(d, lambda x: torch.nested.to_padded_tensor(x, 1.0)),
    "grad_sdpa": lambda d: _backward(
        d, lambda x: F.scaled_dot_product_attention(x, x.clone(), x.clone()), [(1, 4, 2), (1, 8, 2)]
    ),
    "grad_from_mask": lambda d: _input_backward(d, lambda t: torch._nested_tensor_from_mask(t, _mask(d)), 2, 4, 3),
    "grad_from_padded": lambda d: _input_backward(
        d, lambda t: torch._nested_from_padded(t, torch.tensor([[1, 2], [2, 2]])), 2, 2, 2
    ),
    "grad_from_padded_fused": lambda d: _input_backward(
        d, lambda t: torch._nested_from_padded(t, torch.tensor([[1, 8], [2, 8]]), fuse_transform_0213=True), 2, 2, 2, 4
    ),
    # autograd: a nested leaf (nested_tensor(..., requires_grad=True)) gets a nested gradient
    "leaf_grad_sin": lambda d: _leaf_backward(d, torch.sin),
    "leaf_grad_getitem": lambda d: _leaf_backward(d, lambda x: x[0]),
    "leaf_grad_to_padded": lambda d: _leaf_backward(d, lambda x: x),  # (_leaf_backward pads)
    "leaf_grad_bmm": lambda d: _leaf_backward(d, lambda x: x.bmm(x.transpose(1, 2))),
    "leaf_grad_sum": lambda d: _leaf_backward(d, lambda x: x.sum(-1, keepdim=True)),
    "leaf_grad_dropout": _dropout_grad,
    "nested_grad_sin": lambda d: _nested_backward(d, torch.sin),
    "nested_grad_sum": lambda d: _nested_backward(d, lambda x: x.sum(-1, keepdim=True)),
    "nested_grad_as_nested": lambda d: _as_nested_backward(d, nt(d, seed=3)),
}


def _components(x):
    """A result as plain CPU tensors: a nested tensor becomes its components."""
    if isinstance(x, torch.Tensor) and x.is_nested:
        return {
            "nested_sizes": x._nested_tensor_size(),
            "nested_strides": x._nested_tensor_strides(),
            "offsets": x._nested_tensor_storage_offsets(),
            "components": [c.detach().cpu() for c in x.unbind()],
        }
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, (list, tuple)):
        return [_components(y) for y in x]
    return x


def _devices(x):
    if isinstance(x, torch.Tensor):
        return [x.device.type]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in _devices(y)]
    return []


@pytest.mark.parametrize("name", fused_share(sorted(CASES), 2))
def test_matches_cpu(name):
    program = CASES[name]
    expected = program("cpu")
    got = program("jax")
    assert set(_devices(got)) <= {"jax"}, f"results on {_devices(got)}"
    torch.testing.assert_close(_components(got), _components(expected), equal_nan=True)


def _matmul_out(d):
    out = nt(d, [(2, 5), (4, 2)], seed=2)
    result = torch.matmul(nt(d), nt(d, [(3, 5), (3, 2)], seed=1), out=out)
    return result is out, out


# ops that run through the CPU fallback (NOTE [Nested kernels redispatch to the CPU's]):
# name -> (program, the aten op the fallback counts)
FALLBACK_CASES = {
    "matmul_out": (_matmul_out, "aten::matmul.out"),
    "is_pinned": (lambda d: torch.ones(1).to(d) * nt(d).is_pinned(), "aten::is_pinned"),
}


@pytest.mark.parametrize("name", sorted(FALLBACK_CASES))
def test_fallback_matches_cpu_and_is_counted(name):
    program, op = FALLBACK_CASES[name]
    expected = program("cpu")
    with config_as(fallback="error"), pytest.raises(NotImplementedError, match=op):
        program("jax")
    torch_jax.reset_stats()
    with config_as(fallback="silent"):
        got = program("jax")
    assert torch_jax.stats()["fallback_ops"].get(op, 0) >= 1
    assert set(_devices(got)) <= {"jax"}, f"results on {_devices(got)}"
    torch.testing.assert_close(_components(got), _components(expected))


# programs the CPU rejects: jax raises the same error
ERROR_CASES = {
    "sin_noncontiguous": lambda d: nt(d).transpose(1, 2).sin(),
    "softmax_batch_dim": lambda d: nt(d).softmax(0),
    "sum_no_keepdim": lambda d: nt(d).sum(-1),
    "sum_ragged_dim": lambda d: nt(d).sum(1, keepdim=True),
    "layer_norm_noncontiguous": lambda d: F.layer_norm(
        nt(d, [(3, 3), (3, 3)]).transpose(1, 2), (3,), *[dense(d, 3)] * 2
    ),
    "layer_norm_no_weight": lambda d: torch.ops.aten.native_layer_norm(nt(d), [3], None, None, 1e-5),
    "add_dense": lambda d: nt(d) + dense(d, 2, 1, 3),
    "bmm_shapes": lambda d: nt(d).bmm(nt(d)),
    # (from PyTorch's test/test_nestedtensor.py)
    "nested_tensor_dims": lambda d: torch.nested.nested_tensor([torch.tensor(1.0), torch.tensor([])], device=d),
    "nested_tensor_of_tensor": lambda d: torch.nested.nested_tensor(torch.tensor([3.0]), device=d),
    "unbind_dim1": lambda d: nt(d).unbind(1),
    "size": lambda d: nt(d).size(),
    "size_irregular": lambda d: nt(d).size(1),
    "stride": lambda d: nt(d).stride(),
    "getitem_empty": lambda d: empty(d)[0],
    "from_mask_gaps": lambda d: torch._nested_tensor_from_mask(
        dense(d, 2, 3, 2), torch.tensor([[1, 0, 1], [1, 1, 0]]).bool().to(d)
    ),
    "getitem_out_of_range": lambda d: nt(d)[2],
    "getitem_negative_out_of_range": lambda d: nt(d)[-3],
    "getitem_slice": lambda d: nt(d)[:],
    "getitem_slice_tuple": lambda d: nt(d)[:, 1, 1],
    "getitem_inner_out_of_range": lambda d: nt(d)[1, 4, 2],
    "select_out_of_range": lambda d: nt(d).select(2, 5),
    "copy_sizes": lambda d: nt(d, [(2,)]).copy_(nt(d)),
    "fill_1d_tensor": lambda d: nt(d).fill_(torch.tensor([1.0]).to(d)),
    "cat_dense": lambda d: torch.cat([nt(d), dense(d, 2, 4, 3)], -1),
    "cat_dims": lambda d: torch.cat([nt(d), nt(d, [(2, 3, 1), (4, 3, 1)])], -1),
    "cat_transposed": lambda d: torch.cat([nt(d).transpose(1, 2), nt(d).transpose(1, 2)], -1),
    "cat_two_ragged_dims": lambda d: torch.cat([nt(d, [(2, 3, 2), (4, 1, 2)])] * 2, -1),
    "cat_ragged_not_next_to_batch": lambda d: torch.cat([nt(d, [(2, 3), (2, 4)])] * 2, 1),
    "cat_batch_sizes": lambda d: torch.cat([nt(d), nt(d, [(2, 3)])], -1),
    "cat_ragged_structures": lambda d: torch.cat([nt(d), nt(d, [(4, 3), (2, 3)])], -1),
    "layer_norm_irregular": lambda d: F.layer_norm(nt(d), (4, 3), dense(d, 4, 3), dense(d, 4, 3)),
    "layer_norm_shape": lambda d: F.layer_norm(nt(d), (5,), dense(d, 5), dense(d, 5)),
    "to_padded_transposed": lambda d: torch.nested.to_padded_tensor(nt(d).transpose(1, 2), 0.0),
    "to_padded_zero_numel": lambda d: torch.nested.to_padded_tensor(nt(d, [(1, 0), (0, 0)]), 0.0),
    "chunk_ragged_dim": lambda d: nt(d).chunk(5, 1),
    "chunk_batch_dim": lambda d: nt(d).chunk(5, 0),
    "chunk_transposed": lambda d: nt(d).transpose(1, 2).chunk(2, -1),
    "chunk_indivisible": lambda d: nt(d).chunk(2, -1),
    "chunk_backward": lambda d: (lambda c: c.backward(c.clone()))(
        torch.nested.as_nested_tensor([p.to(d).requires_grad_() for p in parts([(2, 4), (3, 4)])]).chunk(2, -1)[0]
    ),
    "split_with_sizes_ragged_dim": lambda d: nt(d).split_with_sizes([1, 2], 1),
    "split_with_sizes_transposed": lambda d: nt(d).transpose(1, 2).split_with_sizes([1, 1], -1),
    "split_with_sizes_sum": lambda d: nt(d).split_with_sizes([1, 1], -1),
    "mul_vector": lambda d: nt(d).mul(torch.tensor([10.0]).to(d)),
    "vector_mul": lambda d: torch.tensor([10.0]).to(d).mul(nt(d)),
    "mul_vector_": lambda d: nt(d).mul_(torch.tensor([10.0]).to(d)),
    "vector_mul_": lambda d: torch.tensor([10.0]).to(d).mul_(nt(d)),
    "scalar_mul_": lambda d: torch.tensor(10.0).to(d).mul_(nt(d)),
    "div_strides": lambda d: torch.nested.nested_tensor([p.t() for p in parts()], device=d).transpose(1, 2) / nt(d),
    "div_offsets": lambda d: (lambda c: c[0] / c[1])(nt(d, [(3, 4), (4, 4)]).chunk(2, -1)),
    "sum_batch_dim": lambda d: ints(d).sum(0, keepdim=True),
    "sum_two_dims": lambda d: nt(d).sum([0, 1], keepdim=True),
    "clone_channels_last": lambda d: nt(d).clone(memory_format=torch.channels_last),
    "empty_like_channels_last": lambda d: torch.empty_like(nt(d), memory_format=torch.channels_last),
    "dropout_p": lambda d: F.dropout(nt(d), 1.1),
    "softmax_minus_3": lambda d: nt(d).softmax(-3),
    "softmax_out_of_range": lambda d: nt(d).softmax(3),
    "softmax_scalars": lambda d: torch.nested.nested_tensor([torch.tensor(0.0), torch.tensor(1.0)], device=d).softmax(
        0
    ),
    "bmm_2d": lambda d: nt(d, [(2,), (3,)]).bmm(nt(d)),
    "bmm_batch_sizes": lambda d: nt(d, [(2, 4), (3, 4)]).bmm(nt(d, [(4, 6), (4, 5), (4, 7)])),
    "matmul_dense_1d": lambda d: torch.matmul(nt(d, [(2,), (3,)]), dense(d, 4)),
    "dense_1d_matmul": lambda d: torch.matmul(dense(d, 4), nt(d, [(2,), (3,)])),
    "matmul_2d": lambda d: torch.matmul(nt(d, [(2,), (3,)]), nt(d)),
    "matmul_batch_sizes": lambda d: torch.matmul(nt(d, [(2, 4), (3, 4)]), nt(d, [(4, 6), (4, 5), (4, 7)])),
    "matmul_batch_dims": lambda d: torch.matmul(nt(d, [(2, 2, 4), (1, 3, 4)]), nt(d, [(1, 4, 6), (3, 4, 5)])),
    "matmul_shapes": lambda d: torch.matmul(nt(d), nt(d)),
    "linear_2d": lambda d: F.linear(nt(d, [(1,), (2,)]), dense(d, 2, 2)),
    "linear_3d_weight": lambda d: F.linear(nt(d), dense(d, 2, 2, 3)),
    "linear_ragged_last": lambda d: F.linear(nt(d, [(1, 3), (2, 2)]), dense(d, 2, 3)),
    "linear_weight_shape": lambda d: F.linear(nt(d), dense(d, 2, 4)),
    "linear_nested_weight": lambda d: F.linear(nt(d), nt(d)),
    "linear_transposed": lambda d: F.linear(nt(d, [(3, 3), (2, 3)]).transpose(1, 2), dense(d, 2, 3)),
    "transpose_batch": lambda d: nt(d).transpose(0, 1),
    "transpose_out_of_range": lambda d: nt(d).transpose(1, 3),
    "squeeze_no_dim": lambda d: nt(d).squeeze(),
    "squeeze_batch": lambda d: nt(d).squeeze(0),
    "squeeze_out_of_range": lambda d: nt(d).squeeze(3),
    "squeeze_singletons": lambda d: nt(d, [(1,), (1,)]).squeeze(1),
    "unsqueeze_batch": lambda d: nt(d).unsqueeze(0),
    "view_empty_shape": lambda d: nt(d).view(()),
    "view_empty": lambda d: empty(d).view(-1),
    "view_batch": lambda d: nt(d).view(-1, 2, 3),
    "view_numel": lambda d: nt(d).view(2, 2, 3),
    "view_transposed": lambda d: nt(d, [(2, 20), (3, 20)]).transpose(-1, -2).view(40, -1),
    "view_two_inferred": lambda d: nt(d, [(2, 20), (3, 20)]).view(2, -1, 5, 4).view(2, -1, -1, 2, 2),
    "reshape_empty_shape": lambda d: nt(d).reshape(()),
    "reshape_batch": lambda d: nt(d).reshape(-1, 2, 3),
    "reshape_transposed": lambda d: nt(d, [(2, 20), (3, 20)]).transpose(-1, -2).reshape(40, -1),
    "narrow_dim1": lambda d: nt(d).narrow(1, 0, 1),
    "narrow_transposed": lambda d: nt(d).transpose(1, 2).narrow(0, 0, 1),
    "sdpa_mask": lambda d: _sdpa(d, [(2, 8), (3, 8)], [(3, 8), (4, 8)], attn_mask=ints(d, [(2, 3), (3, 4)], 2).bool()),
    "sdpa_causal": lambda d: _sdpa(d, [(2, 8), (3, 8)], [(3, 8), (4, 8)], is_causal=True),
}


@pytest.mark.parametrize("name", fused_share(sorted(ERROR_CASES), 3))
def test_errors_match_cpu(name):
    with pytest.raises(Exception) as cpu:
        ERROR_CASES[name]("cpu")
    with config_as(fallback="silent"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(type(cpu.value)) as jax:
            ERROR_CASES[name]("jax")
    # (the message of a missing kernel names the backend)
    assert str(jax.value).splitlines()[0] == str(cpu.value).splitlines()[0].replace(
        "NestedTensorCPU", "NestedTensorjax"
    )


def test_no_fallback_in_the_cases():
    """The CASES run without the CPU fallback (the autouse fixture forbids it); this
    checks that nothing in them reached it anyway."""
    torch_jax.reset_stats()
    for name in ("sin", "sum_last", "layer_norm", "grad_layer_norm", "grad_sum", "gt_scalar"):
        CASES[name]("jax")
    assert torch_jax.stats()["fallbacks"] == 0
