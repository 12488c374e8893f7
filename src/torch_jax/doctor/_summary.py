"""The terminal summary of a doctor record (record.schema.json): what ``torch-jax doctor``
prints at the end of a run and ``torch-jax evidence show`` prints for a stored one."""

from __future__ import annotations

import math
import shlex


def summary(record: dict) -> str:
    """The record in a few lines: target, environment, one table row per run, the errors,
    the criteria, the verdict and the scan's findings."""
    lines = [f"{_target_line(record)}    id {record['id']}  ({record['created']})", env_line(record["environment"]), ""]
    reference = reference_median(record)
    rows = []
    for run in record["runs"]:
        median = median_s(run)
        rows.append(
            [
                run["mode"],
                run["device"],
                run["status"],
                fmt_seconds(median),
                fmt_ratio(median, reference) if run["mode"] != "reference" else "",
                fmt_float(loss_rel(run)),
                str(run["fallbacks"]) if run["mode"] != "reference" else "",
                _compilations_cell(run),
                fmt_bytes(run["peak_memory"]["host_rss_bytes"]),
                fmt_bytes(run["peak_memory"]["device_bytes"]),
            ]
        )
    headers = [
        "mode",
        "device",
        "status",
        "step",
        "vs ref",
        "loss rel",
        "fallbacks",
        "compiles",
        "host peak",
        "dev peak",
    ]
    lines += table(headers, rows)

    errors = [run for run in record["runs"] if run["error"]]
    if errors:
        lines += ["", "errors:"]
        for run in errors:
            error = run["error"]
            lines.append(f"  {run['mode']}: {error['type']}: {_first_line(error['message'])}")
            lines.append(f"      at {error['where']}")
    if record["criteria"]:
        lines += ["", "criteria:"]
        lines += table(
            ["", "criterion", "mode", "value", "bound"],
            [
                ["PASS" if c["passed"] else "FAIL", c["text"], c["mode"], fmt_float(c["value"]), _bound(c)]
                for c in record["criteria"]
            ],
            indent="  ",
        )
    lines += ["", f"verdict: {record['verdict'].upper()}    {_scan_line(record['scan'])}"]
    if record.get("notes"):
        lines += ["", "notes:"]
        lines += [f"  {note['created']}  {note['text']}" for note in record["notes"]]
    return "\n".join(lines)


def env_line(env: dict) -> str:
    devices = ", ".join(sorted(set(env["jax_devices"]))) or "none"
    cuda = f"  cuda {env['cuda']}" if env.get("cuda") else ""
    return (
        f"torch {env['torch']}  jax {env['jax']}  torch_jax {env['torch_jax']}  "
        f"backend {env['jax_backend']} ({devices}){cuda}  Python {env['python']}  {env['machine']}"
    )


def command_line(record: dict) -> str:
    return shlex.join(record["command"])


def table(headers: list[str], rows: list[list[str]], indent: str = "") -> list[str]:
    """Left-aligned columns, two spaces apart."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]
    return [
        (indent + "  ".join(str(cell).ljust(w) for cell, w in zip(row, widths))).rstrip() for row in [headers, *rows]
    ]


def median_s(run: dict) -> float | None:
    return run["step_time"]["median_s"] if run["step_time"] else None


def reference_median(record: dict) -> float | None:
    return next((median_s(run) for run in record["runs"] if run["mode"] == "reference"), None)


def loss_rel(run: dict) -> float | None:
    """The largest relative error of the run's losses against the reference's (None when no
    loss was compared)."""
    values = [c["max_rel"] for c in run["comparison"] if c["kind"] == "loss" and c["max_rel"] is not None]
    return max(values) if values else None


def fmt_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


def fmt_ratio(value: float | None, reference: float | None) -> str:
    if value is None or not reference:
        return "-"
    return f"{value / reference:.2f}x"


def fmt_float(x: float | None) -> str:
    if x is None:
        return "-"
    if x == 0 or math.isinf(x) or math.isnan(x):
        return str(x)
    return f"{x:.3g}" if 1e-3 <= abs(x) < 1e4 else f"{x:.2e}"


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _target_line(record: dict) -> str:
    target = record["target"]
    args = f" -- {shlex.join(target['args'])}" if target["args"] else ""
    return f"{target['spec']}{args} ({target['kind']})"


def _compilations_cell(run: dict) -> str:
    c = run["compilations"]
    if run["mode"] == "reference" and not c["count"]:
        return ""
    return f"{c['count']} ({c['recompiles']} re)" if c["recompiles"] else str(c["count"])


def _scan_line(scan: list[dict]) -> str:
    if not scan:
        return "scan: no CUDA assumptions found"
    kinds = sorted({f["kind"] for f in scan})
    return f"scan: {len(scan)} CUDA assumption{'s' * (len(scan) != 1)} ({', '.join(kinds)})"


def _first_line(text: str) -> str:
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first if len(first) <= 200 else first[:197] + "..."


def _bound(c) -> str:
    """What the value was held to: ``<= 0.015 (1.5x 0.010)`` for a relative criterion."""
    bound = f"{c['op']} {fmt_float(c['threshold'])}"
    if c["relative"] and c.get("reference") is not None:
        bound += f" ({fmt_float(c['threshold'] / c['reference'])}x {fmt_float(c['reference'])})"
    return bound
