"""Train a small MLP classifier on the ``jax`` device and print the loss falling.

The data is synthetic (a random "teacher" network labels Gaussian inputs), so the
example needs no downloads. The only device-specific line is ``.to("jax")``.

    python examples/train_mlp.py [--steps 200] [--compile]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def make_data(n: int, dim: int, classes: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(dim, classes, generator=g)
    x = torch.randn(n, dim, generator=g)
    y = (x @ teacher).argmax(dim=1)
    return x, y


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--device", default="jax")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (its default backend)")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device(args.device)
    x, y = make_data(2048, 32, 10)
    x, y = x.to(device), y.to(device)
    model = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.LayerNorm(128), nn.Linear(128, 10)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    if args.compile:  # on jax, the default backend's graphs go to the "jax" backend
        model = torch.compile(model)

    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        idx = torch.randint(0, x.shape[0], (256,), device=device)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == 1 or step % 20 == 0:
            print(f"step {step:4d}  loss {loss.item():.4f}")
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).float().mean().item()
    print(f"device {device}: {args.steps} steps in {time.perf_counter() - start:.1f}s, train accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
