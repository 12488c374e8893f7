"""``python -m torch_jax.report coverage``: which ops run natively on jax, which fall back
to the CPU, which fail, per dtype, with the headline numbers.

It runs the OpInfo sweep (``_sweep.check``) for every (OpInfo, dtype) pair the CPU
supports, with the CPU fallback allowed and counted: a pair passes *natively* when it
matches the CPU and no aten op ran through the fallback. It also classifies every aten
op of PyTorch's Core ATen opset and every op the sweep reached.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import glob
import json
import os
import platform
import sys
import time

import torch

from torch_jax.report import _sparse, _sweep


def _aten_status():
    """aten op overload name -> how the jax device runs it."""
    import torch_jax

    torch_jax.initialize()
    from torch_jax.ops._registry import DECLARED_FALLBACKS, LOWERINGS
    from torch_jax.runtime._install import REGISTERED

    status = {}
    for op, how in REGISTERED.items():
        status[str(op)] = "lowered" if how in ("lowered", "inplace", "out") else "kernel"  # (a redirect too)
    for op in LOWERINGS:
        status.setdefault(str(op), "lowered")
    for op in DECLARED_FALLBACKS:
        status[str(op)] = "declared fallback"
    return status


def _core_ops():
    """Overloads of PyTorch's Core ATen opset (ops tagged torch.Tag.core)."""
    out = []
    for name in dir(torch.ops.aten):
        packet = getattr(torch.ops.aten, name, None)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for ov in packet.overloads():
            op = getattr(packet, ov)
            if torch.Tag.core in op.tags:
                out.append(op)
    return out


def _composite(op) -> bool:
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return has(op.name(), "CompositeImplicitAutograd") or has(op.name(), "CompositeExplicitAutograd")


def _load_journal(journal):
    """Results already in the journal files ``journal.*``: (OpInfo, dtype) -> Result."""
    done = {}
    for path in sorted(glob.glob(glob.escape(journal) + ".*")):
        with open(path) as f:
            for line in f:
                if line.strip():
                    r = _sweep.Result(**json.loads(line))
                    done[(r.op, r.dtype)] = r
    return done


def run(dtypes, names=None, max_samples=None, grads=True, variants=True, progress=True, journal=None, claims=None):
    """Check every (OpInfo, dtype) pair. NOTE [Coverage journal]: with ``journal``, each
    result is appended to ``journal.<pid>`` as it is made, and pairs found in any
    ``journal.*`` file are not run again, so a sweep longer than one sitting resumes.
    With ``claims`` (a folder the workers of one parallel run share), an OpInfo is
    checked by the worker that claims it first and skipped by the others."""
    ops = [op for op in _sweep.opinfos() if names is None or _sweep.name_of(op) in names]
    done = _load_journal(journal) if journal else {}
    if journal:
        os.makedirs(os.path.dirname(os.path.abspath(journal)), exist_ok=True)
    log = open(f"{journal}.{os.getpid()}", "a") if journal else None  # noqa: SIM115 (open for the whole run)
    results = []
    start = time.time()
    for n, op in enumerate(ops):
        if claims is not None and not _claim(claims, _sweep.name_of(op)):
            continue
        for dtype in dtypes:
            if not _sweep.supported(op, dtype):
                continue
            r = done.get((_sweep.name_of(op), _dtype_name(dtype)))
            if r is None:
                r = _sweep.check(op, dtype, max_samples=max_samples, grads=grads, variants=variants, fallback="silent")
                if log is not None:
                    log.write(json.dumps(r.__dict__) + "\n")
                    log.flush()
            results.append(r)
        if progress:
            print(
                f"\r[{n + 1}/{len(ops)}] {_sweep.name_of(op):50s} {time.time() - start:7.0f}s", end="", file=sys.stderr
            )
    if progress:
        print(file=sys.stderr)
    if log is not None:
        log.close()
    return results


def run_modules(names=None, dtypes=None, progress=True):
    """Check every (ModuleInfo, dtype, mode) of PyTorch's module database (NOTE in
    report/_modules), or the ModuleInfos named in ``names``."""
    from torch_jax.report import _modules

    infos = [i for i in _modules.module_infos() if names is None or i.name in names]
    results = []
    start = time.time()
    for n, info in enumerate(infos):
        for dtype in dtypes or _modules.DTYPES:
            if not _modules.supported(info, dtype):
                continue
            for training in _modules.modes(info):
                results.append(_modules.check(info, dtype, training))
        if progress:
            print(f"\r[{n + 1}/{len(infos)}] {info.name:50s} {time.time() - start:7.0f}s", end="", file=sys.stderr)
    if progress:
        print(file=sys.stderr)
    return results


def _claim(folder: str, name: str) -> bool:
    """Whether this process is the first to claim OpInfo ``name`` in ``folder``."""
    try:
        os.close(os.open(os.path.join(folder, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def run_parallel(jobs, dtypes, names, max_samples, grads, variants, journal=None):
    """``run`` split over ``jobs`` worker processes (each a fresh interpreter with its own
    JAX runtime); the results come back through JSON files. Each worker walks the whole
    list and takes the next OpInfo no other worker has claimed, so no worker idles while
    another still has a long tail of slow OpInfos (pooling, convolutions) to run."""
    import subprocess
    import tempfile

    all_names = [_sweep.name_of(op) for op in _sweep.opinfos() if names is None or _sweep.name_of(op) in names]
    with tempfile.TemporaryDirectory() as tmp:
        claims = os.path.join(tmp, "claims")
        os.makedirs(claims)
        procs = []
        for j in range(jobs):
            cmd = [sys.executable, "-m", "torch_jax.report", "coverage", "--jobs", "1", "--quiet"]
            cmd += ["--out", os.path.join(tmp, str(j)), "--dtypes", ",".join(_dtype_name(d) for d in dtypes)]
            cmd += ["--ops", ",".join(all_names), "--claims", claims]
            if max_samples is not None:
                cmd += ["--max-samples", str(max_samples)]
            cmd += [] if grads else ["--no-grads"]
            cmd += [] if variants else ["--no-variants"]
            cmd += ["--journal", journal] if journal else []
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL))
        results = []
        for j, proc in enumerate(procs):
            if proc.wait() != 0:
                raise RuntimeError(f"coverage worker {j} failed with exit status {proc.returncode}")
            with open(os.path.join(tmp, str(j), "coverage.json")) as f:
                results += [_sweep.Result(**r) for r in json.load(f)["results"]]
    order = {n: i for i, n in enumerate(all_names)}
    return sorted(results, key=lambda r: order.get(r.op, -1))


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def summarize(results, dtypes):
    pairs = [r for r in results if r.status != "skip"]
    native = [r for r in pairs if r.status == "pass" and not r.fallback_ops]
    with_fallback = [r for r in pairs if r.status == "pass"]
    per_dtype = {}
    for d in dtypes:
        name = str(d).replace("torch.", "")
        rs = [r for r in pairs if r.dtype == name]
        per_dtype[name] = {
            "pairs": len(rs),
            "native": sum(1 for r in rs if r.status == "pass" and not r.fallback_ops),
            "with_fallback": sum(1 for r in rs if r.status == "pass"),
        }
    fallback_ops = collections.Counter()
    for r in results:
        for op in r.fallback_ops:
            fallback_ops[op] += 1
    aten = _aten_status()
    core = _core_ops()
    core_status = {}
    for op in core:
        s = aten.get(str(op))
        if s is None:
            s = "decomposed (composite)" if _composite(op) else "not lowered"
        core_status[str(op)] = s
    return {
        "pairs": len(pairs),
        "native": len(native),
        "with_fallback": len(with_fallback),
        "excluded": sum(1 for r in results if r.status == "skip"),
        "native_rate": len(native) / max(len(pairs), 1),
        "with_fallback_rate": len(with_fallback) / max(len(pairs), 1),
        "per_dtype": per_dtype,
        "fallback_ops": dict(fallback_ops.most_common()),
        "core_aten": core_status,
        "lowered_ops": sorted(k for k, v in aten.items() if v == "lowered"),
    }


def markdown(summary, results, meta) -> str:
    lines = [
        "# Operator coverage",
        "",
        "Generated by `python -m torch_jax.report coverage` "
        f"({meta['date']}, torch {meta['torch']}, jax {meta['jax']}, {meta['settings']}).",
        "",
        "Every (OpInfo, dtype) pair of PyTorch's OpInfo database that the CPU supports, in the dtypes "
        f"{', '.join(meta['dtypes'])}, runs on `jax` and on CPU; outputs, in-place and out= variants and "
        "(float32/float64) gradients must match. *Native* means it matched with no op through the CPU fallback.",
        "",
        "## Headline",
        "",
        "| | pairs | share |",
        "| --- | --- | --- |",
        f"| (OpInfo, dtype) pairs compared | {summary['pairs']} | |",
        f"| pass natively (fallback off) | {summary['native']} | {summary['native_rate']:.1%} |",
        f"| pass with the CPU fallback allowed | {summary['with_fallback']} | {summary['with_fallback_rate']:.1%} |",
        f"| excluded (listed with reasons) | {summary['excluded']} | |",
        "",
        "## Per dtype",
        "",
        "| dtype | pairs | native | with fallback |",
        "| --- | --- | --- | --- |",
    ]
    for d, v in summary["per_dtype"].items():
        lines.append(f"| {d} | {v['pairs']} | {v['native']} | {v['with_fallback']} |")
    core = summary["core_aten"]
    counts = collections.Counter(core.values())
    lines += ["", "## Core ATen opset", "", "| status | overloads |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in sorted(counts.items())]
    missing = sorted(k for k, v in core.items() if v == "not lowered")
    if missing:
        lines += ["", "Core ATen overloads without a lowering: " + ", ".join(f"`{m}`" for m in missing)]
    lines += [
        "",
        "## Aten ops that ran through the CPU fallback",
        "",
        "| aten op | (OpInfo, dtype) pairs |",
        "| --- | --- |",
    ]
    lines += [f"| `{op}` | {n} |" for op, n in summary["fallback_ops"].items()]
    lines += _matrix(results, meta["dtypes"])
    failing = [r for r in results if r.status == "fail"]
    lines += ["", "## Failing pairs", ""]
    if not failing:
        lines.append("None.")
    else:
        lines += ["| OpInfo | dtype | first mismatch |", "| --- | --- | --- |"]
        for r in failing:
            msg = r.message.splitlines()[0].replace("|", "\\|")[:200] if r.message else ""
            lines.append(f"| {r.op} | {r.dtype} | {msg} |")
    lines += [
        "",
        "## Known differences from the CPU",
        "",
        "Listed in the manual's page *Known differences from the CPU* (docs/known-differences.md), each with whether it can be fixed.",
    ]
    lines += [
        "",
        "## Comparison adjustments",
        "",
        "Listed in `src/torch_jax/report/_sweep.py`, each with its reason.",
        "",
    ]
    lines += [f"- `{op}`: out= not compared: {why}" for op, why in _sweep.NO_OUT_CHECK.items()]
    lines += [
        f"- `{op}` {_dtype_name(d)}: rtol {rtol:g}, atol {atol:g}" for (op, d), (rtol, atol) in _sweep.TOLERANCE.items()
    ]
    lines.append(
        "- sort, argsort, topk, kthvalue, median, nanmedian, mode: indices are compared through the values they "
        "select (which of several equal elements' index is returned is unspecified, and differs between CPU and CUDA)"
    )
    excluded = sorted({(r.op, r.message) for r in results if r.status == "skip"})
    lines += ["", "## Excluded OpInfos", "", "| OpInfo | reason |", "| --- | --- |"]
    lines += [f"| {op} | {msg} |" for op, msg in excluded]
    return "\n".join(lines) + "\n"


MARKS = {"native": "ok", "fallback": "fb", "fail": "FAIL", "skip": "excl"}
MODULES_START, MODULES_END = "<!-- modules:start -->", "<!-- modules:end -->"


def _how(r) -> str:
    return "fallback" if r.status == "pass" and r.fallback_ops else "native" if r.status == "pass" else r.status


def modules_markdown(results, meta) -> list[str]:
    """The module section of COVERAGE.md: one row per ModuleInfo (and mode, where train
    and eval differ), one column per dtype, between markers that ``--modules-only``
    rewrites in place."""
    from torch_jax.report import _modules

    dtypes = sorted({r.dtype for r in results}, key=lambda d: [_dtype_name(t) for t in _modules.DTYPES].index(d))
    by_module = collections.defaultdict(dict)
    for r in results:
        by_module[r.op][r.dtype] = r
    native = sum(1 for r in results if _how(r) == "native")
    samples = sum(r.samples for r in results)
    lines = [
        MODULES_START,
        "## Modules (PyTorch's ModuleInfo database)",
        "",
        f"Generated by `python -m torch_jax.report coverage` ({meta['date']}, torch {meta['torch']}, "
        f"jax {meta['jax']}, {meta.get('mode', 'strict')} mode). Every ModuleInfo of "
        "`torch.testing._internal.common_modules.module_db`, in float32 and float64, in train and eval mode where "
        'they differ, is built on the CPU and moved with `.to("jax")`; each sample\'s forward outputs, the '
        "gradients of its inputs and parameters, its buffers after the step and (eval mode) its forward under "
        "`no_grad` must match the CPU's (`src/torch_jax/report/_modules.py`, `tests/test_modules.py`).",
        "",
        f"**{native} of {len(results)} (ModuleInfo, dtype, mode) cases ({samples} samples) match the CPU with no "
        "op through the CPU fallback.**",
        "",
        "Comparison: the tolerances of PyTorch's own module tests (rtol = atol = 1e-5 in float32, as "
        "`TestModule.test_cpu_gpu_parity` compares CUDA with the CPU; `torch.testing`'s defaults in float64); a "
        "float32 result outside them passes only if it is at least as close to the float64 result as the CPU's.",
        "",
    ]
    lines += [f"- {why}" for why in _modules.RANDOMNESS.values()]
    lines += [
        f"- `{name}` {_dtype_name(d)}: rtol {rtol:g}, atol {atol:g} (reason in `_modules.MODULE_TOLERANCE`)"
        for (name, d), (rtol, atol) in _modules.MODULE_TOLERANCE.items()
    ]
    lines += [
        "- Beyond the database, `nn.MultiheadAttention`, `nn.TransformerEncoderLayer` and `nn.TransformerEncoder` get "
        "samples that take their inference fast paths in eval mode under `no_grad` (which none of the database's "
        "does).",
        "",
    ]
    lines += _status_table(
        "ModuleInfo", {name: {d: MARKS[_how(r)] for d, r in row.items()} for name, row in by_module.items()}, dtypes
    )
    failing = [r for r in results if r.status == "fail"]
    lines += ["", "Failing cases: " + ("none." if not failing else "")]
    for r in failing:
        msg = r.message.splitlines()[0].replace("|", "\\|")[:200] if r.message else ""
        lines.append(f"- {r.op} {r.dtype}: {msg}")
    return lines + [MODULES_END]


def replace_modules_section(markdown_text: str, section: list[str]) -> str:
    """``markdown_text`` with its module section replaced by ``section`` (appended if it has none)."""
    block = "\n".join(section)
    if MODULES_START in markdown_text and MODULES_END in markdown_text:
        head, rest = markdown_text.split(MODULES_START, 1)
        return head + block + rest.split(MODULES_END, 1)[1]
    return markdown_text.rstrip("\n") + "\n\n" + block + "\n"


def _matrix(results, dtypes):
    """One row per OpInfo, one column per dtype: how each pair ran."""
    by_op = collections.defaultdict(dict)
    for r in results:
        by_op[r.op][r.dtype] = MARKS[_how(r)]
    lines = [
        "",
        "## Every OpInfo, per dtype",
        "",
        "`ok`: matches the CPU with no CPU fallback; `fb`: matches with some op through the CPU fallback; "
        "`FAIL`: does not match; `excl`: excluded (reason below); blank: the CPU does not support the dtype.",
        "",
    ]
    return lines + _status_table("OpInfo", by_op, dtypes)


def _status_table(what: str, rows: dict, columns) -> list[str]:
    """A markdown table: one row per name, one column per dtype, each cell its mark."""
    lines = [f"| {what} | " + " | ".join(columns) + " |", "| --- |" + " --- |" * len(columns)]
    lines += [f"| {name} | " + " | ".join(row.get(c, "") for c in columns) + " |" for name, row in rows.items()]
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_jax.report coverage")
    parser.add_argument("--dtypes", default=",".join(str(d).replace("torch.", "") for d in _sweep.DTYPES))
    parser.add_argument("--ops", default=None, help="comma-separated OpInfo names (default: all)")
    parser.add_argument("--max-samples", type=int, default=None, help="samples per (OpInfo, dtype) (default: all)")
    parser.add_argument("--no-grads", action="store_true")
    parser.add_argument("--no-variants", action="store_true")
    parser.add_argument("--out", default="docs", help="folder for COVERAGE.md and coverage.json")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (default: 1)")
    parser.add_argument("--quiet", action="store_true", help="write the files, print nothing")
    parser.add_argument(
        "--journal", default=None, help="record each result in JOURNAL.<pid> as it is made; skip pairs already recorded"
    )
    parser.add_argument(
        "--claims", default=None, help="(for --jobs workers) a folder in which each OpInfo is claimed by one worker"
    )
    parser.add_argument(
        "--modules",
        default=None,
        help="comma-separated ModuleInfo names, or 'all' (default: all, none when --ops narrows the OpInfos)",
    )
    parser.add_argument(
        "--modules-only",
        action="store_true",
        help="run only the ModuleInfo sweep and rewrite the module section of an existing COVERAGE.md",
    )
    args = parser.parse_args(argv)
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    names = set(args.ops.split(",")) if args.ops else None
    module_names = args.modules or ("none" if args.ops and not args.modules_only else "all")
    modules = None
    if module_names != "none":
        wanted = None if module_names == "all" else set(module_names.split(","))
        modules = run_modules(wanted, progress=not args.quiet)
    meta = _meta(args)
    if args.modules_only:
        return _write_modules(args.out, modules or [], meta, args.quiet)
    if args.jobs > 1:
        results = run_parallel(
            args.jobs, dtypes, names, args.max_samples, not args.no_grads, not args.no_variants, args.journal
        )
    else:
        results = run(
            dtypes,
            names,
            args.max_samples,
            not args.no_grads,
            not args.no_variants,
            not args.quiet,
            args.journal,
            args.claims,
        )
    summary = summarize(results, dtypes)
    os.makedirs(args.out, exist_ok=True)
    md = markdown(summary, results, meta)
    if modules is not None:
        md = replace_modules_section(md, modules_markdown(modules, meta))
    sparse = None if names else _sparse.run(max_samples=args.max_samples, progress=not args.quiet)  # report/_sparse.py
    if sparse is not None:
        md = md.rstrip("\n") + "\n\n" + "\n".join(_sparse.markdown(sparse)) + "\n"
    with open(os.path.join(args.out, "COVERAGE.md"), "w") as f:
        f.write(md)
    data = {"meta": meta, "summary": summary, "results": [r.__dict__ for r in results]}
    if modules is not None:
        data["modules"] = [r.__dict__ for r in modules]
    if sparse is not None:
        data["sparse"] = [r.__dict__ for r in sparse]
    with open(os.path.join(args.out, "coverage.json"), "w") as f:
        json.dump(data, f, indent=1)
    if not args.quiet:
        print(md)
    return 0


def _meta(args) -> dict:
    import jax

    from torch_jax._config import config

    return {
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "jax": jax.__version__,
        "python": platform.python_version(),
        "mode": config.mode,
        "dtypes": args.dtypes.split(","),
        "settings": f"max samples {args.max_samples or 'all'}, gradients {'off' if args.no_grads else 'on'}, "
        f"variants {'off' if args.no_variants else 'on'}" + (f", ops {args.ops}" if args.ops else ""),
    }


def _write_modules(out: str, modules, meta, quiet: bool) -> int:
    """``--modules-only``: the module section of ``out``/COVERAGE.md and the ``modules`` list
    of coverage.json, rewritten in place (the OpInfo results stay as they were)."""
    section = modules_markdown(modules, meta)
    md_path, json_path = os.path.join(out, "COVERAGE.md"), os.path.join(out, "coverage.json")
    os.makedirs(out, exist_ok=True)
    text = open(md_path).read() if os.path.exists(md_path) else "# Operator coverage\n"
    with open(md_path, "w") as f:
        f.write(replace_modules_section(text, section))
    data = json.load(open(json_path)) if os.path.exists(json_path) else {}
    data["modules"] = [r.__dict__ for r in modules]
    data["modules_meta"] = meta
    with open(json_path, "w") as f:
        json.dump(data, f, indent=1)
    if not quiet:
        print("\n".join(section))
    return 0
