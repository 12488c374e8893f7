"""scaled_dot_product_attention on jax: one lowered op (NOTE [Attention in one op] in
runtime/_redirects) where it fits, PyTorch's math path otherwise; values, gradients and
errors against PyTorch on the CPU."""

from __future__ import annotations

import contextlib
import re

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import profile

import torch_jax
from conftest import assert_same
from torch_jax import _compat

B, H, L, S, E = 2, 3, 5, 7, 8


def _ops(fn) -> set:
    with profile() as prof:
        fn()
    return {e.key for e in prof.key_averages()}


def _inputs(q_shape=(B, H, L, E), kv_shape=(B, H, S, E), dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=dtype) for s in (q_shape, kv_shape, kv_shape)]


def _check(kwargs, inputs=None, mask=None, atol=1e-5, rtol=1e-4):
    """Forward and backward on jax against the CPU, for q, k, v (and a float mask)."""
    cpu = inputs or _inputs()
    if mask is not None:
        cpu = [*cpu, mask]
    cpu = [t.clone().requires_grad_(t.is_floating_point()) for t in cpu]
    dev = [t.detach().to("jax").requires_grad_(t.requires_grad) for t in cpu]

    def run(ts):
        out = F.scaled_dot_product_attention(*ts[:3], attn_mask=ts[3] if len(ts) > 3 else None, **kwargs)
        out.backward(torch.ones_like(out) * torch.linspace(-1, 1, out.shape[-1], dtype=out.dtype, device=out.device))
        return out

    expected, got = run(cpu), run(dev)
    assert_same(got, expected.detach(), atol=atol, rtol=rtol)
    for c, d in zip(cpu, dev):
        if c.requires_grad:
            assert_same(d.grad, c.grad, atol=atol, rtol=rtol)
    return dev


def test_one_op_forward_and_backward():
    q, k, v = (t.to("jax") for t in _inputs())
    ops = _ops(lambda: F.scaled_dot_product_attention(q, k, v))
    assert "aten::_scaled_dot_product_fused_attention_overrideable" in ops
    assert "aten::_scaled_dot_product_attention_math" not in ops
    _check({})


@pytest.mark.parametrize("case", ["causal", "causal_square", "scale", "3d", "mask_and_causal"])
def test_matches_cpu(case):
    if case == "mask_and_causal":  # PyTorch's CPU kernel applies both (its math path raises)
        keep = torch.ones(L, S, dtype=torch.bool)
        keep[:, 0] = False
        cpu = _inputs()
        if _compat.sdpa_refuses_mask_with_causal():  # NOTE [attn_mask with is_causal] (torch 2.14)
            with pytest.raises(RuntimeError, match=re.escape(_compat.SDPA_MASK_WITH_CAUSAL)):
                F.scaled_dot_product_attention(*cpu, attn_mask=keep, is_causal=True)
            jax_inputs = [t.to("jax") for t in cpu]
            for block in (contextlib.nullcontext, torch_jax.fused):  # (the mode of the run, then fused)
                with block(), pytest.raises(RuntimeError, match=re.escape(_compat.SDPA_MASK_WITH_CAUSAL)):
                    F.scaled_dot_product_attention(*jax_inputs, attn_mask=keep.to("jax"), is_causal=True).cpu()
            return
        got = F.scaled_dot_product_attention(*(t.to("jax") for t in cpu), attn_mask=keep.to("jax"), is_causal=True)
        assert_same(got, F.scaled_dot_product_attention(*cpu, attn_mask=keep, is_causal=True), atol=1e-5, rtol=1e-4)
    elif case == "causal":
        _check({"is_causal": True})
    elif case == "causal_square":
        _check({"is_causal": True}, _inputs(kv_shape=(B, H, L, E)))
    elif case == "scale":
        _check({"scale": 0.3})
    else:
        _check({"is_causal": True}, _inputs((H, L, E), (H, S, E)))


def test_masks():
    g = torch.Generator().manual_seed(1)
    keep = torch.rand(B, 1, L, S, generator=g) > 0.3
    keep[..., 0] = True
    cpu = _inputs()
    got = F.scaled_dot_product_attention(*(t.to("jax") for t in cpu), attn_mask=keep.to("jax"))
    assert_same(got, F.scaled_dot_product_attention(*cpu, attn_mask=keep), atol=1e-5, rtol=1e-4)
    # the gradients under a boolean mask, also of keys and values expanded over the heads
    # (Falcon's multi-query attention) and of grouped-query heads
    _check({}, mask=keep)
    q, k, v = _inputs(kv_shape=(B, 1, S, E))
    _check({}, [q, k.expand(B, H, S, E), v.expand(B, H, S, E)], mask=keep)
    _check({"enable_gqa": True}, _inputs((B, 4, L, E), (B, 2, S, E)), mask=keep)
    # an additive float mask, broadcast over heads, with its own gradient
    _check({}, mask=torch.randn(B, 1, L, S, generator=g))
    # and masks with fewer dims, broadcast over batch (and heads, and query rows)
    _check({}, mask=torch.randn(L, S, generator=g))
    _check({}, mask=torch.randn(H, 1, S, generator=g))


def test_fully_masked_rows_are_zero_not_nan():
    keep = torch.ones(B, H, L, S, dtype=torch.bool)
    keep[:, :, 1] = False  # query 1 may attend to nothing
    cpu = _inputs()
    expected = F.scaled_dot_product_attention(*cpu, attn_mask=keep)
    got = F.scaled_dot_product_attention(*(t.to("jax") for t in cpu), attn_mask=keep.to("jax"))
    assert_same(got, expected, atol=1e-5, rtol=1e-4)
    assert not got.isnan().any()
    additive = torch.zeros(B, H, L, S).masked_fill(~keep, float("-inf"))
    dev = _check({}, mask=additive)
    assert not any(t.grad.isnan().any() for t in dev[:3])


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_other_dtypes(dtype):
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-10, "rtol": 1e-9}
    _check({"is_causal": True}, _inputs(dtype=dtype), **tol)


def test_dropout_same_numbers_in_both_modes_and_the_right_rate():
    import torch_jax

    q, k, v = (t.to("jax") for t in _inputs((1, 1, 64, 16), (1, 1, 64, 16)))
    v = torch.ones_like(v)  # each output is the kept share of its row, rescaled
    results = []
    before = torch_jax.config.mode
    try:
        for mode in ("strict", "fused"):
            torch_jax.set_mode(mode)
            torch.manual_seed(3)
            results.append(F.scaled_dot_product_attention(q, k, v, dropout_p=0.5).cpu())
    finally:
        torch_jax.set_mode(before)
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)
    torch.manual_seed(3)
    a = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    torch.manual_seed(4)
    b = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert not torch.equal(a.cpu(), b.cpu())
    # the mean of the rescaled kept weights is 1 (each row's weights sum to 1)
    assert abs(a.mean().item() - 1.0) < 0.1


def test_dropout_backward_uses_the_forward_mask():
    """The backward redraws the forward's mask from its seed and offset: the gradient of
    sum(out * g) wrt v equals p_dropped^T g, where p_dropped is read off the forward with
    v = identity."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 1, 6, 6, generator=g).to("jax")
    k = torch.randn(1, 1, 6, 6, generator=g).to("jax")
    v = torch.eye(6).reshape(1, 1, 6, 6).to("jax").requires_grad_(True)
    torch.manual_seed(7)
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.4)  # = the dropped weights
    w = torch.randn(1, 1, 6, 6, generator=g)
    out.backward(w.to("jax"))
    expected = out.detach().cpu()[0, 0].T @ w[0, 0]
    torch.testing.assert_close(v.grad.cpu()[0, 0], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", ["gqa", "broadcast_batch", "2d", "math_backend"])
def test_other_cases_take_the_math_path(case):
    if case == "gqa":
        cpu, kwargs = _inputs((B, 4, L, E), (B, 2, S, E)), {"enable_gqa": True}
    elif case == "broadcast_batch":
        cpu, kwargs = _inputs((B, H, L, E), (1, H, S, E)), {}
    elif case == "2d":
        cpu, kwargs = _inputs((L, E), (S, E)), {}
    else:
        cpu, kwargs = _inputs(), {}
    dev = [t.to("jax") for t in cpu]
    with sdpa_kernel([SDPBackend.MATH]) if case == "math_backend" else torch.no_grad():
        ops = _ops(lambda: F.scaled_dot_product_attention(*dev, **kwargs))
        got = F.scaled_dot_product_attention(*dev, **kwargs)
    assert "aten::_scaled_dot_product_attention_math" in ops
    assert_same(got, F.scaled_dot_product_attention(*cpu, **kwargs), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("case", ["dtypes", "mask_dtype", "mask_shape"])
def test_errors_match_cpu(case):
    q, k, v = _inputs()
    kwargs = {}
    if case == "dtypes":
        k = k.double()
    elif case == "mask_dtype":
        kwargs = {"attn_mask": torch.ones(L, S, dtype=torch.int64)}
    else:
        kwargs = {"attn_mask": torch.ones(B, H, L, S + 1)}
    with pytest.raises(RuntimeError) as cpu_error:
        F.scaled_dot_product_attention(q, k, v, **kwargs)
    dev_kwargs = {n: t.to("jax") if isinstance(t, torch.Tensor) else t for n, t in kwargs.items()}
    with pytest.raises(RuntimeError) as jax_error:
        F.scaled_dot_product_attention(q.to("jax"), k.to("jax"), v.to("jax"), **dev_kwargs)
    assert str(jax_error.value) == str(cpu_error.value)


def test_no_double_backward_as_on_cpu():
    """PyTorch's CPU kernel (flash attention) has no double backward either."""
    for device in ("cpu", "jax"):
        q = torch.randn(1, 2, 4, 8).to(device).requires_grad_(True)
        (grad,) = torch.autograd.grad(F.scaled_dot_product_attention(q, q, q).sum(), q, create_graph=True)
        with pytest.raises(RuntimeError, match="backward is not implemented"):
            grad.sum().backward()


def test_float32_gradients_as_accurate_as_the_cpus_at_large_logits():
    # NOTE [Attention's backward]: rebuilt from the forward's float32 logsumexp, the
    # probabilities carried an error of ~|lse| ulp, and dq, dk were 10-20x further from
    # the float64 gradients than the CPU's at logits up to ~29 (1.4e-5, 2.5e-5 against
    # 1.2e-6, 1.7e-6)
    torch.manual_seed(3)
    q, k, v = (5 * torch.randn(2, 3, 2, dtype=torch.float64) for _ in range(3))
    g = torch.randn(2, 3, 2, dtype=torch.float64)

    def grads(device, dtype):
        ts = [t.detach().to(dtype).to(device).requires_grad_() for t in (q, k, v)]
        F.scaled_dot_product_attention(*ts).backward(g.to(dtype).to(device))
        return [t.grad.cpu().double() for t in ts]

    exact = grads("cpu", torch.float64)
    cpu, ours = grads("cpu", torch.float32), grads("jax", torch.float32)
    for c, o, x in zip(cpu, ours, exact):
        err_cpu, err_ours = (c - x).abs().max().item(), (o - x).abs().max().item()
        assert err_ours <= 2 * err_cpu + 1e-7, (err_ours, err_cpu)
