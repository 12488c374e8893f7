"""Strided nested tensors on jax match the CPU.

Each case is a program run twice, on CPU and on jax; everything it returns (nested
tensors are compared component by component) must match in values, dtype and shape,
and a nested result must be nested, on jax, with the CPU's nested sizes.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import torch_jax
from conftest import config_as

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


def _backward(d, program):
    """Gradients of the components of an ``as_nested_tensor`` through ``program``."""
    leaves = [p.to(d).requires_grad_() for p in parts()]
    out = program(torch.nested.as_nested_tensor(leaves))
    out = torch.nested.to_padded_tensor(out, 0.0) if out.is_nested else out
    (out * dense(d, *out.shape)).sum().backward()
    return [leaf.grad for leaf in leaves]


CASES = {
    # creation and transfers
    "nested_tensor": lambda d: nt(d),
    "as_nested_tensor": lambda d: torch.nested.as_nested_tensor([p.to(d) for p in parts()]),
    "to_device": lambda d: nt("cpu").to(d),
    "to_dtype": lambda d: nt(d).to(torch.float64),
    "nested_from_padded": lambda d: torch._nested_from_padded(dense(d, 2, 4, 3), torch.tensor([[2, 3], [4, 3]])),
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
    "masked_fill": lambda d: nt(d).masked_fill(nt(d, seed=1) > 0, -1.0),
    "threshold_backward": lambda d: torch.ops.aten.threshold_backward(nt(d), nt(d, seed=1), 0.0),
    "gelu_backward": lambda d: torch.ops.aten.gelu_backward(nt(d), nt(d, seed=1)),
    "silu_backward": lambda d: torch.ops.aten.silu_backward(nt(d), nt(d, seed=1)),
    # reductions and normalization
    "sum_last": lambda d: nt(d).sum(-1, keepdim=True),
    "sum_ragged_last": lambda d: nt(d, [(2, 3), (4, 5)]).sum(-1, keepdim=True),
    "all_last": lambda d: (nt(d) > -1).all(-1),
    "all_keepdim": lambda d: torch.ops.aten.all.dim(nt(d) > 0, -1, True),
    "cat_last": lambda d: torch.cat([nt(d), nt(d, seed=1)], -1),
    "cat_batch": lambda d: torch.cat([nt(d), nt(d, [(1, 3)], seed=1)], 0),
    "safe_softmax": lambda d: torch.ops.aten._safe_softmax(nt(d), -1),
    "softmax": lambda d: nt(d).softmax(-1),
    "softmax_ragged_dim": lambda d: nt(d).softmax(1),
    "layer_norm": lambda d: F.layer_norm(nt(d), (3,), dense(d, 3), dense(d, 3, seed=8)),
    "layer_norm_eps": lambda d: F.layer_norm(nt(d, [(2, 5), (1, 5)]), (5,), dense(d, 5), dense(d, 5), eps=0.5),
    # matrix products
    "bmm": lambda d: nt(d).bmm(nt(d, [(3, 5), (3, 2)], seed=1)),
    "matmul": lambda d: torch.matmul(nt(d), nt(d, [(3, 5), (3, 2)], seed=1)),
    "matmul_4d": lambda d: torch.matmul(nt(d, [(2, 3, 4), (2, 5, 4)]), nt(d, [(2, 4, 3), (2, 4, 1)], seed=1)),
    "linear": lambda d: F.linear(nt(d), dense(d, 5, 3)),
    "linear_bias": lambda d: F.linear(nt(d), dense(d, 5, 3), dense(d, 5, seed=8)),
    "embedding": lambda d: F.embedding(ints(d), dense(d, 10, 4)),
    # shapes and views
    "unbind": lambda d: nt(d).unbind(),
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
    "narrow": lambda d: nt(d, [(2, 3), (4, 3), (1, 3)]).narrow(0, 1, 2),
    "chunk": lambda d: nt(d, [(2, 4), (4, 4)]).chunk(2, -1),
    "split_with_sizes": lambda d: nt(d, [(2, 5), (4, 5)]).split_with_sizes([2, 3], -1),
    "select_batch": lambda d: nt(d).select(0, 1),
    "getitem": lambda d: nt(d)[0],
    "getitem_inner": lambda d: nt(d)[1, 2],
    "to_padded": lambda d: torch.nested.to_padded_tensor(nt(d), 0.0),
    "to_padded_value": lambda d: torch.nested.to_padded_tensor(nt(d), -1.5),
    "to_padded_output_size": lambda d: torch.nested.to_padded_tensor(nt(d), 0.0, (2, 5, 4)),
    "to_padded_3d": lambda d: torch.nested.to_padded_tensor(nt(d, [(2, 3, 4), (1, 2, 4)]), 0.0),
    "to_padded_transposed": lambda d: torch.nested.to_padded_tensor(nt(d).transpose(1, 2).contiguous(), 0.0),
    "is_same_size": lambda d: torch.ones(1).to(d) * nt(d).is_same_size(nt(d, seed=3)),
    # copies, fills and factories
    "clone": lambda d: nt(d).clone(),
    "detach": lambda d: nt(d).detach(),
    "copy_": lambda d: nt(d).copy_(nt(d, seed=1)),
    "fill_": lambda d: nt(d).fill_(2.0),
    "fill_tensor": lambda d: nt(d).fill_(torch.tensor(3.0).to(d)),
    "zero_": lambda d: nt(d).zero_(),
    "ones_like": lambda d: torch.ones_like(nt(d)),
    "empty_like_shape": lambda d: torch.empty_like(nt(d)).zero_(),
    "dropout_eval": lambda d: F.dropout(nt(d), 0.5, training=False),
    "dropout_p0": lambda d: F.dropout(nt(d), 0.0),
    "dropout_p1": lambda d: F.dropout(nt(d), 1.0),
    # (random ops: what does not depend on the random numbers; y is 0 or 2x)
    "dropout_scale": lambda d: (lambda x, y: (y * (y - 2 * x) == 0).all(-1))(x := nt(d), F.dropout(x, 0.5)),
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
}


def _components(x):
    """A result as plain CPU tensors: a nested tensor becomes its components."""
    if isinstance(x, torch.Tensor) and x.is_nested:
        return {"nested_sizes": x._nested_tensor_size(), "components": [c.detach().cpu() for c in x.unbind()]}
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


@pytest.mark.parametrize("name", sorted(CASES))
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
}


@pytest.mark.parametrize("name", sorted(ERROR_CASES))
def test_errors_match_cpu(name):
    with pytest.raises(Exception) as cpu:
        ERROR_CASES[name]("cpu")
    with config_as(fallback="silent"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(type(cpu.value)) as jax:
            ERROR_CASES[name]("jax")
    assert str(jax.value).splitlines()[0] == str(cpu.value).splitlines()[0]


def test_no_fallback_in_the_cases():
    """The CASES run without the CPU fallback (the autouse fixture forbids it); this
    checks that nothing in them reached it anyway."""
    torch_jax.reset_stats()
    for name in ("sin", "sum_last", "layer_norm", "grad_layer_norm", "grad_sum", "gt_scalar"):
        CASES[name]("jax")
    assert torch_jax.stats()["fallbacks"] == 0
