"""Where a training step's time goes in strict eager, fused eager and ``torch.compile`` on
jax, side by side: the numbers behind a ratio the suite reports (``python -m benchmarks.profile``).

    python -m benchmarks.profile [--only TEXT] [--repeats 5] [--quick] [--out DIR | --no-write]

The workload (the GPT-2-style step unless ``--only`` names another training workload of
benchmarks/workloads.py) is built and warmed up under strict eager, fused eager and
``torch.compile`` (its default backend, routed to jax) as in the suite, the three are timed
in interleaved repeats (the median step), and then each runs one more repeat under JAX's
profiler. From the trace's XLA:CPU kernels (its events that name
an HLO instruction):

- *busy*: the time any kernel ran, the union over XLA's threads; the rest of the step XLA
  waited for the host (Python, PyTorch's dispatch, torch_jax dispatching or recording
  ops) or for nothing;
- in fused mode and compiled, busy time split by what the kernels do, from the HLO of the
  fused graphs and of the compiled graphs' computations:
  matrix products (a dot, a convolution, a BLAS call, or a fusion around one), copies and
  layout changes (fusions of data movement only), and elementwise work, reductions and the
  rest. Where two kernels run at once, each gets half of that moment;
- the products' floating-point operations per step (2 * output size * contraction
  length, summed over the products that ran) and the rate they ran at.

The bound follows: the products alone, at the rate they ran in the fused graph, take
``P`` ms, so no fused step can be more than ``strict / P`` times faster than strict on
this machine, whatever the rest costs. It writes ``profile.md`` to ``--out``
(``docs/benchmarks``).
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import math
import os
import re
import statistics
import tempfile

import torch

import torch_jax
from benchmarks.__main__ import _machine, _Variant, setup
from benchmarks.workloads import WORKLOADS

PRODUCTS, COPIES, ELEMENTWISE, OTHER = "matrix products", "copies and layout", "elementwise, reductions, rest", "other"
_MOVES = frozenset(
    "parameter constant copy transpose bitcast broadcast reshape slice dynamic-slice dynamic-update-slice "
    "concatenate pad reverse tuple get-tuple-element iota".split()
)
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(\S+) = (\(.*?\)|\S+) ([\w-]+)\((.*)$", re.M)
_COMPUTATION = re.compile(r"^(?:ENTRY )?%(\S+) .*?\{\n(.*?)^\}", re.M | re.S)


def _dims(shape: str) -> list[int]:
    m = re.match(r"\w+\[([\d,]*)\]", shape)
    return [int(d) for d in m.group(1).split(",") if d] if m else []


def _flops(opcode: str, shape: str, rest: str, shapes: dict) -> int:
    """A product's floating-point operations: 2 * output elements * contraction length."""
    out = math.prod(_dims(shape))
    operands = re.findall(r"%([\w.-]+)", rest.split(")", 1)[0])
    if opcode == "dot":
        lhs = _dims(shapes.get(operands[0], ""))
        contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", rest)
        k = math.prod(lhs[int(d)] for d in contracting.group(1).split(",") if d) if contracting else 1
        return 2 * out * k
    if opcode == "convolution":
        kernel = _dims(shapes.get(operands[1], ""))
        labels = re.search(r"dim_labels=\w+_(\w+)->", rest)
        if not labels or len(labels.group(1)) != len(kernel):
            return 0
        return 2 * out * math.prod(kernel) // kernel[labels.group(1).index("o")]
    if opcode == "custom-call" and "tj_gemm" in rest:  # (the BLAS call: operand 0 gives each output row's k)
        lhs, rows = math.prod(_dims(shapes.get(operands[0], ""))), (_dims(shape) or [1])[0]
        return 2 * out * (lhs // rows if rows else 0)
    return 0


def hlo_kinds(text: str) -> dict:
    """Each instruction of an HLO module's computations: (kind, floating-point operations of
    its products), where a fusion takes the kind of its body."""
    computations = {}
    for name, body in _COMPUTATION.findall(text):
        shapes = {m.group(1): m.group(2) for m in _INSTRUCTION.finditer(body)}
        computations[name] = [
            (m.group(1), m.group(2), m.group(3), m.group(4), shapes) for m in _INSTRUCTION.finditer(body)
        ]

    def body_kind(name: str, seen=()) -> tuple:
        kinds, flops = set(), 0
        for _, shape, opcode, rest, shapes in computations.get(name, []):
            kind, f = instruction_kind(shape, opcode, rest, shapes, seen + (name,))
            kinds.add(kind)
            flops += f
        if PRODUCTS in kinds:
            return PRODUCTS, flops
        if kinds <= {COPIES, OTHER}:
            return COPIES, 0
        return ELEMENTWISE, 0

    def instruction_kind(shape, opcode, rest, shapes, seen) -> tuple:
        if opcode in ("dot", "convolution") or (opcode == "custom-call" and "tj_gemm" in rest):
            return PRODUCTS, _flops(opcode, shape, rest, shapes)
        if opcode == "custom-call":
            return OTHER, 0  # (the fusion barrier: no work)
        if opcode == "fusion":
            called = re.search(r"calls=%([\w.-]+)", rest)
            if called and called.group(1) not in seen:
                return body_kind(called.group(1), seen)
        if opcode in _MOVES:
            return (
                OTHER if opcode in ("parameter", "constant", "tuple", "get-tuple-element", "bitcast") else COPIES
            ), 0
        return ELEMENTWISE, 0

    kinds = {}
    for name, instructions in computations.items():
        for iname, shape, opcode, rest, shapes in instructions:
            kinds[iname] = instruction_kind(shape, opcode, rest, shapes, (name,))
    return kinds


def kernel_times(trace_dir: str, kinds: dict | None, steps: int) -> dict:
    """Per step, from the trace under ``trace_dir``: busy time, kernels run, and with
    ``kinds`` (name -> (kind, flops)) the time and products' operations per kind."""
    (path,) = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
    with gzip.open(path) as f:
        events = [
            e
            for e in json.load(f)["traceEvents"]
            if e.get("ph") == "X" and "hlo_op" in (e.get("args") or {}) and e.get("dur", 0) >= 0
        ]
    points = sorted(
        [(e["ts"], 1, i) for i, e in enumerate(events)] + [(e["ts"] + e["dur"], -1, i) for i, e in enumerate(events)]
    )
    active, last, busy = set(), None, 0.0
    share = collections.Counter()
    for t, d, i in points:
        if active and last is not None:
            busy += t - last
            for a in active:
                share[a] += (t - last) / len(active)
        last = t
        (active.add if d == 1 else active.discard)(i)
    out = {"busy_ms": busy / steps / 1e3, "kernels": len(events) / steps}
    if kinds is not None:

        def name(e):  # (an instruction, or "module/instruction" where kinds name the modules)
            op = e["args"]["hlo_op"]
            qualified = f"{e['args'].get('hlo_module')}/{op}"
            return qualified if qualified in kinds else op

        by_kind, flops = collections.Counter(), 0
        for i, e in enumerate(events):
            kind, f = kinds.get(name(e), (ELEMENTWISE, 0))
            by_kind[kind] += share[i]
            flops += f
        out["by_kind_ms"] = {k: by_kind[k] / steps / 1e3 for k in (PRODUCTS, ELEMENTWISE, COPIES, OTHER)}
        out["product_gflop"] = flops / steps / 1e9
        per_name, per_name_flops = collections.Counter(), collections.Counter()
        for i, e in enumerate(events):
            per_name[name(e)] += share[i]
            per_name_flops[name(e)] += kinds.get(name(e), (ELEMENTWISE, 0))[1]
        out["top"] = [
            (name, kinds.get(name, (ELEMENTWISE, 0))[0], us / steps / 1e3, per_name_flops[name] / steps)
            for name, us in per_name.most_common(12)
        ]
    return out


def _profiled_repeat(variant: _Variant, trace_dir: str) -> tuple:
    """One repeat under JAX's profiler, tracing XLA's kernels but not Python's calls (which
    would slow the host several times over); its seconds per step. The first traced
    repeat of a variant ran 1.5-3x slower than the next (GPT-2's step, strict and fused),
    so one traced repeat is thrown away first. Also the ops the executor ran or recorded
    per step."""
    import jax

    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0
    with variant._mode(), tempfile.TemporaryDirectory() as scratch:
        for d in (scratch, trace_dir):
            torch.jax.synchronize()
            ops = torch_jax.stats().get("ops", 0)
            jax.profiler.start_trace(d, profiler_options=options)
            try:
                seconds = variant._repeat(variant.inner) / variant.inner
            finally:
                jax.profiler.stop_trace()
            ops = (torch_jax.stats().get("ops", 0) - ops) / variant.inner
    return seconds, ops


MODES = ("strict", "fused", "compiled")


def profile(workload, repeats: int, inner: int) -> dict:
    from torch_jax.compile import _graph
    from torch_jax.runtime import _fused

    variants = {v: _Variant(workload, v, inner) for v in MODES}
    for _ in range(repeats):
        for v in variants.values():
            v.time_one_repeat()
    result = {}
    for name, v in variants.items():
        with tempfile.TemporaryDirectory() as d:
            _fused.recent.clear()
            _graph.recent.clear()
            traced, ops = _profiled_repeat(v, d)
            kinds = None
            if name != "strict":
                kinds = {}
                # (the executables the traced repeat ran: fused eager's graphs, or torch.compile's)
                for ref in dict.fromkeys(_fused.recent if name == "fused" else _graph.recent):
                    if ref() is not None:
                        text = ref().as_text()
                        if name == "fused":
                            kinds.update(hlo_kinds(text))
                        else:  # (several computations a step: their instructions named by module, jit_forward3)
                            module = re.match(r"HloModule ([^\s,]+)", text).group(1)
                            kinds.update({f"{module}/{k}": v for k, v in hlo_kinds(text).items()})
            r = kernel_times(d, kinds, v.inner)
        r["step_ms"] = statistics.median(v.times) * 1e3
        r["traced_step_ms"] = traced * 1e3
        r["ops"] = ops
        result[name] = r
    return result


def markdown(name: str, meta: dict, r: dict) -> str:
    s, f, c = (r[m] for m in MODES)
    rows = [
        ("step (median)", "step_ms"),
        ("step, the repeat under the profiler", "traced_step_ms"),
        ("in it, XLA kernels running (union over threads)", "busy_ms"),
    ]
    lines = [
        "# Where the step's time goes",
        "",
        f"Generated by `python -m benchmarks.profile` ({meta['date']}, torch {torch.__version__}, "
        f"{_machine(meta)}): {name}. Strict eager, fused eager and `torch.compile` on jax timed side by side "
        "in one process (the median of interleaved repeats), then one repeat of each under JAX's profiler; "
        "times are per step.",
        "",
        "| | jax strict eager | jax fused eager | torch.compile on jax |",
        "| --- | --- | --- | --- |",
    ]
    lines += [f"| {label} | " + " | ".join(f"{x[key]:.1f} ms" for x in (s, f, c)) + " |" for label, key in rows]
    idle = " | ".join(f"{x['traced_step_ms'] - x['busy_ms']:.1f} ms" for x in (s, f, c))
    lines.append(f"| in it, XLA idle: the host dispatches, records or waits | {idle} |")
    lines.append("| XLA kernels run | " + " | ".join(f"{x['kernels']:.0f}" for x in (s, f, c)) + " |")
    lines.append("| ops through torch_jax's executor | " + " | ".join(f"{x['ops']:.0f}" for x in (s, f, c)) + " |")
    lines += ["", "Kernel time by what the kernels do (from the HLO of fused eager's graphs and of the compiled", ""]
    lines[-2] += " graphs' computations):"
    lines += [
        "| kind | fused: ms per step | share | compiled: ms per step | share |",
        "| --- | --- | --- | --- | --- |",
    ]
    for kind in f["by_kind_ms"]:
        a, b = f["by_kind_ms"][kind], c["by_kind_ms"][kind]
        lines.append(
            f"| {kind} | {a:.1f} | {100 * a / f['traced_step_ms']:.0f}% | {b:.1f} | {100 * b / c['traced_step_ms']:.0f}% |"
        )
    lines.append("")
    for label, x in (("fused graph", f), ("compiled graphs", c)):
        products, gflop = x["by_kind_ms"][PRODUCTS], x["product_gflop"]
        if products > 0 and gflop > 0:
            lines.append(
                f"- {label}: the products do {gflop:.1f} GFLOP a step at {gflop / products * 1e3:.0f} GFLOP/s "
                f"({products:.1f} ms). With every other cost at zero a step would take those {products:.1f} ms: "
                f"at most **{s['step_ms'] / products:.2f}x** faster than strict ({s['step_ms']:.1f} ms)."
            )
    for label, x in (("the fused graph", f), ("the compiled graphs", c)):
        lines += ["", f"The costliest kernels of {label} (HLO instructions; a kernel that runs several times "]
        lines[-1] += "a step is summed):"
        lines += ["", "| kernel | kind | ms per step | GFLOP/s |", "| --- | --- | --- | --- |"]
        for kname, kind, ms, flops in x["top"]:
            rate = f"{flops / ms / 1e6:.0f}" if flops and ms else ""
            lines.append(f"| `{kname}` | {kind} | {ms:.2f} | {rate} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="GPT-2-style step", help="the training workload whose name contains this")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2 repeats of one step (a smoke run)")
    parser.add_argument("--out", default="docs/benchmarks")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    (workload,) = [w for w in WORKLOADS if args.only in w.name and w.step]
    meta = setup()
    result = profile(workload, 2 if args.quick else args.repeats, 1 if args.quick else workload.inner)
    text = markdown(workload.name, meta, result)
    print(text)
    if not args.no_write:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "profile.md"), "w") as f:
            f.write(text)
        print(f"wrote {args.out}/profile.md")
    return {"meta": meta, "workload": workload.name, **result}


if __name__ == "__main__":
    main()
