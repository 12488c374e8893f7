"""torch.autocast("jax") with PyTorch's CUDA policy, and torch.amp.GradScaler("jax").

The oracle is the CPU running the same ops on arguments cast by hand the way the
CUDA policy casts them (``F.linear(x.bfloat16(), w.bfloat16(), b.bfloat16())``)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_same
from torch_jax.device import _autocast

LOW = (torch.bfloat16, torch.float16)
TOL = {"atol": 1e-2, "rtol": 1e-2}


def _r(*shape, positive=False):
    x = torch.randn(*shape)
    return x.abs() + 0.5 if positive else x


def _target(n, classes):
    return torch.randint(0, classes, (n,))


# (name, function, input maker, policy). Policies: "low" ops get float32 inputs and
# must compute in the autocast dtype; "fp32" ops get inputs in the autocast dtype and
# must compute in float32; "promote" ops get inputs in the autocast dtype with the
# first one float32, and must compute in float32 (the widest).
CASES = [
    ("linear", F.linear, lambda: (_r(3, 8), _r(5, 8), _r(5)), "low"),
    ("matmul", torch.matmul, lambda: (_r(3, 8), _r(8, 4)), "low"),
    ("bmm", torch.bmm, lambda: (_r(2, 3, 8), _r(2, 8, 4)), "low"),
    ("addmm", torch.addmm, lambda: (_r(3, 4), _r(3, 8), _r(8, 4)), "low"),
    ("conv2d", F.conv2d, lambda: (_r(2, 3, 6, 6), _r(4, 3, 3, 3), _r(4)), "low"),
    ("einsum", lambda a, b: torch.einsum("ij,jk->ik", a, b), lambda: (_r(3, 8), _r(8, 4)), "low"),
    ("softmax", lambda x: F.softmax(x, -1), lambda: (_r(4, 8),), "fp32"),
    ("log_softmax", lambda x: F.log_softmax(x, 1), lambda: (_r(4, 8),), "fp32"),
    ("layer_norm", lambda x, w, b: F.layer_norm(x, (8,), w, b), lambda: (_r(4, 8), _r(8), _r(8)), "fp32"),
    ("group_norm", lambda x, w, b: F.group_norm(x, 2, w, b), lambda: (_r(2, 4, 3, 3), _r(4), _r(4)), "fp32"),
    ("sum", torch.sum, lambda: (_r(4, 8),), "fp32"),
    ("sum_dim", lambda x: x.sum(1), lambda: (_r(4, 8),), "fp32"),
    ("cumsum", lambda x: torch.cumsum(x, 1), lambda: (_r(4, 8),), "fp32"),
    ("norm", torch.norm, lambda: (_r(4, 8),), "fp32"),
    ("mse_loss", F.mse_loss, lambda: (_r(4, 8), _r(4, 8)), "fp32"),
    ("cross_entropy", F.cross_entropy, lambda: (_r(4, 8), _target(4, 8)), "fp32"),
    ("nll_loss", F.nll_loss, lambda: (_r(4, 8), _target(4, 8)), "fp32"),
    ("exp", torch.exp, lambda: (_r(4, 8),), "fp32"),
    ("log", torch.log, lambda: (_r(4, 8, positive=True),), "fp32"),
    ("addcmul", torch.addcmul, lambda: (_r(4, 8), _r(4, 8), _r(4, 8)), "promote"),
    ("addcdiv", torch.addcdiv, lambda: (_r(4, 8), _r(4, 8), _r(4, 8, positive=True)), "promote"),
    # cat and stack are not in the autocast lists (they promote natively)
    ("cat", lambda a, b: torch.cat([a, b]), lambda: (_r(2, 8), _r(3, 8)), "promote"),
    ("stack", lambda a, b: torch.stack([a, b]), lambda: (_r(2, 8), _r(2, 8)), "promote"),
]


def _floats(args, dtype, first=None):
    """Floating tensors cast to ``dtype`` (the first one to ``first`` if given)."""
    out = []
    for i, a in enumerate(args):
        if a.is_floating_point():
            a = a.to(first if i == 0 and first is not None else dtype)
        out.append(a)
    return out


@pytest.mark.parametrize("low", LOW, ids=str)
@pytest.mark.parametrize(("name", "fn", "make", "policy"), CASES, ids=[c[0] for c in CASES])
def test_policy(name, fn, make, policy, low):
    torch.manual_seed(0)
    args = make()
    if policy == "low":
        given, expected_dtype = args, low
    elif policy == "fp32":
        given, expected_dtype = _floats(args, low), torch.float32
    else:
        given, expected_dtype = _floats(args, low, first=torch.float32), torch.float32
    with torch.autocast("jax", dtype=low):
        got = fn(*[a.to("jax") for a in given])
    expected = fn(*_floats(given, expected_dtype))  # CPU, cast by hand
    assert expected.dtype == expected_dtype
    assert_same(got, expected, **TOL)


@pytest.mark.parametrize("low", LOW, ids=str)
def test_promote_all_low_stays_low(low):
    a, b, c = (_r(4, 8).to(low) for _ in range(3))
    with torch.autocast("jax", dtype=low):
        got = torch.addcmul(a.to("jax"), b.to("jax"), c.to("jax"), value=0.5)
    assert_same(got, torch.addcmul(a, b, c, value=0.5), **TOL)


def test_promote_rejects_the_other_half_type():
    a, b = _r(4, 8).to("jax", torch.bfloat16), _r(4, 8).to("jax", torch.float16)
    with torch.autocast("jax", dtype=torch.bfloat16), pytest.raises(RuntimeError, match="Unexpected floating"):
        torch.addcmul(a, a, b)


@pytest.mark.parametrize("low", LOW, ids=str)
def test_explicit_dtype_is_kept(low):
    x = _r(4, 8).to("jax", low)
    with torch.autocast("jax", dtype=low):
        assert torch.cumsum(x, 1, dtype=low).dtype == low
        assert F.softmax(x, -1, dtype=low).dtype == low
        assert torch.ops.aten.norm.Scalar(x).dtype == torch.float32  # fp32_append_dtype
        assert torch.exp(x.double()).dtype == torch.float64  # float64 is never cast


@pytest.mark.parametrize("low", LOW, ids=str)
def test_disabled_casts_nothing(low):
    x, w = _r(3, 8).to("jax"), _r(5, 8).to("jax")
    h = x.to(low)
    with torch.autocast("jax", dtype=low):
        with torch.autocast("jax", enabled=False):
            assert not torch.is_autocast_enabled("jax")
            assert F.linear(x, w).dtype == torch.float32
            assert torch.exp(h).dtype == low
            assert F.softmax(h, -1).dtype == low
        assert F.linear(x, w).dtype == low
    assert F.linear(x, w).dtype == torch.float32
    assert torch.exp(h).dtype == low


def test_cpu_tensors_are_not_cast():
    x = _r(3, 8)
    with torch.autocast("jax", dtype=torch.bfloat16):
        assert F.linear(x, x).dtype == torch.float32


def test_binary_cross_entropy_is_banned():
    p, t = torch.rand(4).to("jax"), torch.rand(4).to("jax")
    with torch.autocast("jax"), pytest.raises(RuntimeError, match="unsafe to autocast"):
        F.binary_cross_entropy(p, t)


def test_float16_is_supported_without_warning():
    assert set(torch.jax.get_amp_supported_dtype()) == {torch.float16, torch.bfloat16}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.autocast("jax", dtype=torch.float16):
            assert torch.is_autocast_enabled("jax")
            assert torch.get_autocast_dtype("jax") == torch.float16


def test_every_policy_entry_is_an_op():
    assert _autocast.MISSING == []
    assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::linear", "AutocastPrivateUse1")
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::add.Tensor", "AutocastPrivateUse1")


# ---- training ----


def _params():
    torch.manual_seed(0)
    return [_r(16, 8) * 0.3, _r(16) * 0.1, _r(1, 16) * 0.3, _r(1) * 0.1]


def _mlp(params, x, low=None):
    """Linear, ReLU, Linear; ``low``: cast by hand (the CPU oracle of autocast)."""
    w1, b1, w2, b2 = params if low is None else [p.to(low) for p in params]
    if low is not None:
        x = x.to(low)
    h = F.relu(F.linear(x, w1, b1))
    return F.linear(h, w2, b2)


def _data():
    torch.manual_seed(1)
    return _r(32, 8), _r(32, 1)


@pytest.mark.parametrize("low", LOW, ids=str)
def test_training_step_matches_cpu(low):
    x, y = _data()
    cpu = [p.requires_grad_() for p in _params()]
    jax = [p.detach().to("jax").requires_grad_() for p in _params()]
    out = _mlp(cpu, x, low)
    loss = F.mse_loss(out.float(), y)
    loss.backward()
    with torch.autocast("jax", dtype=low):
        jout = _mlp(jax, x.to("jax"))
        jloss = F.mse_loss(jout, y.to("jax"))
    jloss.backward()
    assert_same(jout, out.detach(), **TOL)
    assert_same(jloss, loss.detach(), **TOL)
    for p, q in zip(jax, cpu):
        assert p.grad.dtype == torch.float32  # the backward of the casts returns the parameter's dtype
        assert_same(p.grad, q.grad, atol=2e-2, rtol=2e-2)


def _scaled_training(device, steps=5, inf_at=None):
    """float16 steps with GradScaler; returns the parameters and scale after each step."""
    x, y = _data()
    x, y = x.to(device), y.to(device)
    params = [p.to(device).requires_grad_() for p in _params()]
    opt = torch.optim.SGD(params, lr=0.05)
    scaler = torch.amp.GradScaler(device, init_scale=2.0**12, growth_interval=2)
    history = []
    for step in range(steps):
        opt.zero_grad()
        if device == "jax":
            with torch.autocast("jax", dtype=torch.float16):
                loss = F.mse_loss(_mlp(params, x), y)
        else:
            loss = F.mse_loss(_mlp(params, x, torch.float16).float(), y)
        scaler.scale(loss).backward()
        if step == inf_at:
            with torch.no_grad():
                params[0].grad[0, 0] = float("inf")
        scaler.step(opt)
        scaler.update()
        history.append(([p.detach().cpu().clone() for p in params], scaler.get_scale()))
    return history


@pytest.mark.parametrize("inf_at", [None, 3], ids=["finite", "inf"])
def test_grad_scaler_matches_cpu(inf_at):
    got = _scaled_training("jax", inf_at=inf_at)
    expected = _scaled_training("cpu", inf_at=inf_at)
    assert [s for _, s in got] == [s for _, s in expected]
    for (gp, _), (ep, _) in zip(got, expected):
        for g, e in zip(gp, ep):
            torch.testing.assert_close(g, e, atol=1e-3, rtol=1e-3)
    scales = [s for _, s in got]
    assert scales[:3] == [2.0**12, 2.0**13, 2.0**13]  # grows every second successful step
    if inf_at is not None:
        assert scales[inf_at] == scales[inf_at - 1] / 2  # backed off
        for before, after in zip(got[inf_at - 1][0], got[inf_at][0]):
            torch.testing.assert_close(after, before, atol=0, rtol=0)  # the step was skipped
