"""``torch-jax doctor TARGET [-- ARGS]``: run a workload on the reference device and on
``jax`` in each mode, compare, and keep the record.

NOTE [Doctor runs]: each run is its own process (doctor/_child.py, run by its path),
so a crash, a hang (``--timeout``) or an exhausted memory in one mode still leaves a
record of the others and says what happened to it. The reference run starts torch
without the ``jax`` device (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``), so a script that takes
its device from ``torch.accelerator`` gets the CPU (or CUDA); the jax runs set
``TORCH_JAX_MODE`` and ``TORCH_JAX_CENSUS=1`` (the op census costs a Python call per op,
in every jax mode alike). ``{device}`` in the script's arguments becomes each run's device.
What a run reports about the script is described in NOTE [What the doctor sees of a
script] (doctor/_child).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import secrets
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

from torch_jax.doctor import _criteria

SCHEMA = "torch_jax.doctor/1"
MODES = ("strict", "fused", "compiled")
PROGRESS_EVERY_S = 15.0  # a progress line this often while a run goes on
_CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_child.py")


def environment() -> dict:
    import jax
    import torch

    import torch_jax

    try:
        import jaxlib

        jaxlib_version = jaxlib.__version__
    except ImportError:  # (newer jax ships jaxlib inside)
        jaxlib_version = jax.__version__
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "jax": jax.__version__,
        "jaxlib": jaxlib_version,
        "torch_jax": torch_jax.__version__,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "jax_backend": jax.default_backend(),
        "jax_devices": [d.device_kind for d in jax.devices()],
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
    }


def _reference_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _child_env(mode: str) -> dict:
    env = dict(os.environ)
    if mode == "reference":
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    else:
        env["TORCH_JAX_MODE"] = "fused" if mode == "fused" else "strict"
        env["TORCH_JAX_CENSUS"] = "1"
    env.setdefault("TORCH_JAX_FALLBACK", "warn")
    return env


def _stats_of_times(times, warmup: int):
    timed = times[warmup:] if len(times) > warmup else []
    if not timed:
        return None
    q = statistics.quantiles(timed, n=4) if len(timed) >= 2 else [timed[0]] * 3
    return {
        "median_s": statistics.median(timed),
        "min_s": min(timed),
        "max_s": max(timed),
        "iqr_s": q[2] - q[0],
        "n": len(timed),
    }


def _ops(stats) -> list:
    rows = []
    for key, count in (stats or {}).get("op_census", {}).items():
        placement, op = key.split(" ", 1)
        rows.append({"op": op, "placement": placement, "count": count})
    return sorted(rows, key=lambda r: (-r["count"], r["op"]))


def _compilations(stats) -> dict:
    stats = stats or {}
    count = stats.get("compiles", 0) + stats.get("graphs_compiled", 0) + stats.get("compiled_graph_compiles", 0)
    reasons = dict(stats.get("compiled_graph_reasons", {}))
    for name, n in (stats.get("shape_churn") or {}).items():
        reasons[f"new shapes: {name}"] = n
    return {"count": count, "recompiles": stats.get("recompiles", 0), "reasons": reasons}


def run_one(mode, device, target, kind, args, steps, warmup, timeout, progress) -> tuple[dict, dict]:
    """One run in its own process: (its row of the record, its tensors)."""
    import torch

    argv = [a.replace("{device}", device) for a in args]
    with tempfile.TemporaryDirectory(prefix="torch_jax_doctor_") as out:
        # (the child by its path: importing the torch_jax package would register the device
        # in the reference run)
        cmd = [sys.executable, _CHILD, "--mode", mode, "--device", device, "--out", out]
        cmd += ["--kind", kind, "--steps", str(steps), target, "--", *argv]
        start = time.perf_counter()
        progress(f"{mode} on {device}: running")
        status, output, returncode = "ok", "", None
        with open(os.path.join(out, "output"), "w+", errors="replace") as log:
            proc = subprocess.Popen(cmd, env=_child_env(mode), stdout=log, stderr=subprocess.STDOUT, text=True)
            told = start
            while True:
                try:
                    returncode = proc.wait(timeout=1.0)
                    break
                except subprocess.TimeoutExpired:
                    pass
                now = time.perf_counter()
                if now - start > timeout:
                    proc.kill()
                    proc.wait()
                    status = "timeout"
                    break
                if now - told >= PROGRESS_EVERY_S:
                    told = now
                    progress(f"{mode} on {device}: {now - start:.0f} s, {_steps_so_far(out)} steps")
            log.seek(0)
            output = log.read()
        wall = time.perf_counter() - start
        result = {}
        if os.path.exists(os.path.join(out, "result.json")):
            with open(os.path.join(out, "result.json")) as f:
                result = json.load(f)
        tensors = {}
        if os.path.exists(os.path.join(out, "tensors.pt")):
            tensors = torch.load(os.path.join(out, "tensors.pt"))
    error = result.get("error")
    if status == "timeout":
        error = {"type": "Timeout", "message": f"the run took more than {timeout:g} s", "where": "?", "traceback": ""}
    elif not result:
        status = "failed"
        tail = output.strip().splitlines()[-1:] or ["no output"]
        error = {
            "type": "ProcessDied",
            "message": f"the run's process ended with status {returncode} before reporting: {tail[0]}",
            "where": "?",
            "traceback": output[-20000:],
        }
    elif error is not None:
        status = "failed"
    stats = result.get("stats")
    row = {
        "mode": mode,
        "device": device,
        "status": status,
        "returncode": returncode,
        "error": error,
        "wall_s": wall,
        "steps": result.get("steps", 0),
        "step_time": _stats_of_times(result.get("step_times", []), warmup),
        "peak_memory": {
            "host_rss_bytes": result.get("host_rss_bytes", 0),
            "device_bytes": result.get("device_bytes"),
        },
        "ops": _ops(stats),
        "fallbacks": (stats or {}).get("fallbacks", 0),
        "compilations": _compilations(stats),
        "losses": result.get("losses", []),
        "comparison": [],
        "stdout_tail": output[-4000:],
    }
    progress(f"{mode} on {device}: {status} in {wall:.1f} s, {row['steps']} steps")
    return row, tensors


def _steps_so_far(out: str) -> str:
    try:
        with open(os.path.join(out, "progress")) as f:
            return f.read().strip() or "0"
    except OSError:
        return "0"


def compare(tensors: dict, reference: dict) -> list:
    """Max abs and rel error of each tensor the reference has: rel is max|x - ref| / max|ref|."""
    import torch

    rows = []
    for name, ref in reference.items():
        kind = name.split(":", 1)[0] if ":" in name else name
        got = tensors.get(name)
        scale = float(ref.double().abs().max()) if ref.numel() else 0.0
        row = {"name": name, "kind": kind, "shape": list(ref.shape), "scale": scale}
        row.update(max_abs=None, max_rel=None, ok=False)
        if got is not None and got.shape == ref.shape:
            diff = (got.double() - ref.double()).abs()
            if kind == "loss":  # per step: relative to that step's loss
                rel = diff / ref.double().abs().clamp_min(torch.finfo(torch.float64).tiny)
            else:
                rel = diff / max(scale, torch.finfo(torch.float64).tiny)
            finite = bool(torch.isfinite(got.double()).all() == torch.isfinite(ref.double()).all())
            diff, rel = diff.nan_to_num(nan=float("inf")), rel.nan_to_num(nan=float("inf"))
            row.update(
                max_abs=float(diff.max()) if diff.numel() else 0.0,
                max_rel=float(rel.max()) if rel.numel() else 0.0,
                ok=finite,
            )
        rows.append(row)
    return rows


def scan_and_diff(target: str, kind: str, base: str):
    """The scan of the target's sources and, in a git repository, its diff against ``base``."""
    from torch_jax.doctor import _scan

    path = _target_path(target, kind)
    if path is None:
        return [], None
    findings = [f.as_dict() for f in _scan.scan(path)]
    return findings, git_diff(os.path.dirname(path), base)


def _target_path(target: str, kind: str):
    if kind == "script":
        return os.path.abspath(target)
    import importlib.util

    try:
        spec = importlib.util.find_spec(target.partition(":")[0])
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None and spec.origin not in (None, "built-in") else None


def git_diff(directory: str, base: str):
    def git(*args):
        return subprocess.run(["git", "-C", directory, *args], capture_output=True, text=True, timeout=60)

    try:
        top = git("rev-parse", "--show-toplevel")
    except (OSError, subprocess.TimeoutExpired):
        return None
    if top.returncode != 0:
        return None
    repo = top.stdout.strip()
    commit = git("rev-parse", "HEAD").stdout.strip()
    names = git("diff", "--name-only", base).stdout.split()
    text = git("diff", base).stdout
    if len(text) > 200_000:
        text = text[:200_000] + "\n[... diff cut at 200000 characters]\n"
    return {"repo": repo, "base": base, "commit": commit, "files": names, "text": text}


def run(
    target: str,
    args=(),
    *,
    modes=MODES,
    accept=(),
    steps: int = 10,
    warmup: int = 2,
    timeout: float = 600.0,
    base: str = "HEAD",
    command=None,
    progress=None,
) -> dict:
    """Run ``target`` both ways and return its record (the schema in record.schema.json)."""
    criteria = _criteria.parse(accept)  # (a typo fails before anything runs)
    progress = progress or (lambda message: None)
    kind = "script" if target.endswith(".py") or os.path.isfile(target) else "entry"
    if kind == "entry" and ":" not in target:
        raise ValueError(f"doctor target {target!r}: expected a script path or module:function")
    created = datetime.datetime.now(datetime.timezone.utc)
    name = os.path.splitext(os.path.basename(target.partition(":")[0] if kind == "entry" else target))[0]
    record_id = (
        f"{created:%Y%m%d-%H%M%S}-{''.join(c if c.isalnum() else '_' for c in name)[:40]}-{secrets.token_hex(3)}"
    )
    reference_device = _reference_device()
    runs, tensors = [], []
    plan = [("reference", reference_device)] + [(m, "jax") for m in modes]
    for mode, device in plan:
        row, t = run_one(mode, device, target, kind, list(args), steps, warmup, timeout, progress)
        runs.append(row)
        tensors.append(t)
    if runs[0]["status"] == "ok":
        for row, t in zip(runs[1:], tensors[1:]):
            if row["status"] == "ok":
                row["comparison"] = compare(t, tensors[0])
    rows, verdict = _criteria.check(criteria, runs)
    findings, diff = scan_and_diff(target, kind, base)
    return {
        "schema": SCHEMA,
        "id": record_id,
        "created": created.isoformat(timespec="seconds"),
        "target": {
            "kind": kind,
            "spec": target,
            "path": _target_path(target, kind),
            "args": list(args),
            "cwd": os.getcwd(),
        },
        "command": list(command)
        if command is not None
        else _command(target, args, modes, accept, steps, warmup, timeout, base),
        "config": {
            "reference": reference_device,
            "modes": list(modes),
            "steps": steps if kind == "entry" else None,
            "warmup": warmup,
            "accept": [c.text for c in criteria],
            "timeout_s": timeout,
            "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("TORCH_JAX_")},
        },
        "environment": environment(),
        "runs": runs,
        "criteria": rows,
        "verdict": verdict,
        "scan": findings,
        "diff": diff,
    }


def _command(target, args, modes, accept, steps, warmup, timeout, base) -> list:
    cmd = ["torch-jax", "doctor", target, "--modes", ",".join(modes), "--steps", str(steps), "--warmup", str(warmup)]
    cmd += ["--timeout", f"{timeout:g}", "--base", base]
    for a in accept:
        cmd += ["--accept", a]
    return cmd + (["--", *args] if args else [])


def shell(command) -> str:
    return shlex.join(command)
