"""Kernel ridge regression with a symmetric indefinite solve, on the device
``torch.accelerator`` names (the CPU where there is none).

A workload for ``torch-jax doctor`` that falls back to the CPU: ``torch.linalg.ldl_factor``
(Bunch-Kaufman pivoting) has no JAX implementation, so on ``jax`` it runs through the CPU
fallback, which the doctor's record counts. Synthetic data, no downloads.

    python examples/migration/kernel_ridge.py [--batches 8]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn


class KernelRidge(nn.Module):
    """Predicts ``y`` at ``x`` from support points, through an RBF kernel and a solve."""

    def __init__(self, support: torch.Tensor, targets: torch.Tensor, shift: float = 0.5):
        super().__init__()
        self.register_buffer("support", support)
        self.register_buffer("targets", targets)
        self.shift = shift  # (a shift below the kernel's diagonal makes the system indefinite)

    def forward(self, x):
        k = torch.cdist(self.support, self.support).pow(2).neg().exp()
        a = k - self.shift * torch.eye(k.shape[0], device=k.device, dtype=k.dtype)
        factor, pivots = torch.linalg.ldl_factor(a)
        weights = torch.linalg.ldl_solve(factor, pivots, self.targets)
        return torch.cdist(x, self.support).pow(2).neg().exp() @ weights


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=8)
    args = parser.parse_args()
    device = torch.accelerator.current_accelerator() or torch.device("cpu")
    g = torch.Generator().manual_seed(0)
    support = torch.randn(64, 4, generator=g, dtype=torch.float64)
    targets = support.sin().sum(1, keepdim=True)
    model = KernelRidge(support, targets).to(device)
    with torch.no_grad():
        for _ in range(args.batches):
            x = torch.randn(32, 4, generator=g, dtype=torch.float64).to(device)
            err = (model(x) - x.sin().sum(1, keepdim=True)).abs().mean()
    print(f"device {device}: mean abs error of the last batch {err.item():.4f}")


if __name__ == "__main__":
    main()
