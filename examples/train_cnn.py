"""Train a small CNN on the ``jax`` device on synthetic images and print the loss falling.

Each image holds one of four patterns (horizontal stripes, vertical stripes, a
checkerboard, a centred blob) under noise, so nothing is downloaded. The model,
optimizer, LR schedule and data loader are plain PyTorch; ``--amp`` trains under
``torch.autocast("jax", dtype=torch.bfloat16)``.

    python examples/train_cnn.py [--steps 150] [--amp]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def make_images(n: int, size: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (n,), generator=g)
    r = torch.arange(size)
    patterns = torch.stack(
        [
            (r[:, None] // 2 % 2).expand(size, size),  # horizontal stripes
            (r[None, :] // 2 % 2).expand(size, size),  # vertical stripes
            ((r[:, None] // 4 + r[None, :] // 4) % 2),  # checkerboard
            (((r[:, None] - size / 2) ** 2 + (r[None, :] - size / 2) ** 2) < (size / 4) ** 2).long(),  # blob
        ]
    ).float()
    images = patterns[labels][:, None] + 0.8 * torch.randn(n, 1, size, size, generator=g)
    return images, labels


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 4):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        )  # fmt: skip
        self.head = nn.Linear(32, classes)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--device", default="jax")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (its default backend)")
    parser.add_argument("--amp", action="store_true", help="bfloat16 autocast")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device(args.device)
    images, labels = make_images(2048)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(images, labels), batch_size=64, shuffle=True, pin_memory=True, drop_last=True
    )
    model = SmallCNN().to(device)
    if args.compile:
        model = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=args.steps)

    start = time.perf_counter()
    step = 0
    while step < args.steps:
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp):
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            if step == 1 or step % 25 == 0:
                print(f"step {step:4d}  loss {loss.item():.4f}")
            if step == args.steps:
                break
    model.eval()
    test_x, test_y = make_images(512, seed=1)
    with torch.no_grad():
        accuracy = (model(test_x.to(device)).argmax(1).cpu() == test_y).float().mean().item()
    print(f"device {device}: {args.steps} steps in {time.perf_counter() - start:.1f}s, test accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
