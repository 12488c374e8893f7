"""Products whose left operand is a transpose (every weight gradient, ``x.t() @ grad``)
on XLA:CPU's dot: the same values as PyTorch's CPU kernels in both modes, and no product
left that contracts its left operand's leading dimension (NOTE [Weight gradients on
XLA:CPU] in ops/_matmul); and sums over leading axes of wide arrays, a Linear layer's
bias gradient (NOTE [Column sums on XLA:CPU] in ops/_reductions)."""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest
import torch

import torch_jax
from conftest import config_as
from torch_jax.ops import _matmul


@pytest.fixture(autouse=True)
def _xla_dot():
    """XLA's dot, whatever the CPU vendor's default (Intel's takes the BLAS call)."""
    with config_as(cpu_blas=False):
        yield


# (40, 64, 300) copies the transposed operand; (300, 64, 40) computes the product transposed
_SHAPES = [(40, 64, 300), (300, 64, 40), (1, 5, 1), (33, 1, 17)]


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize("m,k,n", _SHAPES)
def test_transposed_left_operand_matches_the_cpu(mode, m, k, n):
    g = torch.Generator().manual_seed(m * 100 + n)
    a = torch.randn(k, m, generator=g).t()
    b = torch.randn(k, n, generator=g)
    bias = torch.randn(n, generator=g)
    torch_jax.set_mode(mode)
    try:
        aj, bj = a.to("jax"), b.to("jax")
        got_mm = torch.mm(aj, bj).cpu()
        got_addmm = torch.addmm(bias.to("jax"), aj, bj, beta=0.5, alpha=2.0).cpu()
        got_both = torch.mm(aj, bj.t().contiguous().t()).cpu()  # (both transposed: XLA's own form)
    finally:
        torch_jax.set_mode("strict")
    torch.testing.assert_close(got_mm, torch.mm(a, b))
    torch.testing.assert_close(got_addmm, torch.addmm(bias, a, b, beta=0.5, alpha=2.0))
    torch.testing.assert_close(got_both, torch.mm(a, b))


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_linear_weight_gradient_matches_the_cpu(mode):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 200, generator=g)
    lin = torch.nn.Linear(200, 50)
    lin_j = torch.nn.Linear(200, 50)
    lin_j.load_state_dict(lin.state_dict())
    lin_j = lin_j.to("jax")
    torch_jax.set_mode(mode)
    try:
        lin_j(x.to("jax")).square().sum().backward()
        got = lin_j.weight.grad.cpu(), lin_j.bias.grad.cpu()
    finally:
        torch_jax.set_mode("strict")
    lin(x).square().sum().backward()
    # (sums of 96 float32 terms in another order than MKL's: up to a few ulps apart)
    torch.testing.assert_close(got[0], lin.weight.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got[1], lin.bias.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("m,k,n", [(40, 64, 300), (300, 64, 40)])
def test_no_product_contracts_the_left_operands_leading_dim_on_the_cpu(m, k, n):
    """The rewrite holds in the optimized program (an optimization barrier keeps XLA from
    folding the copy back into the product)."""
    x = np.ones((k, m), np.float32)
    y = np.ones((k, n), np.float32)
    hlo = jax.jit(lambda x, y: _matmul.matmul2d(x.T, y)).lower(x, y).compile().as_text()
    dots = re.findall(r"dot\([^)]*\), lhs_contracting_dims=\{(\d+)\}", hlo)
    assert dots == ["1"], dots


@pytest.mark.parametrize("row", [True, False])
def test_vector_products_compute_their_vector_once(row):
    """NOTE [Vector products on XLA:CPU] in ops/_matmul: a single row (or column) made by
    elementwise ops and multiplied by a transposed matrix is computed once, not inside
    the product's loop for every output element; the values are the CPU's."""
    import shutil

    from torch_jax.ffi import _fusion_barrier

    if jax.devices()[0].platform != "cpu":
        pytest.skip("XLA:CPU's fusion")
    if not (shutil.which("c++") or shutil.which("g++")):
        pytest.skip("no C++ compiler: no fusion barriers")
    assert _fusion_barrier.status() == "ok"
    rng = np.random.default_rng(0)
    h = rng.standard_normal((1, 256)).astype(np.float32)
    w = rng.standard_normal((2048, 256)).astype(np.float32)

    def normalized(h):  # (LayerNorm's arithmetic, without its statistics)
        return (h - 0.5) * 1.25 * 0.75 + 0.125

    def product(h, w):
        v = normalized(h)
        return _matmul.matmul2d(v, w.T) if row else _matmul.matmul2d(w, v.T)

    text = jax.jit(product).lower(h, w).compile().as_text()
    bodies = re.findall(r"^%fused_computation\S* .*?^}", text, re.M | re.S)
    assert not [b for b in bodies if " dot(" in b and " multiply(" in b], text
    expected = normalized(torch.from_numpy(h)) @ torch.from_numpy(w).T
    got = torch.from_numpy(np.array(product(h, w)))  # (a writable copy: from_numpy warns on a read-only view)
    torch.testing.assert_close(got if row else got.T, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize(
    "shape, dim", [((700, 33278), 0), ((6, 50, 20000), (0, 1)), ((3, 20001), [0]), ((4, 3, 20000), 1)]
)
def test_wide_column_sums_have_the_cpus_accuracy(mode, shape, dim):
    """XLA's own sum of a (700, 33278) array over its rows had 5.6x the CPU's error (and
    took 30x its time); (4, 3, 20000) over dim 1 is not a leading sum and keeps XLA's."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g) * 10 + 3
    exact = x.double().sum(dim)
    cpu_error = (x.sum(dim).double() - exact).abs().max().item()
    with config_as(mode=mode):
        for keepdim in (False, True):
            got = x.to("jax").sum(dim, keepdim=keepdim).cpu()
            assert got.shape == x.sum(dim, keepdim=keepdim).shape and got.dtype == torch.float32
            error = (got.double().reshape(exact.shape) - exact).abs().max().item()
            assert error <= 1.5 * cpu_error, (error, cpu_error)
        ints = (x * 100).to(torch.int64)
        torch.testing.assert_close(ints.to("jax").sum(dim).cpu(), ints.sum(dim), rtol=0, atol=0)
        flags = x > 3
        torch.testing.assert_close(flags.to("jax").sum(dim).cpu(), flags.sum(dim), rtol=0, atol=0)
        zeros = torch.zeros(shape).neg()  # (a sum of -0.0s is +0.0, as PyTorch's)
        assert not zeros.to("jax").sum(dim).cpu().signbit().any()


@pytest.mark.parametrize("shape, dim", [((5, 0), 0), ((0, 0), 0), ((2, 0, 3), (0, 1)), ((0, 20000), 0)])
def test_column_sums_of_empty_arrays_match_the_cpu(shape, dim):
    x = torch.randn(*shape)
    for keepdim in (False, True):
        torch.testing.assert_close(x.to("jax").sum(dim, keepdim=keepdim).cpu(), x.sum(dim, keepdim=keepdim))
