"""Max pooling against the CPU: values and indices exactly, on ties, NaN and -inf
windows, padding, dilation, ceil_mode, 1-D to 3-D, and its gradient (NOTE [Max pooling
as a scan of its window] in ops/_pool), bit for bit in every dtype."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

POOLS = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}

# (input shape, spatial dims, kernel, stride, padding, dilation, ceil_mode)
CASES = [
    ((2, 3, 9, 9), 2, 3, 2, 1, 1, False),
    ((2, 3, 10, 9), 2, 3, 2, 1, 1, True),
    ((1, 2, 11, 7), 2, (2, 3), (1, 2), (1, 0), (2, 1), False),
    ((1, 2, 11, 7), 2, (2, 3), (2, 2), (1, 1), (1, 2), True),
    ((2, 5, 8), 1, 3, 1, 0, 1, False),
    ((2, 5, 8), 1, 4, 3, 2, 1, True),
    ((1, 2, 5, 6, 7), 3, 3, (1, 2, 2), 1, 1, True),
    ((3, 6, 6), 2, 2, 2, 0, 1, False),  # no batch dim
    ((0, 3, 6, 6), 2, 2, 2, 0, 1, False),  # an empty batch
    ((1, 1, 20, 20), 2, 9, 9, 4, 1, False),  # a window over 64 elements: the reduce_window
]


def _input(shape, kind, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    if kind == "ties":
        x = torch.randint(-2, 3, shape, generator=g).float()
    else:
        x = torch.randn(shape, generator=g)
        if kind in ("nan", "-inf"):
            x[torch.rand(shape, generator=g) < (0.2 if kind == "nan" else 0.7)] = float(kind)
    return x.to(dtype)


@pytest.mark.parametrize("case", CASES, ids=[f"{len(c[0])}d-{i}" for i, c in enumerate(CASES)])
def test_max_pool_matches_cpu(case):
    shape, nd, k, s, p, d, ceil_mode = case
    pool = POOLS[nd]
    for seed, (kind, dtype) in enumerate(
        [("random", torch.float32), ("ties", torch.float32), ("nan", torch.float32), ("-inf", torch.float32),
         ("ties", torch.float64), ("ties", torch.bfloat16), ("random", torch.float16)]
    ):  # fmt: skip
        x = _input(shape, kind, dtype, seed).requires_grad_(kind in ("random", "ties"))
        xj = x.detach().to("jax").requires_grad_(x.requires_grad)
        want, want_i = pool(x, k, s, p, d, ceil_mode, return_indices=True)
        got, got_i = pool(xj, k, s, p, d, ceil_mode, return_indices=True)
        assert torch.equal(got_i.cpu(), want_i), (kind, dtype)
        assert torch.equal(got.cpu().isnan(), want.isnan()) and torch.equal(got.cpu().nan_to_num(), want.nan_to_num())
        if x.requires_grad and want.numel():
            grad = torch.randn(want.shape, generator=torch.Generator().manual_seed(seed)).to(dtype)
            want.backward(grad)
            got.backward(grad.to("jax"))
            assert torch.equal(xj.grad.cpu(), x.grad), (kind, dtype)  # (the same sums, in the same order)


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint8])
def test_integer_max_pool_matches_cpu(dtype):
    x = torch.randint(0, 5, (2, 3, 9, 9), generator=torch.Generator().manual_seed(0)).to(dtype)
    want, want_i = F.max_pool2d(x, 3, 2, 1, return_indices=True)
    got, got_i = F.max_pool2d(x.to("jax"), 3, 2, 1, return_indices=True)
    assert torch.equal(got.cpu(), want) and torch.equal(got_i.cpu(), want_i)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_adaptive_max_pool_gradient_sums_as_on_cpu(dtype):
    x = torch.randint(-2, 3, (1, 2, 5, 6, 7), generator=torch.Generator().manual_seed(0)).to(dtype).requires_grad_()
    xj = x.detach().to("jax").requires_grad_()
    want, got = F.adaptive_max_pool3d(x, (2, 3, 4)), F.adaptive_max_pool3d(xj, (2, 3, 4))
    grad = torch.randn(want.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    want.backward(grad)
    got.backward(grad.to("jax"))
    assert torch.equal(xj.grad.cpu(), x.grad)
