"""2-D matrix products of fused graphs on XLA:CPU through PyTorch's BLAS (NOTE [Matrix
products through PyTorch's BLAS] in ffi/_cpu_blas): the same results as PyTorch's CPU
kernels for every layout of the operands, the transposes folded into the BLAS call, XLA's
dot where the BLAS does not apply, is turned off or outside fused graphs, and a working
device when the handler cannot be built."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch_jax
from conftest import config_as
from torch_jax._config import _intel_cpu
from torch_jax.ffi import _cpu_blas


@pytest.fixture(autouse=True)
def _blas_on():
    """The BLAS call is tested on every CPU, whatever its vendor's default."""
    with config_as(cpu_blas=True):
        yield


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/cpuinfo")
def test_the_default_is_the_blas_call_on_intel_cpus_only():
    env = {k: v for k, v in os.environ.items() if k != "TORCH_JAX_CPU_BLAS"}
    script = "import torch_jax; print(torch_jax.config.cpu_blas)"
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split()[-1] == str(_intel_cpu())
    with open("/proc/cpuinfo") as f:
        vendors = {line.split(":")[1].strip() for line in f if line.startswith("vendor_id")}
    assert _intel_cpu() == (vendors == {"GenuineIntel"})
    env["TORCH_JAX_CPU_BLAS"] = "1"
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split()[-1] == "True"


def test_the_handler_builds_where_a_compiler_and_mkl_are():
    if not (shutil.which("c++") or shutil.which("g++")) or not torch.backends.mkl.is_available():
        pytest.skip("no C++ compiler or no MKL in this torch build: products use XLA's dot")
    assert _cpu_blas.status() == "ok"


def _operand(shape, transposed, dtype, g):
    """A (rows, cols) operand, stored transposed (a view) when asked."""
    if transposed:
        return torch.randn(shape[::-1], generator=g, dtype=dtype).t()
    return torch.randn(shape, generator=g, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("m,k,n", [(1, 7, 5), (300, 257, 129), (67, 300, 400), (1, 1, 1)])
def test_mm_matches_the_cpu_for_every_layout(dtype, ta, tb, m, k, n):
    g = torch.Generator().manual_seed(m * 1000 + n)
    a, b = _operand((m, k), ta, dtype, g), _operand((k, n), tb, dtype, g)
    with torch_jax.fused():
        got = torch.mm(a.to("jax"), b.to("jax")).cpu()
    # as accurate as the CPU's own product, against the exact (float64 or longer) one: the CPU's
    # kernel for a layout may add in another order than the BLAS call (torch 2.14's does for some)
    exact = torch.mm(a.to(torch.float64), b.to(torch.float64)) if dtype == torch.float32 else _exact_mm(a, b)
    cpu_error = (torch.mm(a, b).to(torch.float64) - exact).abs().max().item()
    error = (got.to(torch.float64) - exact).abs().max().item()
    assert got.dtype == dtype and got.shape == (m, n)
    assert error <= 1.5 * cpu_error + 4 * torch.finfo(dtype).eps, (error, cpu_error)


def _exact_mm(a, b):
    """A float64 product with its sums in extended precision (numpy's longdouble)."""
    import numpy as np

    return torch.from_numpy((a.numpy().astype(np.longdouble) @ b.numpy().astype(np.longdouble)).astype(np.float64))


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_linear_forward_and_backward(mode):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(130, 96, generator=g, requires_grad=True)
    lin = torch.nn.Linear(96, 200)
    xj = x.detach().to("jax").requires_grad_()
    lj = torch.nn.Linear(96, 200).to("jax")
    lj.load_state_dict(lin.state_dict())
    dy = torch.randn(130, 200, generator=g)
    lin(x).backward(dy)
    with torch_jax.fused() if mode == "fused" else contextlib.nullcontext():
        lj(xj).backward(dy.to("jax"))
        got = [xj.grad.cpu(), lj.weight.grad.cpu(), lj.bias.grad.cpu()]
    for mine, theirs in zip(got, [x.grad, lin.weight.grad, lin.bias.grad]):
        torch.testing.assert_close(mine, theirs)


def test_addmm_and_matmul_of_slices_and_empty_products():
    g = torch.Generator().manual_seed(1)
    base = torch.randn(40, 60, generator=g)
    w = torch.randn(30, 50, generator=g)
    bias = torch.randn(50, generator=g)
    a = base[::2, 5:35]  # a strided view: read by XLA, multiplied by the BLAS
    with torch_jax.fused():
        got = torch.addmm(bias.to("jax"), base.to("jax")[::2, 5:35], w.to("jax"), beta=0.5, alpha=2.0).cpu()
        torch.testing.assert_close(got, torch.addmm(bias, a, w, beta=0.5, alpha=2.0))
        for shape_a, shape_b in [((0, 4), (4, 3)), ((3, 0), (0, 5)), ((2, 4), (4, 0))]:
            x, y = torch.randn(shape_a), torch.randn(shape_b)
            torch.testing.assert_close(torch.mm(x.to("jax"), y.to("jax")).cpu(), torch.mm(x, y))


def _hlo(fn, *args) -> str:
    with _cpu_blas.in_graph():
        return jax.jit(fn).lower(*args).as_text()


def test_a_transpose_becomes_the_blas_flag():
    if _cpu_blas.status() != "ok":
        pytest.skip(f"products use XLA's dot here: {_cpu_blas.status()}")
    a = jnp.ones((8, 16), jnp.float32)
    b = jnp.ones((4, 16), jnp.float32)
    text = _hlo(lambda a, b: _cpu_blas.matmul(a, b.T), a, b)
    assert "tj_gemm_f32" in text and "trans_b = 1" in text and "trans_a = 0" in text
    assert "transpose" not in text
    text = _hlo(lambda a, b: _cpu_blas.matmul(a.T, b.T.T), jnp.ones((16, 8)), jnp.ones((16, 4)))
    assert "trans_a = 1" in text
    # the primitive means XLA's dot off the CPU (and is right on the CPU without the handler)
    lowered = jax.jit(lambda a, b: _cpu_blas.gemm_p.bind(a, b, trans_a=False, trans_b=True)).lower(a, b)
    np.testing.assert_allclose(np.asarray(lowered.compile()(a, b)), np.asarray(a @ b.T))


def test_where_xla_computes_the_product():
    captured = []

    def record(a, b):
        captured.append(_cpu_blas.matmul(a, b))
        return a

    def trace(shape_a, shape_b, dtype=jnp.float32, graph=True):
        args = jax.ShapeDtypeStruct(shape_a, dtype), jax.ShapeDtypeStruct(shape_b, dtype)
        with _cpu_blas.in_graph() if graph else contextlib.nullcontext():
            jax.eval_shape(lambda a, b: record(a, b), *args)  # (a new function: eval_shape caches traces)
        return captured.pop()

    assert trace((2, 3), (3, 4)) is not None
    assert trace((2, 3), (3, 4), graph=False) is None  # (a strict op: see the NOTE)
    assert trace((2, 3), (3, 4), jnp.bfloat16) is None
    assert trace((2, 3), (3, 4), jnp.int32) is None
    assert trace((0, 3), (3, 4)) is None  # (an empty product)
    assert trace((2, 3, 3), (2, 3, 3)) is None  # (batched: XLA's dot)
    assert _cpu_blas.matmul(jnp.ones((2, 2)), jnp.ones((2, 2))) is None  # (not traced)
    before = torch_jax.config.cpu_blas
    try:
        torch_jax.config.cpu_blas = False
        assert trace((2, 3), (3, 4)) is None
        g = torch.Generator().manual_seed(2)
        a, b = torch.randn(33, 17, generator=g), torch.randn(17, 9, generator=g)
        with torch_jax.fused():
            torch.testing.assert_close(torch.mm(a.to("jax"), b.to("jax").t().t()).cpu(), a @ b)
    finally:
        torch_jax.config.cpu_blas = before


def test_without_a_compiler_products_use_xla(tmp_path):
    """And depthwise convolutions run without fusion barriers (ffi/_fusion_barrier)."""
    script = textwrap.dedent(
        """
        import torch, torch_jax
        from torch_jax.ffi import _cpu_blas, _fusion_barrier
        a, b = torch.randn(20, 30), torch.randn(30, 10)
        x, w = torch.randn(2, 4, 9, 9), torch.randn(4, 1, 3, 3)
        with torch_jax.fused():
            torch.testing.assert_close(torch.mm(a.to("jax"), b.to("jax")).cpu(), a @ b)
            got = torch.nn.functional.conv2d(x.to("jax"), w.to("jax"), groups=4).cpu()
            torch.testing.assert_close(got, torch.nn.functional.conv2d(x, w, groups=4))
        print(_cpu_blas.status())
        print(_fusion_barrier.status())
        """
    )
    env = dict(os.environ, CXX="/bin/false", TORCH_JAX_CACHE_DIR=str(tmp_path), TORCH_JAX_CPU_BLAS="1")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "building cpu_gemm.cc failed" in done.stdout
    assert "building fusion_barrier.cc failed" in done.stdout
