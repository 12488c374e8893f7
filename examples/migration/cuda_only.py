"""A training script written for CUDA: it assumes any accelerator is a CUDA GPU.

A workload for ``torch-jax doctor`` and ``torch-jax scan`` that fails on ``jax`` (and shows
what needs changing): it runs on the CPU, but where ``torch.accelerator`` finds a device it
moves the model with ``.cuda()`` and times with ``torch.cuda.synchronize()``. The rewrite is
``.to(device)`` with ``device = torch.accelerator.current_accelerator()`` and
``torch.accelerator.synchronize()``.

    python examples/migration/cuda_only.py [--steps 20]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    x, y = torch.randn(256, 16), torch.randn(256, 1)
    if torch.accelerator.is_available():
        model, x, y = model.cuda(), x.cuda(), y.cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(args.steps):
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if torch.accelerator.is_available():
            torch.cuda.synchronize()
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
