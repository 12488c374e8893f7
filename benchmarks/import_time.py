"""What the torch.backends autoload of torch_jax adds to ``import torch``.

Runs ``python -c "import torch"`` in fresh processes, alternating with the autoload
switched off (TORCH_DEVICE_BACKEND_AUTOLOAD=0, i.e. as if torch_jax were not
installed) and on, and prints the medians and the difference. Also times the first
use of the device (JAX import, kernel registration, two ops' Meta kernels and
compilations), which autoload defers.

    python benchmarks/import_time.py [--runs 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time


def _time(code: str, env: dict) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    off = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    on = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="1")
    without, with_ = [], []
    for _ in range(args.runs):
        without.append(_time("import torch", off))
        with_.append(_time("import torch", on))
    # (an elementwise op runs PyTorch's Meta kernel, which imports sympy; torch._dynamo is
    # not imported: NOTE [Meta kernels without importing dynamo])
    first_op = "import torch; (torch.ones(2, device='jax') * 2 + 1).cpu()"
    first_use = [_time(first_op, on) for _ in range(max(3, args.runs // 3))]
    a, b, c = statistics.median(without), statistics.median(with_), statistics.median(first_use)
    print(f"import torch, autoload off (torch_jax not loaded): {a * 1e3:7.1f} ms")
    print(f"import torch, autoload on (torch_jax registered):  {b * 1e3:7.1f} ms  (+{(b - a) * 1e3:.1f} ms)")
    print(f"import torch + first ops on jax (JAX, kernels, compiles): {c * 1e3:7.1f} ms")


if __name__ == "__main__":
    main()
