"""Per-op overhead of strict eager on ``jax`` against PyTorch CPU eager, side by side.

Each workload runs on both devices in this one process, warmed up, timed as the
median of several repeats (each repeat runs the workload many times and ends with a
device synchronize), and is printed with the ratio jax / CPU.

    python benchmarks/eager_overhead.py [--repeats 7] [--markdown]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def _sync(device: str) -> None:
    if device != "cpu":
        torch.jax.synchronize()


def _time(fn, device: str, inner: int, repeats: int) -> float:
    """Median seconds per call of ``fn`` over ``repeats`` runs of ``inner`` calls."""
    for _ in range(max(3, inner // 10)):
        fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        _sync(device)
        times.append((time.perf_counter() - t0) / inner)
    return statistics.median(times)


def small_op(name: str):
    def setup(device):
        a = torch.randn(16, device=device)
        b = torch.randn(16, device=device)
        fns = {
            "add": lambda: a + b,
            "mul_scalar": lambda: a * 1.5,
            "relu": lambda: torch.relu(a),
            "exp": lambda: torch.exp(a),
            "add_ (in-place)": lambda: a.add_(b, alpha=1e-6),
            "sum": lambda: a.sum(),
        }
        return fns[name]

    return setup


def matmul_512(device):
    a = torch.randn(512, 512, device=device)
    b = torch.randn(512, 512, device=device)
    return lambda: a @ b


def mlp_step(device):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(128, 784, device=device)
    y = torch.randint(0, 10, (128,), device=device)

    def step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    return step


WORKLOADS = [
    *[
        (f"small op: {n} (16 floats)", small_op(n), 2000)
        for n in ("add", "mul_scalar", "relu", "exp", "add_ (in-place)", "sum")
    ],
    ("matmul 512x512 fp32", matmul_512, 50),
    ("MLP 784-512-512-10 SGD step, batch 128", mlp_step, 20),
]


def compare(workloads, repeats: int, markdown: bool) -> None:
    """Time each (name, setup, inner) workload on the CPU and on jax, print the ratios."""
    rows = []
    for name, setup, inner in workloads:
        cpu = _time(setup("cpu"), "cpu", inner, repeats)
        dev = _time(setup("jax"), "jax", inner, repeats)
        rows.append((name, cpu, dev, dev / cpu))
    if markdown:
        print("| workload | PyTorch CPU eager | jax strict eager | ratio (jax / CPU) |")
        print("| --- | --- | --- | --- |")
        for name, cpu, dev, ratio in rows:
            print(f"| {name} | {_fmt(cpu)} | {_fmt(dev)} | {ratio:.2f}x |")
    else:
        print(f"{'workload':45s} {'CPU eager':>12s} {'jax strict':>12s} {'ratio':>8s}")
        for name, cpu, dev, ratio in rows:
            print(f"{name:45s} {_fmt(cpu):>12s} {_fmt(dev):>12s} {ratio:7.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args()
    compare(WORKLOADS, args.repeats, args.markdown)


def _fmt(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    return f"{seconds * 1e3:.2f} ms"


if __name__ == "__main__":
    main()
