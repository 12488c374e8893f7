"""Programs whose shapes keep changing, against PyTorch's CPU in the same run (NOTE
[Shapes that keep changing] in runtime/_recompiles): a training loop whose sequence
length changes every step, as dynamic padding gives, and greedy generation with the
default (dynamic) KV cache, which grows by one position a token.

Each variant runs in a fresh process, so that its peak resident set (Linux ``VmHWM``,
the whole process's, imports included), its memory mappings and its compile caches are
its own. A variant runs its program once: every step is a new shape, so the time is the
whole run, compilations included, which is what a new shape costs. The CPU's losses and
tokens are the reference; the report says how far each variant's are from them.

    python -m benchmarks.shapes [--lengths 400] [--tokens 600]
                                [--variants cpu,strict,fused] [--out DIR | --no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
import warnings

from benchmarks import machine, write_report

VARIANTS = {"cpu": "PyTorch CPU eager", "strict": "jax strict eager", "fused": "jax fused eager"}


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def _mappings() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


def training(device: str, size: int, step_done):
    """``Embedding(100, 32) -> Linear(32, 64) -> GELU -> Linear(64, 100)``, batch 2,
    cross-entropy and SGD, one step at each length 1..size in a scrambled order. The
    losses, one a step."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(100, 32), nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 100)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    lengths = list(range(1, size + 1))
    random.Random(0).shuffle(lengths)
    g = torch.Generator().manual_seed(1)
    losses = []
    for n in lengths:
        x = torch.randint(0, 100, (2, n), generator=g).to(device)
        y = torch.randint(0, 100, (2, n), generator=g).to(device)
        loss = F.cross_entropy(model(x).reshape(-1, 100), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        step_done()
        losses.append(loss.item())
    return losses


def generation(device: str, size: int, step_done):
    """``GPT2LMHeadModel`` (2 layers, width 64, vocabulary 1000), greedy, ``size`` new
    tokens after an 8-token prompt with the default dynamic KV cache. The tokens."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=2, vocab_size=1000, n_positions=1024, bos_token_id=0, eos_token_id=0
    )
    model = transformers.GPT2LMHeadModel(config).eval().to(device)
    prompt = torch.randint(0, 1000, (1, 8), generator=torch.Generator().manual_seed(1)).to(device)
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=size, min_new_tokens=size, do_sample=False, pad_token_id=0)
    step_done()
    return out[0].cpu().tolist()


PROGRAMS = {
    "training": ("changing-length training loop (lengths 1..{size}, scrambled)", training),
    "generation": ("greedy generation, dynamic KV cache ({size} new tokens)", generation),
}


def child(program: str, variant: str, size: int) -> dict:
    """One program under one variant, in this (fresh) process."""
    device = "cpu" if variant == "cpu" else "jax"
    if device == "jax":
        os.environ["TORCH_JAX_MODE"] = variant
    import torch  # noqa: F401 (torch_jax loads with it)

    peak_maps = [_mappings()]
    steps = [0]
    mark = None
    if variant == "fused":
        import torch_jax

        mark = torch_jax.mark_step

    def step_done():
        if mark is not None:
            mark()
        steps[0] += 1
        if steps[0] % 10 == 0:
            peak_maps[0] = max(peak_maps[0], _mappings())

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        result = PROGRAMS[program][1](device, size, step_done)
        seconds = time.perf_counter() - t0
    peak_maps[0] = max(peak_maps[0], _mappings())
    out = {
        "seconds": seconds,
        "peak_rss_mb": _status_mb("VmHWM"),
        "peak_mappings": peak_maps[0],
        "result": result,
    }
    if device == "jax":
        import torch_jax

        stats = torch_jax.stats()
        out["stats"] = {
            k: stats.get(k, 0)
            for k in (
                "compiles",
                "graphs_compiled",
                "graphs_op_by_op",
                "cache_evictions",
                "graph_evictions",
                "bucketed_ops",
            )
        }
        out["recompile_warnings"] = sum(1 for w in caught if issubclass(w.category, torch_jax.RecompileWarning))
    return out


def _run_child(program: str, variant: str, size: int, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.shapes", "--child", program, variant, str(size)]
    env = dict(os.environ)
    env.pop("TORCH_JAX_MODE", None)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"ran past {timeout:.0f} s"}
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {r.returncode}: {last}"[:300]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def _agreement(program: str, result, reference) -> str:
    """How a variant's losses or tokens compare with the CPU's."""
    if program == "generation":
        same = sum(1 for a, b in zip(result, reference) if a == b)
        return "same tokens" if result == reference else f"{same} of {len(reference)} tokens the same"
    worst = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(result, reference))
    return f"losses within {worst:.1e} (relative)"


def run(sizes: dict, variants: list[str], timeout: float = 3600.0) -> dict:
    """Every program under every variant, each in its own process; the CPU's first."""

    report = {
        "meta": {
            **machine(),
            "max_map_count": _max_map_count(),
        },
        "results": {},
    }
    for program, size in sizes.items():
        results = report["results"][PROGRAMS[program][0].format(size=size)] = {}
        for v in ["cpu"] + [v for v in variants if v != "cpu"]:
            r = results[v] = _run_child(program, v, size, timeout)
            if "error" not in r and v != "cpu" and "error" not in results["cpu"]:
                r["vs_cpu"] = _agreement(program, r["result"], results["cpu"]["result"])
                r["ratio"] = r["seconds"] / results["cpu"]["seconds"]
            print(f"{program:10s} {VARIANTS[v]:20s} {_line(r)}", flush=True)
    return report


def _max_map_count() -> int | None:
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except OSError:
        return None


def _line(r: dict) -> str:
    if "error" in r:
        return "error: " + r["error"]
    text = f"{r['seconds']:8.1f} s"
    if "ratio" in r:
        text += f" ({r['ratio']:.1f}x)"
    text += f"  peak RSS {r['peak_rss_mb']:.0f} MB  peak mappings {r['peak_mappings']}"
    if "vs_cpu" in r:
        text += f"  {r['vs_cpu']}  warnings {r['recompile_warnings']}"
    return text


def markdown(report: dict) -> str:
    meta = report["meta"]
    lines = [
        "# Programs whose shapes keep changing",
        "",
        f"Generated by `python -m benchmarks.shapes` ({meta['date']}, torch {meta['torch']}, jax {meta['jax']}, "
        f"{meta['cpus']} CPU cores ({meta['cpu_model']}), vm.max_map_count {meta['max_map_count']}). "
        "Each variant ran once in a fresh process; time is the whole run, compilations included; "
        "peak RSS is the process's (imports included).",
        "",
        "| program | variant | time | vs CPU | peak RSS | peak mappings | compilations (op computations traced, graphs) | evictions | "
        "result vs CPU | warnings |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, results in report["results"].items():
        for v, r in results.items():
            if "error" in r:
                lines.append(f"| {name} | {VARIANTS[v]} | error: {r['error']} | | | | | | | |")
                continue
            cells = [f"{r['seconds']:.1f} s", f"{r['ratio']:.1f}x" if "ratio" in r else "1x"]
            cells += [f"{r['peak_rss_mb']:.0f} MB", str(r["peak_mappings"])]
            s = r.get("stats")
            if s:
                graphs = f", {s['graphs_compiled']} graphs" if s["graphs_compiled"] else ""
                if s["graphs_op_by_op"]:
                    graphs += f" ({s['graphs_op_by_op']} run op by op)"
                evictions = s["cache_evictions"] + s["graph_evictions"]
                cells += [f"{s['compiles']} ops{graphs}", str(evictions), r["vs_cpu"], str(r["recompile_warnings"])]
            else:
                cells += ["-"] * 4
            lines.append(f"| {name} | {VARIANTS[v]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict | None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shapes", description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, default=400, help="training: one step at each length 1..N")
    parser.add_argument("--tokens", type=int, default=600, help="generation: new tokens")
    parser.add_argument("--variants", default="cpu,strict,fused")
    parser.add_argument("--only", choices=sorted(PROGRAMS))
    parser.add_argument("--out", default="docs/benchmarks")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--child", nargs=3, metavar=("PROGRAM", "VARIANT", "SIZE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        program, variant, size = args.child
        print(json.dumps(child(program, variant, int(size))))
        return None
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if set(variants) - set(VARIANTS):
        parser.error(f"unknown variants {sorted(set(variants) - set(VARIANTS))}")
    sizes = {"training": args.lengths, "generation": args.tokens}
    if args.only:
        sizes = {args.only: sizes[args.only]}
    report = run(sizes, variants)
    text = markdown(report)
    print()
    print(text)
    if not args.no_write:
        write_report(args.out, "shapes", report, text)
    return report


if __name__ == "__main__":
    main()
