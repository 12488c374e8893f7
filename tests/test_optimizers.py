"""Every torch.optim optimizer, with foreach off and on, takes the same steps on jax as
on the CPU, with no op through the CPU fallback (the fixture makes a fallback an error)."""

from __future__ import annotations

import pytest
import torch

from conftest import config_as

OPTIMIZERS = {
    "SGD": dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    "Adam": dict(lr=0.01, amsgrad=True, weight_decay=0.01),
    "AdamW": dict(lr=0.01, amsgrad=True),
    "RMSprop": dict(lr=0.01, momentum=0.9, centered=True),
    "Adagrad": dict(lr=0.1),
    "Adadelta": dict(),
    "Adamax": dict(),
    "NAdam": dict(),
    "RAdam": dict(),
    "ASGD": dict(),
    "Rprop": dict(),
    "Adafactor": dict(),
}


def _train(device, name, foreach, clip, fused=False):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).double().to(device)
    how = dict(fused=True) if fused else dict(foreach=foreach)
    opt = getattr(torch.optim, name)(model.parameters(), **how, **OPTIMIZERS[name])
    x = torch.randn(5, 4, dtype=torch.float64).to(device)
    for _ in range(3):
        opt.zero_grad()
        model(x).pow(2).sum().backward()
        if clip == "norm":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5, foreach=foreach)
        elif clip == "value":
            torch.nn.utils.clip_grad_value_(model.parameters(), 0.05, foreach=foreach)
        opt.step()
    return [p.detach().cpu() for p in model.parameters()]


@pytest.mark.parametrize("foreach", [False, True], ids=["for-loop", "foreach"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_steps_match_cpu(name, foreach):
    for got, expected in zip(_train("jax", name, foreach, None), _train("cpu", name, foreach, None)):
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("clip", ["norm", "value"])
@pytest.mark.parametrize("foreach", [False, True], ids=["for-loop", "foreach"])
def test_gradient_clipping_matches_cpu(clip, foreach):
    for got, expected in zip(_train("jax", "SGD", foreach, clip), _train("cpu", "SGD", foreach, clip)):
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW", "Adagrad"])
def test_fused_optimizers_match_cpu(name):
    """``fused=True`` (the default of Hugging Face's Trainer): one computation per step."""
    for got, expected in zip(_train("jax", name, None, None, fused=True), _train("cpu", name, None, None, fused=True)):
        torch.testing.assert_close(got, expected)


def _fused_amp_steps(device, scheduled_lr, base_lr=0.01):
    """Fused AdamW with an LR scheduler and a GradScaler that meets an inf gradient."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).to(device)
    lr = torch.tensor(base_lr) if scheduled_lr == "tensor" else base_lr
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, fused=True)
    sched = torch.optim.lr_scheduler.LinearLR(opt, 1.0, 0.1, total_iters=4)
    scaler = torch.amp.GradScaler(device, init_scale=1024.0)
    x = torch.randn(5, 4).to(device)
    for step in range(4):
        opt.zero_grad()
        scaler.scale(model(x).pow(2).sum()).backward()
        if step == 1:
            model[0].weight.grad[0, 0] = float("inf")  # this step is skipped, the scale halves
        scaler.step(opt)
        scaler.update()
        sched.step()
    return [p.detach().cpu() for p in model.parameters()] + [torch.tensor(scaler.get_scale())]


@pytest.mark.parametrize("scheduled_lr", ["float", "tensor"])
def test_fused_adamw_with_scheduler_and_grad_scaler(scheduled_lr):
    import torch_jax

    got = _fused_amp_steps("jax", scheduled_lr)
    for g, e in zip(got, _fused_amp_steps("cpu", scheduled_lr)):
        torch.testing.assert_close(g, e)
    assert got[-1].item() == 512.0
    # the learning rate is an input of the fused step, not a constant: new learning
    # rates compile nothing (with the cache's budgets out of the way: in a long test run the
    # bounded compile cache may drop one of these computations between the two runs; and
    # after the same run again, which compiles what the process's history decides anew: in
    # a long test run, shapes earlier tests sent from the host can start bucketing, NOTE
    # [Buckets] in runtime/_buckets)
    with config_as(cache_size=1 << 30, compile_cache_mb=1 << 30):
        _fused_amp_steps("jax", scheduled_lr)
        before = torch_jax.stats()
        _fused_amp_steps("jax", scheduled_lr, base_lr=0.02)
        after = torch_jax.stats()
    new = after["compiles"] - before["compiles"]
    assert new == after.get("recompiles", 0) - before.get("recompiles", 0), new  # (only what was dropped)


@pytest.mark.parametrize("set_to_none", [True, False])
def test_schedulers_and_zero_grad_match_cpu(set_to_none):
    def train(device):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3).double().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        sched = torch.optim.lr_scheduler.SequentialLR(
            opt,
            [torch.optim.lr_scheduler.LinearLR(opt, 0.1, 1.0, 3), torch.optim.lr_scheduler.CosineAnnealingLR(opt, 5)],
            milestones=[3],
        )
        x = torch.linspace(-1, 1, 20, dtype=torch.float64).reshape(5, 4).to(device)
        for _ in range(6):
            opt.zero_grad(set_to_none=set_to_none)
            model(x).pow(2).sum().backward()
            opt.step()
            sched.step()
        opt.zero_grad(set_to_none=set_to_none)
        grads = [p.grad for p in model.parameters()]
        if set_to_none:
            assert all(g is None for g in grads)
        else:
            assert all(g.device.type == device and not g.any() for g in grads)
        return [p.detach().cpu() for p in model.parameters()] + [torch.tensor(sched.get_last_lr())]

    for got, expected in zip(train("jax"), train("cpu")):
        torch.testing.assert_close(got, expected)
