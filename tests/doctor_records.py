"""Sample records of ``torch-jax doctor`` (src/torch_jax/doctor/record.schema.json) for the
tests of the evidence store and the reports: a training script run on the CPU and on jax in
each mode, and one whose compiled run failed."""

from __future__ import annotations

import copy
import json
import pathlib

SCHEMA_PATH = pathlib.Path(__file__).parent.parent / "src" / "torch_jax" / "doctor" / "record.schema.json"

# (op, placement on jax in eager modes, calls per run); the compiled run sees the same ops as
# "compiled" except the fallback, which Dynamo leaves outside the graph
_OPS = [
    ("aten::addmm", "lowered", 120),
    ("aten::gelu", "lowered", 40),
    ("aten::_log_softmax", "lowered", 20),
    ("aten::nll_loss_forward", "decomposed", 20),
    ("aten::_foreach_add_", "kernel", 20),
    ("aten::_embedding_bag", "cpu_fallback", 20),
]

_DIFF_TEXT = """\
diff --git a/train_tiny.py b/train_tiny.py
--- a/train_tiny.py
+++ b/train_tiny.py
@@ -10,7 +10,7 @@ def main():
-    model = Tiny().cuda()
+    model = Tiny().to(device)
     torch.backends.cudnn.benchmark = True
"""


def schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text())


def _stats(median: float) -> dict:
    return {"median_s": median, "min_s": median * 0.9, "max_s": median * 1.4, "iqr_s": median * 0.1, "n": 15}


def _comparisons(scale: float) -> list[dict]:
    """What a jax run's tensors differ from the reference's by; ``scale`` sets the errors."""
    rows = [
        ("loss", "loss", [], 2e-7, 1e-7),
        ("grad:fc1.weight", "grad", [64, 32], 3e-6, 4e-5),
        ("grad:fc2.weight", "grad", [10, 64], 1e-6, 2e-6),
        ("param:fc1.weight", "param", [64, 32], 5e-8, 1e-6),
        ("output", "output", [8, 10], 4e-7, 0.0),
    ]
    return [
        {
            "name": name,
            "kind": kind,
            "shape": shape,
            "scale": a / r if r else 1.0,
            "max_abs": a * scale,
            "max_rel": r * scale,
            "ok": True,
        }
        for name, kind, shape, a, r in rows
    ]


def _run(mode: str, median: float | None, scale: float = 1.0) -> dict:
    reference = mode == "reference"
    if reference:
        ops = []
    elif mode == "compiled":
        ops = [{"op": op, "placement": p if p == "cpu_fallback" else "compiled", "count": n} for op, p, n in _OPS]
    else:
        ops = [{"op": op, "placement": p, "count": n} for op, p, n in _OPS]
    fallbacks = sum(o["count"] for o in ops if o["placement"] == "cpu_fallback")
    compiled = {"reference": 0, "strict": 14, "fused": 6, "compiled": 3}[mode]
    return {
        "mode": mode,
        "device": "cpu" if reference else "jax",
        "status": "ok",
        "returncode": 0,
        "error": None,
        "wall_s": 4.2 if reference else 9.5,
        "steps": 20,
        "step_time": None if median is None else _stats(median),
        "peak_memory": {"host_rss_bytes": 900_000_000, "device_bytes": None if reference else 120_000_000},
        "ops": ops,
        "fallbacks": fallbacks,
        "compilations": {
            "count": compiled,
            "recompiles": 1 if mode == "compiled" else 0,
            "reasons": {"new input shape (batch 8 -> 5)": 1} if mode == "compiled" else {},
        },
        # each mode's losses a little off the reference's, as float rounding makes them
        "losses": [2.30 - 0.05 * i + scale * (0.0 if reference else 1e-3) * i for i in range(20)],
        "comparison": [] if reference else _comparisons(scale),
        "stdout_tail": f"step 19 loss 1.35 ({mode})\n",
    }


def _criteria(runs: list[dict]) -> list[dict]:
    reference = runs[0]["step_time"]["median_s"]
    out = []
    for run in runs[1:]:
        mode = run["mode"]
        loss_rel = max(c["max_rel"] for c in run["comparison"] if c["kind"] == "loss")
        out.append(_criterion("loss_rel<=1e-3", "loss_rel", "<=", 1e-3, False, mode, loss_rel))
        median = run["step_time"]["median_s"]
        out.append(_criterion("step_time<=1.5x", "step_time", "<=", 1.5 * reference, True, mode, median, reference))
    return out


def _criterion(text, metric, op, threshold, relative, mode, value, reference=None) -> dict:
    passed = value is not None and {"<=": value <= threshold, "<": value < threshold}[op]
    return {
        "text": text,
        "metric": metric,
        "op": op,
        "threshold": threshold,
        "relative": relative,
        "reference": reference,
        "mode": mode,
        "value": value,
        "passed": passed,
    }


def sample_record(**overrides) -> dict:
    """A valid record: the reference, strict, fused and compiled runs of a small training
    script, with one op on the CPU fallback, two criteria per mode (strict too slow, so the
    verdict is "fail"), two scan findings and the git diff. ``overrides`` replace top-level keys."""
    runs = [
        _run("reference", 0.010),
        _run("strict", 0.018, scale=1.0),
        _run("fused", 0.012, scale=0.5),
        _run("compiled", 0.007, scale=2.0),
    ]
    criteria = _criteria(runs)
    record = {
        "schema": "torch_jax.doctor/1",
        "id": "20250301T101500Z-train_tiny-a1b2c3",
        "created": "2025-03-01T10:15:00+00:00",
        "target": {
            "kind": "script",
            "spec": "examples/train_tiny.py",
            "path": "/home/user/proj/examples/train_tiny.py",
            "args": ["--device", "{device}", "--steps", "20"],
            "cwd": "/home/user/proj",
        },
        "command": [
            "torch-jax",
            "doctor",
            "examples/train_tiny.py",
            "--accept",
            "loss_rel<=1e-3",
            "--accept",
            "step_time<=1.5x",
            "--",
            "--device",
            "{device}",
            "--steps",
            "20",
        ],
        "config": {
            "reference": "cpu",
            "modes": ["strict", "fused", "compiled"],
            "steps": None,
            "warmup": 5,
            "accept": ["loss_rel<=1e-3", "step_time<=1.5x"],
            "timeout_s": 600.0,
            "env": {"TORCH_JAX_FALLBACK": "warn"},
        },
        "environment": {
            "python": "3.12.3",
            "torch": "2.11.0",
            "jax": "0.10.1",
            "jaxlib": "0.10.1",
            "torch_jax": "0.1.0",
            "platform": "Linux-6.8.0-x86_64-with-glibc2.39",
            "machine": "x86_64",
            "cpu_count": 16,
            "jax_backend": "cpu",
            "jax_devices": ["cpu"],
            "cuda": None,
        },
        "runs": runs,
        "criteria": criteria,
        "verdict": "pass" if all(c["passed"] for c in criteria) else "fail",
        "scan": [
            {
                "path": "examples/train_tiny.py",
                "line": 11,
                "col": 18,
                "kind": "cuda-call",
                "code": "    model = Tiny().cuda()",
                "message": "moves the model to CUDA",
                "rewrite": "model = Tiny().to(device)",
            },
            {
                "path": "examples/train_tiny.py",
                "line": 12,
                "col": 4,
                "kind": "cudnn-flag",
                "code": "    torch.backends.cudnn.benchmark = True",
                "message": "a cuDNN setting; no effect on jax",
                "rewrite": "(remove, or keep behind a device check)",
            },
        ],
        "diff": {
            "repo": "/home/user/proj",
            "base": "HEAD",
            "commit": "0123456789abcdef0123456789abcdef01234567",
            "files": ["examples/train_tiny.py"],
            "text": _DIFF_TEXT,
        },
    }
    record.update(copy.deepcopy(overrides))
    return record


def failed_record(**overrides) -> dict:
    """A valid record whose compiled run failed (no step times, no comparisons); no criteria
    were given, so the verdict is "error"."""
    record = sample_record(id="20250302T090000Z-train_tiny-d4e5f6", created="2025-03-02T09:00:00+00:00")
    compiled = run_of(record, "compiled")
    compiled.update(
        status="failed",
        returncode=0,
        error={
            "type": "NotImplementedError",
            "message": "aten::_fft_r2c: no JAX lowering and the CPU fallback is off (TORCH_JAX_FALLBACK=error)",
            "where": "examples/train_tiny.py:31 (forward)",
            "traceback": (
                "Traceback (most recent call last):\n"
                '  File "examples/train_tiny.py", line 31, in forward\n'
                "    spectrum = torch.fft.rfft(x)\n"
                "NotImplementedError: aten::_fft_r2c: no JAX lowering\n"
            ),
        },
        steps=2,
        step_time=None,
        losses=[2.30, None],
        comparison=[],
    )
    record.update(criteria=[], verdict="error", scan=[], diff=None)
    record["config"]["accept"] = []
    record.update(copy.deepcopy(overrides))
    return record


def run_of(record: dict, mode: str) -> dict:
    """The record's run in ``mode`` (the dict itself, for tests to change)."""
    return next(run for run in record["runs"] if run["mode"] == mode)
