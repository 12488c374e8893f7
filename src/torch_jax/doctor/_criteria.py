"""Acceptance criteria: ``loss_rel<=1e-3,step_time<=1.2x,fallbacks==0``.

Each criterion is ``[mode:]metric op threshold[x]``; a threshold ending in ``x`` is a
multiple of the reference run's value. A criterion without a mode is checked in every
jax mode the record ran (one row each); a run that failed, or has no value for the
metric, fails it.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import re

_OPS = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt, "==": operator.eq}
_PATTERN = re.compile(r"^\s*(?:(\w+):)?\s*([a-z_]+)\s*(<=|>=|==|<|>)\s*([-+0-9.eE]+)\s*(x?)\s*$")


def _comparison(kind: str, field: str):
    """The largest error of the run's tensors of ``kind`` (all when None). A relative error
    of gradients, parameters or outputs is taken against the largest reference magnitude
    among the tensors compared (a tensor that is zero in exact arithmetic, such as the bias
    gradient of a convolution before a batch norm, has no scale of its own); a loss's is
    each step's own."""

    def value(run, reference):
        if kind is None:
            values = [_comparison(k, field)(run, reference) for k in {c["kind"] for c in run["comparison"]}]
            return None if not values or None in values else max(values)
        rows = [c for c in run["comparison"] if c["kind"] == kind]
        if not rows or not all(c["ok"] for c in rows):
            return None
        largest = max(c["max_abs"] for c in rows)
        if field == "max_abs":
            return largest
        if kind == "loss":
            return max(c["max_rel"] for c in rows)
        scale = max(c["scale"] for c in rows)
        return largest / scale if scale > 0 else largest

    return value


def _step_time(run, reference):
    return run["step_time"]["median_s"] if run["step_time"] else None


def _compilations(field):
    return lambda run, reference: run["compilations"][field]


# metric -> (value of a run, given the reference run; what it means)
METRICS = {
    "loss_rel": (_comparison("loss", "max_rel"), "largest relative error of a step's loss"),
    "loss_abs": (_comparison("loss", "max_abs"), "largest absolute error of a step's loss"),
    "grad_rel": (
        _comparison("grad", "max_rel"),
        "largest error of a first-step gradient over the largest reference gradient",
    ),
    "grad_abs": (_comparison("grad", "max_abs"), "largest absolute error of a first-step gradient"),
    "param_rel": (
        _comparison("param", "max_rel"),
        "largest error of a parameter after the run over the largest reference parameter",
    ),
    "output_rel": (_comparison("output", "max_rel"), "largest error of an output over the largest reference output"),
    "output_abs": (_comparison("output", "max_abs"), "largest absolute error of an output"),
    "max_rel": (_comparison(None, "max_rel"), "the largest of the relative errors above"),
    "step_time": (_step_time, "median seconds per step after warm-up"),
    "fallbacks": (lambda run, reference: run["fallbacks"], "ops run through the CPU fallback"),
    "compilations": (_compilations("count"), "XLA computations compiled"),
    "recompiles": (_compilations("recompiles"), "compilations for shapes already seen"),
    "peak_memory": (lambda run, reference: run["peak_memory"]["host_rss_bytes"], "peak resident bytes"),
    "device_memory": (lambda run, reference: run["peak_memory"]["device_bytes"], "peak device bytes"),
}


@dataclasses.dataclass(frozen=True)
class Criterion:
    text: str
    mode: str | None
    metric: str
    op: str
    threshold: float
    relative: bool


def parse(texts) -> list[Criterion]:
    """Criteria from strings (each may hold several, comma- or line-separated), or
    ``@FILE`` for a file of them (``#`` starts a comment)."""
    out = []
    for text in texts:
        if text.startswith("@"):
            with open(text[1:]) as f:
                text = ",".join(line.split("#", 1)[0] for line in f)
        for part in re.split(r"[,\n]", text):
            if not part.strip():
                continue
            m = _PATTERN.match(part)
            if m is None:
                raise ValueError(f"acceptance criterion {part.strip()!r}: expected [mode:]metric<=value[x]")
            mode, metric, op, threshold, x = m.groups()
            if metric not in METRICS:
                raise ValueError(
                    f"acceptance criterion {part.strip()!r}: unknown metric {metric!r}; known: {', '.join(METRICS)}"
                )
            if mode not in (None, "strict", "fused", "compiled"):
                raise ValueError(f"acceptance criterion {part.strip()!r}: unknown mode {mode!r}")
            out.append(Criterion(part.strip(), mode, metric, op, float(threshold), bool(x)))
    return out


def check(criteria, runs) -> tuple[list[dict], str]:
    """Rows for the record's ``criteria`` and its verdict (see the schema)."""
    reference = runs[0]
    rows = []
    for c in criteria:
        for run in runs[1:]:
            if c.mode is not None and run["mode"] != c.mode:
                continue
            value = METRICS[c.metric][0](run, reference) if run["status"] == "ok" else None
            threshold, base = c.threshold, None
            if c.relative:
                base = METRICS[c.metric][0](reference, reference) if reference["status"] == "ok" else None
                threshold = c.threshold * base if base is not None else math.nan
            passed = value is not None and not math.isnan(threshold) and _OPS[c.op](value, threshold)
            rows.append(
                {
                    "text": c.text,
                    "metric": c.metric,
                    "op": c.op,
                    "threshold": threshold if not math.isnan(threshold) else c.threshold,
                    "relative": c.relative,
                    "reference": base,
                    "mode": run["mode"],
                    "value": value,
                    "passed": passed,
                }
            )
    failed_run = any(r["status"] != "ok" for r in runs)
    if rows:
        verdict = "pass" if all(r["passed"] for r in rows) else "fail"
    elif criteria:  # (criteria for modes that did not run)
        verdict = "fail"
    else:
        verdict = "error" if failed_run else "none"
    return rows, verdict
