"""How much of a training step's time torch.profiler attributes to the device on jax
(NOTE [Device time in torch.profiler] in torch_jax/runtime/_profiler):

    python -m benchmarks.profiler_attribution [--only TEXT] [--repeats 7]

For each training workload of benchmarks/workloads.py (the MLP and the GPT-2-style step
unless ``--only`` picks) and each eager mode, it times the step without the profiler (the
median of ``--repeats``, each step waited for), then profiles three steps with
``torch.profiler.profile(activities=[CPU, PrivateUse1])`` and prints, per step:

- *step*: the step's time without the profiler;
- *profiled*: its time under the profiler, which waits for each computation;
- *device*: the device time the profile's rows hold (the table's ``Self JAX`` total: the
  ops' computations in strict mode, the fused graphs' in fused mode);
- *device / step*: the share of the unprofiled step the device rows account for. The rest is
  the host's: Python, PyTorch's dispatch, and torch_jax dispatching or recording ops, which
  the profile shows as CPU time.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

import torch_jax
from benchmarks import workloads

_DEFAULT = ("mlp", "gpt-2")


def _measure(setup, repeats: int) -> dict:
    step = setup("jax", False)
    for _ in range(3):
        step()
    torch.jax.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        torch.jax.synchronize()
        times.append(time.perf_counter() - start)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        start = time.perf_counter()
        for _ in range(3):
            step()
        torch.jax.synchronize()
        profiled = (time.perf_counter() - start) / 3
    device_us = sum(
        e.time_range.elapsed_us() for e in prof.events() if e.device_type == torch.autograd.DeviceType.PrivateUse1
    )
    return {"step": statistics.median(times), "profiled": profiled, "device": device_us / 3 / 1e6}


def main(argv=None) -> list:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.profiler_attribution", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--only", default=None, help="workloads whose name contains this text")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    chosen = [
        w
        for w in workloads.WORKLOADS
        if w.group == "training" and (args.only in w.name if args.only else any(n in w.name.lower() for n in _DEFAULT))
    ]
    rows = []
    print(f"{'workload':<28} {'mode':<7} {'step ms':>8} {'profiled ms':>12} {'device ms':>10} {'device / step':>14}")
    for w in chosen:
        for mode in ("strict", "fused"):
            torch_jax.set_mode(mode)
            r = _measure(w.setup, args.repeats)
            torch_jax.set_mode("strict")
            share = r["device"] / r["step"]
            print(
                f"{w.name:<28} {mode:<7} {r['step'] * 1e3:>8.2f} {r['profiled'] * 1e3:>12.2f} "
                f"{r['device'] * 1e3:>10.2f} {share:>14.2f}"
            )
            rows.append({"workload": w.name, "mode": mode, **r, "share": share})
    return rows


if __name__ == "__main__":
    main()
