"""``torch-jax``: the migration evidence tool (also ``python -m torch_jax``).

    torch-jax doctor TARGET [options] [-- ARGS]   run a workload on the reference device and on jax
    torch-jax scan PATH [--json]                  list CUDA assumptions in Python sources
    torch-jax rerun ID                            repeat a record's run on the current software
    torch-jax evidence list|show|search|diff|note the records kept so far

TARGET is a script (``train.py``; ``{device}`` in ARGS becomes each run's device, or the
script asks ``torch.accelerator``) or ``module:function`` returning ``(model, inputs)``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from torch_jax.doctor import _doctor


def _doctor_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="torch-jax doctor",
        description="Run a workload on the reference device and on jax, compare, keep the record.",
    )
    p.add_argument("target", help="a script, or module:function returning (model, inputs)")
    p.add_argument("--modes", default=",".join(_doctor.MODES), help="jax modes to run (default: strict,fused,compiled)")
    p.add_argument(
        "--accept",
        action="append",
        default=[],
        help='acceptance criteria, e.g. "loss_rel<=1e-3,step_time<=1.2x,fallbacks==0", or @FILE; repeatable',
    )
    p.add_argument("--steps", type=int, default=10, help="steps of a module:function target (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the step time (default 2)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds each run may take (default 600)")
    p.add_argument("--base", default="HEAD", help="the git revision the migration's diff is taken against")
    p.add_argument("--out", help="where record.json and report.html go (default: the cache directory)")
    p.add_argument("--db", help="the evidence database (default: $TORCH_JAX_EVIDENCE_DB or the cache directory)")
    p.add_argument("--no-store", action="store_true", help="do not add the record to the database")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def _split(argv):
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def doctor(argv) -> int:
    return _doctor_run(argv)[0]


def _doctor_run(argv):
    """(exit status, the record or None)."""
    own, args = _split(argv)
    a = _doctor_parser().parse_args(own)
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in _doctor.MODES]
    if bad:
        print(f"torch-jax doctor: unknown mode {bad[0]!r} (modes: {', '.join(_doctor.MODES)})", file=sys.stderr)
        return 2, None

    def progress(message):
        if not a.quiet:
            print(f"[doctor] {message}", file=sys.stderr, flush=True)

    try:
        record = _doctor.run(
            a.target,
            args,
            modes=modes,
            accept=a.accept,
            steps=a.steps,
            warmup=a.warmup,
            timeout=a.timeout,
            base=a.base,
            progress=progress,
        )
    except ValueError as e:
        print(f"torch-jax doctor: {e}", file=sys.stderr)
        return 2, None
    return _keep(record, a.out, a.db, a.no_store), record


def _keep(record, out, db, no_store) -> int:
    from torch_jax.doctor import _html, _store, _summary

    if out is None:
        from torch_jax._config import cache_dir

        out = os.path.join(cache_dir(), "evidence", record["id"])
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "record.json"), "w") as f:
        json.dump(record, f, indent=1)
    _html.write(record, os.path.join(out, "report.html"))
    if not no_store:
        with _store.Store(db) as store:
            store.add(record)
    print(_summary.summary(record))
    print(f"record {record['id']}: {os.path.join(out, 'record.json')}, report {os.path.join(out, 'report.html')}")
    return 0 if record["verdict"] in ("pass", "none") else 1


def rerun(argv) -> int:
    p = argparse.ArgumentParser(prog="torch-jax rerun", description="Repeat a record's run on the current software.")
    p.add_argument("id")
    p.add_argument("--db")
    p.add_argument("--out")
    a = p.parse_args(argv)
    from torch_jax.doctor import _store

    with _store.Store(a.db) as store:
        try:
            old = store.get(a.id)
        except KeyError as e:
            print(f"torch-jax rerun: {e.args[0]}", file=sys.stderr)
            return 1
    own, args = _split(list(old["command"][2:]))
    if a.out is not None:
        own += ["--out", a.out]
    if a.db is not None:
        own += ["--db", a.db]
    cwd = os.getcwd()
    os.chdir(old["target"]["cwd"])
    try:
        status, record = _doctor_run(own + ["--", *args])
    finally:
        os.chdir(cwd)
    if record is not None:
        with _store.Store(a.db) as store:
            print(_store.format_diff(store.diff(old["id"], record["id"])))
    return status


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    command, rest = argv[0], argv[1:]
    if command == "doctor":
        return doctor(rest)
    if command == "scan":
        from torch_jax.doctor import _scan

        return _scan.main(rest)
    if command == "rerun":
        return rerun(rest)
    if command == "evidence":
        from torch_jax.doctor import _store

        return _store.main(rest)
    print(f"torch-jax: unknown command {command!r}\n{__doc__}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
