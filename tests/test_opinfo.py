"""Conformance with PyTorch's OpInfo database: every OpInfo's float32 sample inputs run
on jax and on CPU and must agree (values, dtype, shape). The CPU fallback is allowed
here (ops without a lowering run on the CPU and still must agree); the coverage issue
tightens this. Every exclusion sits in EXCLUDED with its reason.
"""

from __future__ import annotations

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

import torch_jax

# OpInfo name (with variant) -> why its float32 samples are not compared value by value
EXCLUDED = {
}

# ops whose results are random: only shape and dtype are compared
RANDOM = {
    "bernoulli", "normal", "normal.number_mean", "multinomial", "rand_like", "randn_like", "randint", "randint_like",
    "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d", "nn.functional.alpha_dropout",
    "nn.functional.feature_alpha_dropout.with_train", "nn.functional.feature_alpha_dropout.without_train",
    "nn.functional.rrelu", "uniform", "exponential", "geometric", "log_normal", "cauchy", "empty", "empty_like",
    "new_empty", "empty_strided", "new_empty_strided", "empty_permuted", "torch.ops.aten._efficientzerotensor",
    "randn", "rand",
}


def _name(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


OPS = [op for op in op_db if torch.float32 in op.supported_dtypes("cpu")]


def _to(x, device):
    if isinstance(x, torch.Tensor):
        return x.detach().to(device)
    if isinstance(x, (list, tuple)):
        return type(x)(_to(y, device) for y in x)
    if isinstance(x, dict):
        return {k: _to(v, device) for k, v in x.items()}
    return x


def _compare(got, expected, random: bool, where: str):
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{where}: got {type(got)}"
        assert got.device.type == ("jax" if expected.device.type != "cpu" else "jax") or got.device.type == "cpu"
        assert got.dtype == expected.dtype, f"{where}: dtype {got.dtype} != {expected.dtype}"
        assert got.shape == expected.shape, f"{where}: shape {tuple(got.shape)} != {tuple(expected.shape)}"
        if not random:
            torch.testing.assert_close(got.cpu(), expected, rtol=1.3e-5, atol=1e-5, equal_nan=True, msg=lambda m: f"{where}: {m}")
    elif isinstance(expected, (list, tuple)):
        assert len(got) == len(expected), where
        for i, (g, e) in enumerate(zip(got, expected)):
            _compare(g, e, random, f"{where}[{i}]")
    elif isinstance(expected, (int, float, bool, complex)) and not random:
        assert got == pytest.approx(expected, nan_ok=True, rel=1.3e-5, abs=1e-5), where


@pytest.mark.parametrize("op", OPS, ids=_name)
def test_opinfo_float32(op, allow_fallback):
    name = _name(op)
    if name in EXCLUDED:
        pytest.skip(EXCLUDED[name])
    random = name in RANDOM
    samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=False))
    assert samples, "the OpInfo has float32 samples"
    for i, sample in enumerate(samples):
        torch.manual_seed(0)
        expected = op(sample.input, *sample.args, **sample.kwargs)
        args = _to([sample.input, *sample.args], "jax")
        kwargs = _to(sample.kwargs, "jax")
        torch.manual_seed(0)
        got = op(*args, **kwargs)
        _compare(got, expected, random, f"{name} sample {i}")
