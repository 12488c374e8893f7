"""Compiled FlexAttention at a long sequence: a causal BlockMask against the same call without
a mask, on jax (blockwise: NOTE [Blockwise flex attention] in torch_jax/compile/_flex) and on
PyTorch's CPU (Inductor's C++ flex attention template), in this one process.

    python -m benchmarks.flex_attention [--length 4096] [--heads 4] [--dim 64] [--repeats 5]
                                        [--variants compiled,backward,inductor,eager]
                                        [--out DIR | --no-write]

Batch 1, float32, ``torch.compile(flex_attention)`` with its default backend (which on jax
routes to the ``jax`` backend, NOTE [The default torch.compile on jax]). Each row is built and
warmed up (compiled), then timed: the median and the best of ``--repeats`` calls, each waited
for. Variants: ``compiled`` (jax, the forward), ``backward`` (jax, forward and backward of
q, k and v), ``inductor`` (the CPU's compiled forward; its flex attention has no backward),
``eager`` (jax, PyTorch's dense implementation that eager mode runs: the L x L scores).

Memory on jax, per row: *storages*, the peak of the device's live tensors during the timed
calls (``torch.jax.max_memory_allocated`` after ``reset_peak_memory_stats``, less what was
allocated before the row began: the inputs, the BlockMask, the outputs and gradients); *XLA temp*, the temporary buffers of the largest XLA computation the
call ran (``memory_analysis().temp_size_in_bytes`` of the compiled executable: where the
scores live while the computation runs, which the live tensors do not show on XLA:CPU); and
*peak*, their sum on XLA:CPU (a GPU's allocator reports its temporaries itself, so there the
peak is ``max_memory_allocated``). The CPU rows show time only.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
import warnings

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import torch_jax
from benchmarks import machine, write_report

VARIANTS = {
    "compiled": "jax, torch.compile, forward",
    "backward": "jax, torch.compile, forward + backward",
    "inductor": "CPU, torch.compile (Inductor), forward",
    "eager": "jax, eager (dense), forward",
}
DEFAULT = "compiled,backward,inductor,eager"
_MB = 2**20


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _executables() -> list:
    from torch_jax.compile import _graph

    return [ref() for ref in _graph.recent if ref() is not None]


def _row(variant: str, masked: bool, args) -> dict:
    device = "cpu" if variant == "inductor" else "jax"
    gc.collect()  # (what an earlier row left: its storages are not this row's)
    base = torch.jax.memory_allocated() if device == "jax" else 0
    g = torch.Generator().manual_seed(0)
    shape = (1, args.heads, args.length, args.dim)
    grad = variant == "backward"
    q, k, v = (torch.randn(shape, generator=g).to(device).requires_grad_(grad) for _ in range(3))
    mask = create_block_mask(_causal, None, None, args.length, args.length, device=device) if masked else None
    fn = flex_attention if variant == "eager" else torch.compile(flex_attention)

    def call():
        out = fn(q, k, v, block_mask=mask)
        if grad:
            out.backward(torch.ones_like(out))
            q.grad = k.grad = v.grad = None
        if device == "jax":
            torch.jax.synchronize()

    start = time.perf_counter()
    call()  # (compiles)
    build = time.perf_counter() - start
    call()
    if device == "jax":
        from torch_jax.compile import _graph

        _graph.recent.clear()
        torch.jax.reset_peak_memory_stats()
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    row = {"median_ms": statistics.median(times) * 1e3, "best_ms": min(times) * 1e3, "build_s": build}
    if device == "jax":
        import jax

        storages = torch.jax.max_memory_allocated() - base
        row["storages_mb"] = storages / _MB
        if variant == "eager":  # (op by op: every intermediate is a storage)
            row["peak_mb"] = storages / _MB
            return row
        temp = max(e.memory_analysis().temp_size_in_bytes for e in _executables())
        on_cpu = jax.devices()[0].memory_stats() is None  # (XLA:CPU reports no allocator statistics)
        row.update(temp_mb=temp / _MB, peak_mb=(storages + temp if on_cpu else storages) / _MB)
    return row


def _fmt(row: dict, key: str, digits: int = 1) -> str:
    return f"{row[key]:.{digits}f}" if key in row else "-"


def markdown(report: dict) -> str:
    lines = [
        "| variant | mask | median ms | best ms | build s | storages MB | XLA temp MB | peak MB |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in report["rows"]:
        if "error" in r:
            lines.append(f"| {VARIANTS[r['variant']]} | {r['mask']} | {r['error']} | | | | | |")
            continue
        lines.append(
            f"| {VARIANTS[r['variant']]} | {r['mask']} | {r['median_ms']:.1f} | {r['best_ms']:.1f} | {r['build_s']:.1f} "
            f"| {_fmt(r, 'storages_mb')} | {_fmt(r, 'temp_mb')} | {_fmt(r, 'peak_mb')} |"
        )
    return "\n".join(lines)


def verdicts(report: dict) -> list[str]:
    """Causal against no mask, per jax variant: the time and peak memory ratios."""
    out = []
    rows = {(r["variant"], r["mask"]): r for r in report["rows"] if "error" not in r}
    for variant in VARIANTS:
        causal, full = rows.get((variant, "causal")), rows.get((variant, "none"))
        if causal is None or full is None:
            continue
        time_ratio = causal["median_ms"] / full["median_ms"]
        line = f"- {VARIANTS[variant]}: causal takes {time_ratio:.2f}x the time of no mask"
        if "peak_mb" in causal:
            mem_ratio = causal["peak_mb"] / full["peak_mb"]
            line += f" and {mem_ratio:.2f}x its peak memory"
            if variant == "compiled":  # (issue 48's target: the compiled call)
                met = "met" if time_ratio < 1 and mem_ratio < 1 else "not met"
                line += f" (target: less time and less memory: {met})"
        out.append(line)
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.flex_attention", description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--variants", default=DEFAULT, help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--out", default="docs/benchmarks")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    warnings.filterwarnings("ignore", category=torch_jax.CompileWarning)
    torch_jax.initialize()
    report = {"meta": {**machine(), "length": args.length, "heads": args.heads, "dim": args.dim}, "rows": []}
    for variant in args.variants.split(","):
        for masked in (True, False):
            torch._dynamo.reset()
            row = {"variant": variant, "mask": "causal" if masked else "none"}
            try:
                row.update(_row(variant, masked, args))
            except Exception as e:  # (a variant that cannot run here: the CPU's compiler, memory)
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
            report["rows"].append(row)
            print(row, flush=True)
    meta = report["meta"]
    text = "\n".join(
        [
            "# Compiled FlexAttention: causal against no mask",
            "",
            f"Generated by `python -m benchmarks.flex_attention` ({meta['date']}, torch {meta['torch']}, "
            f"jax {meta['jax']}, {meta['cpus']} CPU cores ({meta['cpu_model']})): batch 1, {args.heads} heads, "
            f"length {args.length}, head dim {args.dim}, float32; median and best of {args.repeats} calls.",
            "",
            markdown(report),
            "",
            *verdicts(report),
            "",
        ]
    )
    print(text)
    if not args.no_write:
        write_report(args.out, "flex_attention", report, text)
    return report


if __name__ == "__main__":
    main()
