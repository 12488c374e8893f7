"""The benchmark suite: every workload (benchmarks/workloads.py) under PyTorch CPU eager,
``torch.compile`` with Inductor, jax strict eager and jax fused eager, side by side in
this one process: each variant is built and warmed up, then the variants are timed in
rounds of one repeat each (a repeat runs the workload many times and waits for the
device); the median repeat, ratios against PyTorch CPU eager, peak memory beside time. It prints a table and writes ``README.md`` (Markdown),
``results.json`` and ``chart.png`` to ``--out`` (``docs/benchmarks`` by default).

    python -m benchmarks [--only TEXT ...] [--variants cpu,inductor,strict,fused]
                         [--repeats 5] [--quick] [--out DIR | --no-write]

Peak memory is the growth of the process's peak resident set (Linux ``VmHWM``, reset
before each variant) over its resident set when the variant started, measured while the
variant is built and runs its warm-up repeat (the same work as a timed repeat): the model,
its optimizer state, the compiled code and every buffer the variant held at its worst. On a
GPU-backed jax device the device's own peak is shown as well.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

import torch_jax
from benchmarks.workloads import WORKLOADS
from torch_jax._config import cpuinfo

VARIANTS = {
    "cpu": "PyTorch CPU eager",
    "inductor": "torch.compile (Inductor, CPU)",
    "cuda": "PyTorch CUDA eager",
    "cuda_inductor": "torch.compile (Inductor, CUDA)",
    "strict": "jax strict eager",
    "fused": "jax fused eager",
    "compiled": "torch.compile on jax",
}
DEFAULT_VARIANTS = "cpu,inductor,strict,fused,compiled"
_TORCH_DEVICE = {"cpu": "cpu", "inductor": "cpu", "cuda": "cuda", "cuda_inductor": "cuda"}  # else jax


def _machine(meta: dict) -> str:
    """The machine and the products' path, as the report's header says them."""
    text = f"{meta['cpus']} CPU cores ({meta.get('cpu_model', '?')}), jax device {meta['jax_device']}"
    if meta.get("cuda_device"):
        text += f", PyTorch CUDA device {meta['cuda_device']}"
    if "cpu_blas" in meta:
        text += ", fused graphs' products through " + ("MKL" if meta["cpu_blas"] else "XLA's dot")
    return text


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _reset_peak() -> int:
    """Free what can be freed, restart the peak-RSS count; the resident set now (kB)."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except (OSError, AttributeError):
        pass
    return _status_kb("VmRSS")


def _none():
    return None


def _device_peak() -> int | None:
    """The jax device's peak memory in bytes (a GPU's; None on XLA:CPU). JAX cannot reset it:
    it is the peak since the process started."""
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


class _Variant:
    """One workload under one variant: built and warmed up at once (its peak memory is
    measured then), timed one repeat at a time, interleaved with the other variants."""

    def __init__(self, workload, variant: str, inner: int):
        self.variant, self.inner, self.times = variant, inner, []
        self.device = _TORCH_DEVICE.get(variant, "jax")
        self.mode = "fused" if variant == "fused" else "strict"
        self.mark = variant == "fused" and workload.step
        self.compiles = self.graphs = self.graph_ops = 0
        start_kb = _reset_peak()
        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        built = time.perf_counter()
        with self._mode():
            self.fn = workload.setup(self.device, variant.endswith("inductor") or variant == "compiled")
            self._repeat(max(3, inner))  # (fused mode compiles the graphs it will reuse)
        # (build and warm-up: compilation, for the compiled variants, and the first runs)
        self.warmup_seconds = time.perf_counter() - built
        self.peak_mb = (_status_kb("VmHWM") - start_kb) / 1024
        self.device_peak = {"jax": _device_peak, "cuda": torch.cuda.max_memory_allocated}.get(self.device, _none)()

    @contextlib.contextmanager
    def _mode(self):
        before = torch_jax.config.mode
        torch_jax.set_mode(self.mode)
        try:
            yield
        finally:
            torch_jax.set_mode(before)

    def _repeat(self, n: int) -> float:
        kept = []  # every result stays alive, as a program uses its results (else fused mode
        # would rightly skip computing them)
        gc.collect()  # (the other variants' garbage is not this repeat's to collect)
        t0 = time.perf_counter()
        for _ in range(n):
            kept.append(self.fn())
            if self.mark:
                torch_jax.mark_step()
        if self.device != "cpu":
            torch.get_device_module(self.device).synchronize()
        return time.perf_counter() - t0

    def time_one_repeat(self) -> None:
        with self._mode():
            before = torch_jax.stats()
            self.times.append(self._repeat(self.inner) / self.inner)
            after = torch_jax.stats()
        for attr, keys in (
            ("compiles", ("compiles", "graphs_compiled", "compiled_graph_compiles")),
            ("graphs", ("graphs_run",)),
            ("graph_ops", ("graph_ops",)),
        ):
            setattr(self, attr, getattr(self, attr) + sum(after.get(k, 0) - before.get(k, 0) for k in keys))

    def result(self) -> dict:
        r = {
            "seconds": statistics.median(self.times),
            "repeats": [round(t, 9) for t in self.times],
            "peak_mb": self.peak_mb,
            "warmup_seconds": self.warmup_seconds,
            "compiles_while_timed": self.compiles if self.device == "jax" else None,
        }
        if self.device_peak is not None:
            r["device_peak_mb"] = self.device_peak / 2**20
        if self.mark:
            r["ops_per_graph"] = self.graph_ops / self.graphs if self.graphs else None
        return r


def _run_workload(workload, variants, repeats: int, inner: int) -> dict:
    """Every variant of one workload: each built and warmed up in turn, then timed in
    rounds (one repeat of each variant per round), so that a slow spell of a shared
    machine falls on all of them alike."""
    built, results = {}, {}
    for v in variants:
        try:
            built[v] = _Variant(workload, v, inner)
        except Exception as e:  # a variant that fails is reported, the suite goes on
            results[v] = {"error": f"{type(e).__name__}: {e}"[:300]}
    for _ in range(repeats):
        for v, b in list(built.items()):
            try:
                b.time_one_repeat()
            except Exception as e:
                results[v] = {"error": f"{type(e).__name__}: {e}"[:300]}
                del built[v]
    for v, b in built.items():
        results[v] = b.result()
    return {v: results[v] for v in variants}


def torchax_status() -> str:
    """Why torchax's jitted path is not among the variants (it is checked, not assumed)."""
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    probe = "import torchax, importlib.metadata as m; print(m.version('torchax'))"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        if "No module named 'torchax'" in last:
            return "torchax is not installed (`pip install torchax` adds no torch requirement)"
        return f"torchax does not import beside torch {torch.__version__}: {last}"
    return (
        f"torchax {r.stdout.strip()} imports, but it renames PrivateUse1 to 'jax' and registers "
        "torch.jax, which torch_jax holds in this process, so the two cannot run side by side"
    )


def _fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    return f"{seconds * 1e3:.2f} ms"


def _cell(results: dict, variant: str, baseline: str = "cpu") -> str:
    r = results.get(variant)
    if r is None:
        return "-"
    if "error" in r:
        return "error"
    base = results.get(baseline, {}).get("seconds")
    ratio = f" ({r['seconds'] / base:.2f}x)" if base else ""
    return _fmt_time(r["seconds"]) + ratio


def baseline(report: dict) -> str:
    """The variant the ratios are against: the first one run (PyTorch CPU eager by default)."""
    return report["variants"][0]


def _memory_table(report: dict, title: str, key: str, fmt: str = ".0f") -> list[str]:
    """A table of ``key`` per workload and variant; none where no variant measured it."""
    variants, rows, measured = report["variants"], [], False
    for name, results in report["results"].items():
        values = [(results.get(v) or {}).get(key) for v in variants]
        measured = measured or any(x is not None for x in values)
        rows.append(f"| {name} | " + " | ".join("-" if x is None else format(x, fmt) for x in values) + " |")
    if not measured:
        return []
    head = ["| workload | " + " | ".join(VARIANTS[v] for v in variants) + " |", "| --- |" + " --- |" * len(variants)]
    return ["", title, "", *head, *rows]


def markdown(report: dict) -> str:
    variants, base = report["variants"], baseline(report)
    lines = [
        "| workload | " + " | ".join(VARIANTS[v] for v in variants) + " |",
        "| --- |" + " --- |" * len(variants),
    ]
    for name, results in report["results"].items():
        lines.append(f"| {name} | " + " | ".join(_cell(results, v, base) for v in variants) + " |")
    lines += _memory_table(
        report, "Peak memory (MB above the process's resident set when the variant started; build and warm-up):",
        "peak_mb",
    )  # fmt: skip
    lines += _memory_table(
        report, "Peak device memory (MB; PyTorch CUDA's since the variant started, JAX's since the process "
        "started, as JAX cannot reset it):", "device_peak_mb",
    )  # fmt: skip
    lines += _memory_table(
        report, "Build and warm-up (seconds: making the model, compiling it for the compiled variants, then the "
        "untimed first repeat), apart from the steady-state times above:", "warmup_seconds", ".1f",
    )  # fmt: skip
    return "\n".join(lines)


# the fused-eager issue's targets: workload name prefix -> (fused speed-up over strict,
# fused time / CPU eager time), None where none is set
TARGETS = {"GPT-2-style step": (2.0, 1.0), "MLP": (None, 1.0)}


def headline(report: dict) -> list[str]:
    """The fused-eager figures of the training steps, read off this run, beside the targets."""
    out = []
    for name, results in report["results"].items():
        f, s, c = (results.get(v, {}).get("seconds") for v in ("fused", "strict", "cpu"))
        if not f or "step" not in name:
            continue
        speedup_target, cpu_target = next((t for k, t in TARGETS.items() if name.startswith(k)), (None, None))
        parts = []
        if s:
            met = (
                ""
                if speedup_target is None
                else f" (target {speedup_target:g}x: {'met' if s / f >= speedup_target else 'not met'})"
            )
            parts.append(f"fused {s / f:.2f}x faster than strict{met}")
        if c:
            met = (
                ""
                if cpu_target is None
                else f" (target <= {cpu_target:g}x: {'met' if f / c <= cpu_target else 'not met'})"
            )
            parts.append(f"fused takes {f / c:.2f}x PyTorch CPU eager's time{met}")
        parts.append(f"{results['fused'].get('compiles_while_timed')} compilations while timed")
        out.append(f"- {name}: " + "; ".join(parts))
    return out + compiled_headline(report)


# torch.compile's issue's targets: workload name prefix -> the compiled time / CPU eager's
# time at most (None: only the comparisons with fused and Inductor)
COMPILED_TARGETS = {"GPT-2-style step": 0.5, "GPT-2-style greedy generation": 1.0}


def compiled_headline(report: dict) -> list[str]:
    """torch.compile on jax beside its targets: at most COMPILED_TARGETS x PyTorch CPU eager,
    faster than Inductor (the GPT-2 step) and than fused eager (every workload), and no
    compilation while timed."""
    out = []
    for name, results in report["results"].items():
        r = results.get("compiled") or {}
        t = r.get("seconds")
        if not t:
            continue
        parts = []
        for variant, label in (("cpu", "PyTorch CPU eager"), ("inductor", "Inductor"), ("fused", "fused eager")):
            other = (results.get(variant) or {}).get("seconds")
            if not other:
                continue
            target = COMPILED_TARGETS.get(next((k for k in COMPILED_TARGETS if name.startswith(k)), None))
            if variant == "cpu" and target is not None:
                met = f" (target <= {target:g}x: {'met' if t / other <= target else 'not met'})"
            elif variant == "fused" or (variant == "inductor" and name.startswith("GPT-2-style step")):
                met = f" ({'faster' if t < other else 'not faster'}: target faster)"
            else:
                met = ""
            parts.append(f"{t / other:.2f}x {label}'s time{met}")
        parts.append(f"{r.get('compiles_while_timed')} compilations while timed")
        out.append(f"- {name}, compiled: " + "; ".join(parts))
    return out


def chart(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names, base = list(report["results"]), baseline(report)
    variants = [v for v in report["variants"] if v != base]
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(names) * max(1, len(variants)) / 2 + 1.5))
    height = 0.8 / max(1, len(variants))
    for k, v in enumerate(variants):
        ys, xs = [], []
        for i, name in enumerate(names):
            r, b = report["results"][name].get(v), report["results"][name].get(base)
            if r and b and "seconds" in r and "seconds" in b:
                ys.append(i + k * height)
                xs.append(r["seconds"] / b["seconds"])
        ax.barh(ys, xs, height=height, label=VARIANTS[v])
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_xscale("log")
    ax.set_yticks([i + height * (len(variants) - 1) / 2 for i in range(len(names))], names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"time relative to {VARIANTS[base]} (log scale; < 1 is faster)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(report: dict, out: str) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(report, f, indent=1)
    chart(report, os.path.join(out, "chart.png"))
    meta = report["meta"]
    text = [
        "# Benchmarks",
        "",
        f"Generated by `python -m benchmarks` ({meta['date']}, torch {meta['torch']}, jax {meta['jax']}, "
        f"{_machine(meta)}; median of {meta['repeats']} repeats).",
        f"Every workload ran under each variant in one process; ratios are against {VARIANTS[baseline(report)]} "
        "(below 1 is faster).",
        "",
        markdown(report),
        "",
        "Fused-eager targets, from this run:",
        "",
        *headline(report),
        "",
        *(
            [f"Interrupted (a time limit) at {report['interrupted_at']}: the workloads after it did not run.", ""]
            if "interrupted_at" in report
            else []
        ),
        f"torchax: {report['torchax']}.",
        "",
        f"![time relative to {VARIANTS[baseline(report)]}](chart.png)",
        "",
    ]
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write("\n".join(text))


def update_readme(report: dict, path: str) -> None:
    """Put this run's time table and target lines between the README's benchmark markers."""
    with open(path) as f:
        text = f.read()
    begin, end = "<!-- benchmarks:start -->\n", "<!-- benchmarks:end -->"
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    meta = report["meta"]
    table = markdown(report).split("\n\n")[0]
    block = [
        f"Last run: {meta['date']}, {_machine(meta)}, median of "
        f"{meta['repeats']} repeats (ratios against PyTorch CPU eager; below 1 is faster):",
        "",
        table,
        "",
        *headline(report),
        "",
    ]
    with open(path, "w") as f:
        f.write(head + begin + "\n".join(block) + end + tail)


def setup() -> dict:
    """Quiet transformers, start the device; the run's date, versions and machine."""
    try:
        import transformers

        transformers.logging.set_verbosity_error()
    except ImportError:
        pass
    import jax

    torch_jax.initialize()
    return {
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "jax": jax.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "cpu_model": cpuinfo("model name") or platform.processor() or platform.machine(),
        "jax_device": str(jax.devices()[0].device_kind),
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "cpu_blas": torch_jax.config.cpu_blas,
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", help="run the workloads whose names contain one of these")
    parser.add_argument(
        "--variants",
        default=DEFAULT_VARIANTS,
        help=f"comma-separated, the first is the baseline of the ratios: {','.join(VARIANTS)}",
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2 repeats of a tenth of the iterations (a smoke run)")
    parser.add_argument("--out", default="docs/benchmarks")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument(
        "--readme", metavar="PATH", help="also put the headline into PATH between its benchmark markers"
    )
    args = parser.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}")
    repeats = 2 if args.quick else args.repeats
    report = {
        "meta": {**setup(), "repeats": repeats},
        "variants": variants,
        "torchax": torchax_status(),
        "results": {},
    }
    print(f"torchax: {report['torchax']}")
    for w in WORKLOADS:
        if args.only and not any(s in w.name for s in args.only):
            continue
        inner = max(1, w.inner // 10) if args.quick else w.inner
        print(f"\n{w.name}")
        try:
            results = report["results"][w.name] = _run_workload(w, variants, repeats, inner)
        except KeyboardInterrupt:  # (a time limit: benchmarks/accelerator_check.sh) the rest is written
            report["interrupted_at"] = w.name
            print("interrupted: the workloads before this one are reported")
            break
        for v, r in results.items():
            if "error" in r:
                print(f"  {VARIANTS[v]:32s} error: {r['error']}")
                continue
            extra = (
                f"  compiles while timed: {r['compiles_while_timed']}" if r["compiles_while_timed"] is not None else ""
            )
            print(f"  {VARIANTS[v]:32s} {_cell(results, v, variants[0]):>22s}  peak {r['peak_mb']:7.0f} MB{extra}")
    print()
    print(markdown(report))
    print()
    print("\n".join(headline(report)))
    if not args.no_write:
        write(report, args.out)
        print(f"\nwrote {args.out}/README.md, results.json, chart.png")
    if args.readme:
        update_readme(report, args.readme)
        print(f"updated {args.readme}")
    return report


if __name__ == "__main__":
    main()
