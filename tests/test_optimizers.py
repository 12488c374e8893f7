"""Every torch.optim optimizer, with foreach off and on, takes the same steps on jax as
on the CPU, with no op through the CPU fallback (the fixture makes a fallback an error)."""

from __future__ import annotations

import pytest
import torch

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


def _train(device, name, foreach, clip):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).double().to(device)
    opt = getattr(torch.optim, name)(model.parameters(), foreach=foreach, **OPTIMIZERS[name])
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
