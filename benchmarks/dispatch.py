"""The cost of one eager op on jax, against what JAX itself pays to launch the same
computation and against PyTorch's CPU op, in this one process.

    python -m benchmarks.dispatch [--calls 2000] [--rounds 7] [--out DIR | --no-write]

For each op (small operands: what generation loops, RNNs and the ops between compiled
graphs do), four variants: PyTorch's CPU op, ``jax.jit`` of the same jnp function
called on JAX arrays (JAX's own dispatch: its C++ fast path), the op on jax in strict
eager (a cache hit: the computation was compiled on the first call) and in fused eager
(recording the op into the fused graph; the graph runs after the timed calls, untimed).
A variant's time is its best round (``--rounds`` rounds of ``--calls`` calls, the
variants interleaved round by round, so that a machine busy for a while slows all of
them alike). Ratios: strict against ``jax.jit``, fused against the CPU op.

Where a strict op's time goes, measured by calling torch_jax's own pieces alone on the
op's captured arguments: PyTorch's dispatch to the Python kernel (the op's time less
``_executor.run``'s; for "view then op", the view's own call too); the arguments'
description and the cache lookup (``run`` less the two below; NOTE [The fast path of a
cache hit] in runtime/_executor); the call of the compiled executable; the result (its
tensor, storage and box). ``autograd``: what
``requires_grad`` operands add to ``add`` (the graph node PyTorch records). ``floor``:
PyTorch's dispatch to a Python kernel that returns its argument, the least any op of a
Python backend pays.

A ``torch.compile`` graph's call (issue 50's item 5), for ``add``: the compiled function
on jax (backend ``jax``), torch_jax's graph program called alone on the same tensors
(compile/_graph's ``Program``: argument handling, the executable, the results), and
the same ``add`` compiled with backend ``aot_eager`` on the CPU, less the CPU op: what
Dynamo's guards and frame and AOTAutograd's runtime wrapper cost any backend, the floor
of a compiled call.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch

from benchmarks import machine, write_report


def _cases():
    """name -> (torch function, jnp function, operands' maker): each function takes the
    operands as positional arguments."""
    g = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=g)

    idx = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    return {
        "add": (lambda x, y: x + y, lambda x, y: x + y, lambda: (rand(16), rand(16))),
        "mul_ (in place)": (lambda x, y: x.mul_(y), None, lambda: (rand(16), torch.ones(16))),
        "view then op": (lambda x: x.t().exp(), lambda x: jnp.exp(x.T), lambda: (rand(4, 4),)),
        "addmm": (torch.addmm, lambda b, x, w: b + x @ w, lambda: (rand(16), rand(8, 16), rand(16, 16))),
        "index_select": (
            lambda x, i: torch.index_select(x, 0, i),
            lambda x, i: jnp.take(x, i, axis=0),
            lambda: (rand(16, 4), idx),
        ),
        "cat": (lambda x, y: torch.cat([x, y]), lambda x, y: jnp.concatenate([x, y]), lambda: (rand(16), rand(16))),
        "argmax": (torch.argmax, jnp.argmax, lambda: (rand(16),)),
        "mul by a Python scalar": (lambda x: x * 2.5, lambda x: x * 2.5, lambda: (rand(16),)),
    }


def _loop(fn, args, calls: int) -> float:
    """Seconds a call of ``fn(*args)``, over ``calls`` calls."""
    start = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter() - start) / calls


def _jit_loop(fn, args, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        out = fn(*args)
    jax.block_until_ready(out)  # (the last call: each ran before the next started on this 1-queue device)
    return (time.perf_counter() - start) / calls


def _fused_loop(fn, args, calls: int) -> float:
    """Seconds a recorded op; the graph runs after the clock stops (and at most
    ``fused_max_ops`` ops are recorded between runs, so no run falls inside)."""
    import torch_jax

    chunk = min(calls, torch_jax.config.fused_max_ops - 1)
    total = 0.0
    done = 0
    torch_jax.config.mode = "fused"
    try:
        while done < calls:
            n = min(chunk, calls - done)
            start = time.perf_counter()
            for _ in range(n):
                fn(*args)
            total += time.perf_counter() - start
            torch.jax.synchronize()
            done += n
    finally:
        torch_jax.config.mode = "strict"
    return total / calls


def _capture(fn, args):
    """The ``_executor.run`` call that ``fn(*args)`` makes: its spec, arguments, the
    cache entry, the arrays it passed and the results, from ``run``'s frame or from its
    fast path's (NOTE [The fast path of a cache hit]); None where ``fn`` makes more than
    one call or none."""
    from torch_jax.runtime import _executor

    code = _executor.run.__code__
    runs, fast = [], []

    def profile(frame, event, arg):
        if event != "return":
            return
        if frame.f_code is code:
            runs.append(frame.f_locals.get("entry"))
        elif frame.f_code.co_filename.startswith("<torch_jax fast path") and arg is not _executor._MISS:
            fast.append(None)
        else:
            return
        loc = frame.f_locals
        seen.append((loc["spec"], loc["args"], loc.get("entry"), list(loc.get("dyn") or ()), loc.get("results")))

    seen = []
    sys.setprofile(profile)
    try:
        fn(*args)
    finally:
        sys.setprofile(None)
    if len(runs) != 1:
        return None
    return seen[0] if fast else seen[-1]  # (a fast path's frame returns first, then run's)


def _floor_op():
    """An op whose Python kernel on jax returns its argument: PyTorch's dispatch alone."""
    lib = torch.library.Library("torch_jax_dispatch_probe", "FRAGMENT")  # noqa: TOR901
    lib.define("same(Tensor x) -> Tensor")
    lib.impl("same", lambda x: x, "PrivateUse1")
    lib.impl("same", lambda x: x, "CPU")
    return lib, torch.ops.torch_jax_dispatch_probe.same.default


def _interleaved(measures: dict, rounds: int) -> dict:
    """Each measure's best round in microseconds: ``rounds`` rounds of all of them, one
    after the other, after a round of warm-up (first calls compile)."""
    samples = {k: [] for k in measures}
    for r in range(rounds + 1):
        for k, measure in measures.items():
            t = measure()
            if r:
                samples[k].append(t)
    return {k: min(v) * 1e6 for k, v in samples.items()}


def run(calls: int, rounds: int) -> dict:
    import torch_jax

    mode = torch_jax.config.mode
    torch_jax.config.mode = "strict"
    try:
        return _run(calls, rounds)
    finally:
        torch_jax.config.mode = mode


def _run(calls: int, rounds: int) -> dict:
    from torch_jax.runtime import _executor

    rows = []
    for name, (tfn, jfn, make) in _cases().items():
        cpu_args = make()
        jax_args = tuple(a.to("jax") for a in cpu_args)
        arrays = tuple(jnp.asarray(a.numpy()) for a in cpu_args)
        jitted = jax.jit(jfn) if jfn is not None else None
        if name.startswith("mul_"):  # (jnp has no in-place op: JAX's call is that of mul)
            jitted = jax.jit(lambda x, y: x * y)
        variants = {
            "cpu": functools.partial(_loop, tfn, cpu_args, calls),
            "jax.jit": functools.partial(_jit_loop, jitted, arrays, calls),
            "strict": functools.partial(_loop, tfn, jax_args, calls),
            "fused": functools.partial(_fused_loop, tfn, jax_args, calls),
        }
        row = {"op": name, **_interleaved(variants, rounds)}
        row["strict / jax.jit"] = row["strict"] / row["jax.jit"]
        row["fused / cpu"] = row["fused"] / row["cpu"]
        row.update(_breakdown(tfn, jax_args, calls, rounds, row["strict"], _executor))
        rows.append(row)
        print(f"{name}: strict {row['strict']:.1f} us ({row['strict / jax.jit']:.2f}x jax.jit), "
              f"fused {row['fused']:.1f} us ({row['fused / cpu']:.2f}x cpu)", flush=True)  # fmt: skip
    extra = _extras(calls, rounds)
    extra["compiled"] = _compiled(calls, rounds)
    return {
        "machine": machine(),
        "calls": calls,
        "rounds": rounds,
        "rows": rows,
        **extra,
        "median strict / jax.jit": statistics.median(r["strict / jax.jit"] for r in rows),
        "median fused / cpu": statistics.median(r["fused / cpu"] for r in rows),
    }


def _breakdown(tfn, jax_args, calls, rounds, strict_us, _executor) -> dict:
    """A strict op's time in its pieces (module docstring); empty where the op is more
    than one kernel call or its pieces cannot be called alone."""
    captured = _capture(tfn, jax_args)
    if captured is None:
        return {}
    spec, args, entry, dyn, results = captured
    if entry is None or spec.writes or spec.inplace:  # (a write replaces its operand's array: not repeatable)
        return {}
    pieces = {
        "run": lambda: _loop(_executor.run, (spec, args), calls),
        "executable": lambda: _jit_loop(entry.run, (dyn,), calls),
        "result": lambda: _loop(entry.finish, (args, results), calls),
    }
    best = _interleaved(pieces, rounds)
    return {
        "dispatch": max(strict_us - best["run"], 0.0),
        "describe + lookup": max(best["run"] - best["executable"] - best["result"], 0.0),
        "executable": best["executable"],
        "result": best["result"],
    }


def _extras(calls: int, rounds: int) -> dict:
    """The floor (PyTorch's dispatch to a Python kernel) and autograd's share of ``add``."""
    lib, same = _floor_op()
    x = torch.randn(16, device="jax")
    a, b = torch.randn(16, device="jax"), torch.randn(16, device="jax")
    ga, gb = a.clone().requires_grad_(), b.clone().requires_grad_()
    variants = {
        "floor": lambda: _loop(same, (x,), calls),
        "add": lambda: _loop(torch.add, (a, b), calls),
        "add with grad": lambda: _loop(torch.add, (ga, gb), calls),
    }
    best = _interleaved(variants, rounds)
    del lib
    return {"floor": best["floor"], "autograd": max(best["add with grad"] - best["add"], 0.0)}


def _compiled(calls: int, rounds: int) -> dict:
    """A compiled ``add``'s call and its pieces (module docstring), in microseconds."""
    from torch_jax.compile import _graph

    a, b = torch.randn(16, device="jax"), torch.randn(16, device="jax")
    ca, cb = a.cpu(), b.cpu()
    on_jax = torch.compile(lambda x, y: x + y, backend="jax", dynamic=False)
    on_cpu = torch.compile(lambda x, y: x + y, backend="aot_eager", dynamic=False)
    programs, call = [], _graph.Program.__call__

    def spy(self, *args):
        programs.append(self)
        return call(self, *args)

    _graph.Program.__call__ = spy
    try:
        on_jax(a, b)
    finally:
        _graph.Program.__call__ = call
    arrays = (jnp.asarray(ca.numpy()), jnp.asarray(cb.numpy()))
    variants = {
        "jax.jit": functools.partial(_jit_loop, jax.jit(lambda x, y: x + y), arrays, calls),
        "compiled on jax": functools.partial(_loop, on_jax, (a, b), calls),
        "graph program": functools.partial(_loop, programs[0], (a, b), calls),
        "aot_eager on cpu": functools.partial(_loop, on_cpu, (ca, cb), calls),
        "cpu": functools.partial(_loop, torch.add, (ca, cb), calls),
    }
    best = _interleaved(variants, rounds)
    best["dynamo + aot"] = max(best["aot_eager on cpu"] - best["cpu"], 0.0)
    best["compiled / jax.jit"] = best["compiled on jax"] / best["jax.jit"]
    return best


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [
        "# Eager dispatch: one op on jax against jax.jit and PyTorch's CPU",
        "",
        f"`python -m benchmarks.dispatch`, {m['date']}, {m['cpus']} CPUs ({m['cpu_model']}), torch "
        f"{m['torch']}, jax {m['jax']}; microseconds a call, the best of {report['rounds']} rounds of "
        f"{report['calls']} calls, the variants interleaved.",
        "",
        "| op | cpu | jax.jit | strict | fused | strict / jax.jit | fused / cpu "
        "| dispatch | describe + lookup | executable | result |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def us(row, k):
        return f"{row[k]:.1f}" if k in row else "-"

    for r in report["rows"]:
        lines.append(
            f"| {r['op']} | {r['cpu']:.2f} | {r['jax.jit']:.1f} | {r['strict']:.1f} | {r['fused']:.1f} "
            f"| {r['strict / jax.jit']:.2f}x | {r['fused / cpu']:.1f}x | {us(r, 'dispatch')} "
            f"| {us(r, 'describe + lookup')} | {us(r, 'executable')} | {us(r, 'result')} |"
        )
    lines += [
        "",
        f"Median over the ops: strict {report['median strict / jax.jit']:.2f}x `jax.jit`, fused "
        f"{report['median fused / cpu']:.1f}x the CPU op.",
        "",
        f"PyTorch's dispatch to a Python kernel that returns its argument (the floor of any op of a "
        f"Python backend): {report['floor']:.2f} us. `requires_grad` operands add {report['autograd']:.1f} us "
        "to `add` (autograd's node).",
        "",
    ]
    c = report.get("compiled")
    if c:
        lines += [
            f"A `torch.compile` graph's call (`add`, backend `jax`): {c['compiled on jax']:.1f} us, "
            f"{c['compiled / jax.jit']:.1f}x `jax.jit`'s {c['jax.jit']:.1f} us. Of it, torch_jax's graph program "
            f"called alone: {c['graph program']:.1f} us. The same `add` compiled with backend `aot_eager` on the "
            f"CPU takes {c['aot_eager on cpu']:.1f} us against the CPU op's {c['cpu']:.2f}: Dynamo's guards and "
            f"frame and AOTAutograd's wrapper cost any backend {c['dynamo + aot']:.1f} us a call, the floor of a "
            "compiled call.",
            "",
        ]
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dispatch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls a round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default="docs/benchmarks")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    np.random.seed(0)
    report = run(args.calls, args.rounds)
    text = markdown(report)
    print()
    print(text)
    if not args.no_write:
        write_report(args.out, "dispatch", report, text)
    return report


if __name__ == "__main__":
    main()
