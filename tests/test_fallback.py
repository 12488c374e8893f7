"""The CPU fallback: ops without a lowering run on the CPU, loudly, counted, and can
be forbidden. Exercised with ops of a test library that have only a CPU kernel, so
the tests keep meaning the same thing as the lowering table grows."""

from __future__ import annotations

import warnings

import pytest
import torch

import torch_jax

_lib = torch.library.Library("torch_jax_test", "DEF")  # noqa: TOR901
_lib.define("scale(Tensor x, float s) -> Tensor")
_lib.define("scale_(Tensor(a!) x, float s) -> Tensor(a!)")
_lib.define("halves(Tensor x) -> (Tensor, Tensor)")
_lib.define("first_row(Tensor(a) x) -> Tensor(a)")
_lib.define("count_positive(Tensor x) -> int")
_lib.impl("scale", lambda x, s: x * s, "CPU")
_lib.impl("scale_", lambda x, s: x.mul_(s), "CPU")
_lib.impl("halves", lambda x: (x[: len(x) // 2].clone(), x[len(x) // 2 :].clone()), "CPU")
_lib.impl("first_row", lambda x: x[0], "CPU")
_lib.impl("count_positive", lambda x: int((x > 0).sum()), "CPU")
ops = torch.ops.torch_jax_test


def test_fallback_runs_on_cpu_and_counts(allow_fallback):
    torch_jax.reset_stats()
    x = torch.arange(6.0, device="jax")
    y = ops.scale(x, 2.0)
    assert y.device == torch.device("jax:0")
    assert y.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    ops.scale(x, 3.0)
    s = torch_jax.stats()
    assert s["fallback_ops"]["torch_jax_test::scale"] == 2
    assert s["fallbacks"] == 2


def test_fallback_writes_back_mutated_views(allow_fallback):
    x = torch.arange(12.0, device="jax").reshape(3, 4)
    col = x[:, 1]
    out = ops.scale_(col, 10.0)
    assert out is col
    expected = torch.arange(12.0).reshape(3, 4)
    expected[:, 1] *= 10
    assert torch.equal(x.cpu(), expected)


def test_fallback_multiple_outputs_views_and_scalars(allow_fallback):
    x = torch.arange(6.0, device="jax")
    a, b = ops.halves(x)
    assert a.tolist() == [0.0, 1.0, 2.0] and b.tolist() == [3.0, 4.0, 5.0]
    m = torch.arange(6.0, device="jax").reshape(2, 3)
    row = ops.first_row(m)
    row.add_(100)  # a view returned by the fallback aliases its input on the device
    assert m.tolist() == [[100.0, 101.0, 102.0], [3.0, 4.0, 5.0]]
    assert ops.count_positive(torch.tensor([-1.0, 2.0, 3.0], device="jax")) == 2


def test_warn_mode_warns_once_per_op():
    torch_jax.config.fallback = "warn"
    from torch_jax.runtime import _fallback

    _fallback._warned.discard("torch_jax_test::scale")
    x = torch.ones(2, device="jax")
    with pytest.warns(
        torch_jax.FallbackWarning,
        match=r"torch_jax_test::scale has no JAX lowering.*TORCH_JAX_FALLBACK=silent.*TORCH_JAX_FALLBACK=error",
    ) as record:
        ops.scale(x, 2.0)
    assert record[0].filename == __file__  # (the warning names the line that called the op)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ops.scale(x, 2.0)  # no second warning


def test_silent_mode_does_not_warn():
    torch_jax.config.fallback = "silent"
    from torch_jax.runtime import _fallback

    _fallback._warned.discard("torch_jax_test::scale")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ops.scale(torch.ones(2, device="jax"), 2.0).tolist() == [2.0, 2.0]


def test_error_mode_raises():
    torch_jax.config.fallback = "error"
    with pytest.raises(
        NotImplementedError, match="torch_jax_test::scale has no JAX lowering and TORCH_JAX_FALLBACK=error"
    ):
        ops.scale(torch.ones(2, device="jax"), 2.0)


def test_fallback_mode_from_environment():
    import os
    import subprocess
    import sys

    code = (
        "import torch; x = torch.ones(2, device='jax');"
        "lib = torch.library.Library('tjt', 'DEF'); lib.define('f(Tensor x) -> Tensor'); lib.impl('f', lambda x: x + 1, 'CPU');"
        "torch.ops.tjt.f(x)"
    )
    env = dict(os.environ, TORCH_JAX_FALLBACK="error")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode != 0 and "TORCH_JAX_FALLBACK=error" in out.stderr
    env["TORCH_JAX_FALLBACK"] = "warn"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and "FallbackWarning" in out.stderr


def test_bad_fallback_setting_is_rejected():
    with pytest.raises(ValueError, match="config.fallback must be one of"):
        torch_jax.config.fallback = "sometimes"
