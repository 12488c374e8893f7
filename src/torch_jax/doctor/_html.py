"""A doctor record (record.schema.json) as one self-contained HTML page: inline CSS and SVG
charts, no script and no external link, so the file reads the same offline, attached to an
issue or opened years later."""

from __future__ import annotations

import html
import math
import os
import shlex

from torch_jax.doctor import _summary

# one colour per run, the same in every chart and in the legend
MODE_COLORS = {"reference": "#6b7280", "strict": "#2563eb", "fused": "#16a34a", "compiled": "#d97706"}
VERDICT_COLORS = {"pass": "#15803d", "fail": "#b91c1c", "error": "#7e22ce", "none": "#6b7280"}
# at most this many tensors in the error chart (the worst ones); a model has hundreds of parameters
MAX_TENSORS = 40

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #111827; margin: 24px auto;
       max-width: 1100px; padding: 0 16px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px; border-bottom: 1px solid #e5e7eb; }
h3 { font-size: 14px; margin: 14px 0 4px; }
.meta { color: #4b5563; }
.badge { display: inline-block; padding: 2px 10px; border-radius: 10px; color: #fff; font-weight: 600;
         font-size: 13px; vertical-align: middle; }
table { border-collapse: collapse; margin: 6px 0; }
th, td { border: 1px solid #e5e7eb; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f3f4f6; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.fallback { background: #fee2e2; color: #991b1b; font-weight: 600; }
td.pass { color: #15803d; font-weight: 600; } td.fail { color: #b91c1c; font-weight: 600; }
tr.failed td { background: #fef2f2; }
pre { background: #f9fafb; border: 1px solid #e5e7eb; padding: 8px; overflow-x: auto; font-size: 12px;
      white-space: pre-wrap; word-break: break-word; }
code { font-size: 12px; }
.add { color: #166534; background: #f0fdf4; } .del { color: #991b1b; background: #fef2f2; } .hunk { color: #1d4ed8; }
.empty { color: #6b7280; font-style: italic; }
svg text { font: 12px system-ui, sans-serif; fill: #111827; }
svg .axis { stroke: #d1d5db; stroke-width: 1; }
"""


def render(record: dict) -> str:
    """The page of ``record`` (with "notes", as ``Store.get`` returns it, if it has them)."""
    sections = [
        _header(record),
        _environment(record),
        _command(record),
        _runs(record),
        _errors(record),
        _step_chart(record),
        _error_chart(record),
        _loss_chart(record),
        _ops(record),
        _compilations(record),
        _criteria(record),
        _scan(record),
        _diff(record),
        _notes(record),
    ]
    title = f"torch-jax doctor: {record['target']['spec']} ({record['verdict']})"
    return (
        "<!DOCTYPE html>\n<html lang='en'>\n<head>\n<meta charset='utf-8'>\n"
        f"<title>{_e(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        + "\n".join(s for s in sections if s)
        + "\n</body>\n</html>\n"
    )


def write(record: dict, path: str | os.PathLike) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(render(record))


def _e(value) -> str:
    return html.escape("" if value is None else str(value))


def _table(headers: list[str], rows: list[list[str]], row_classes: list[str] | None = None) -> str:
    """A table of cells that are already HTML (escape text with ``_e`` or ``_td``)."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = []
    for i, row in enumerate(rows):
        cls = row_classes[i] if row_classes and row_classes[i] else ""
        cells = "".join(cell if cell.startswith("<td") else f"<td>{cell}</td>" for cell in row)
        body.append(f"<tr class='{cls}'>{cells}</tr>" if cls else f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _td(text, cls: str = "") -> str:
    return f"<td class='{cls}'>{_e(text)}</td>" if cls else f"<td>{_e(text)}</td>"


def _section(title: str, body: str, anchor: str) -> str:
    return f"<section id='{anchor}'><h2>{_e(title)}</h2>\n{body}\n</section>"


def _header(record: dict) -> str:
    verdict = record["verdict"]
    target = record["target"]
    return (
        f"<header><h1>{_e(target['spec'])} "
        f"<span class='badge' style='background:{VERDICT_COLORS.get(verdict, '#6b7280')}'>{_e(verdict.upper())}</span>"
        f"</h1><div class='meta'>record <code>{_e(record['id'])}</code> &middot; created {_e(record['created'])}"
        f" &middot; {_e(target['kind'])} &middot; {_e(record['schema'])}</div></header>"
    )


def _environment(record: dict) -> str:
    rows = []
    for key, value in record["environment"].items():
        text = ", ".join(map(str, value)) if isinstance(value, list) else value
        rows.append([_e(key), _e("-" if text is None else text)])
    config = record["config"]
    for key in ("reference", "modes", "steps", "warmup", "timeout_s"):
        value = config.get(key)
        text = ", ".join(value) if isinstance(value, list) else value
        rows.append([_e(f"config {key}"), _e("-" if text is None else text)])
    for key, value in (config.get("env") or {}).items():
        rows.append([_e(key), _e(value)])
    return _section("Environment", _table(["", "value"], rows), "environment")


def _command(record: dict) -> str:
    target = record["target"]
    text = f"cd {shlex.quote(target['cwd'])}\n{_summary.command_line(record)}"
    return _section("Reproduce", f"<pre>{_e(text)}</pre>", "command")


def _runs(record: dict) -> str:
    reference = _summary.reference_median(record)
    rows, classes = [], []
    for run in record["runs"]:
        median = _summary.median_s(run)
        stats = run["step_time"]
        memory = run["peak_memory"]
        rows.append(
            [
                _td(run["mode"]),
                _td(run["device"]),
                _td(run["status"], "pass" if run["status"] == "ok" else "fail"),
                _td(run["steps"], "num"),
                _td(_summary.fmt_seconds(run["wall_s"]), "num"),
                _td(_summary.fmt_seconds(median), "num"),
                _td(_summary.fmt_seconds(stats["iqr_s"]) if stats else "-", "num"),
                _td(_summary.fmt_ratio(median, reference) if run["mode"] != "reference" else "", "num"),
                _td(_summary.fmt_float(_summary.loss_rel(run)), "num"),
                _td(run["fallbacks"], "num fallback" if run["fallbacks"] else "num"),
                _td(run["compilations"]["count"], "num"),
                _td(_summary.fmt_bytes(memory["host_rss_bytes"]), "num"),
                _td(_summary.fmt_bytes(memory["device_bytes"]), "num"),
            ]
        )
        classes.append("" if run["status"] == "ok" else "failed")
    headers = ["mode", "device", "status", "steps", "wall", "step median", "step IQR", "vs reference"]
    headers += ["loss max rel", "fallbacks", "compilations", "host peak", "device peak"]
    return _section("Runs", _table(headers, rows, classes), "runs")


def _legend(modes: list[str], x: int, y: int) -> str:
    parts = []
    for i, mode in enumerate(modes):
        parts.append(
            f"<rect x='{x + i * 110}' y='{y - 10}' width='12' height='12' fill='{MODE_COLORS.get(mode, '#9ca3af')}'/>"
            f"<text x='{x + i * 110 + 17}' y='{y}'>{_e(mode)}</text>"
        )
    return "".join(parts)


def _svg(width: int, height: int, body: str, label: str) -> str:
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
        f"viewBox='0 0 {width} {height}' role='img' aria-label='{_e(label)}'>{body}</svg>"
    )


def _step_chart(record: dict) -> str:
    """Horizontal bars: each run's median step time, labelled with its ratio to the reference."""
    runs = record["runs"]
    medians = [_summary.median_s(run) for run in runs]
    known = [m for m in medians if m is not None]
    if not known:
        return _section("Step time", "<p class='empty'>No run has step times.</p>", "step-time")
    reference = _summary.reference_median(record)
    left, bar_width, row = 110, 560, 30
    scale = bar_width / max(known)
    body = [f"<line class='axis' x1='{left}' y1='4' x2='{left}' y2='{row * len(runs) + 4}'/>"]
    for i, (run, median) in enumerate(zip(runs, medians)):
        y = 8 + i * row
        body.append(f"<text x='{left - 8}' y='{y + 15}' text-anchor='end'>{_e(run['mode'])}</text>")
        if median is None:
            body.append(f"<text x='{left + 6}' y='{y + 15}' fill='#b91c1c'>{_e(run['status'])}: no step time</text>")
            continue
        width = max(2.0, median * scale)
        color = MODE_COLORS.get(run["mode"], "#9ca3af")
        body.append(f"<rect x='{left}' y='{y}' width='{width:.1f}' height='20' fill='{color}'/>")
        label = _summary.fmt_seconds(median)
        if run["mode"] != "reference" and reference:
            label += f"  ({_summary.fmt_ratio(median, reference)} reference)"
        body.append(f"<text x='{left + width + 6:.1f}' y='{y + 15}'>{_e(label)}</text>")
    svg = _svg(left + bar_width + 200, row * len(runs) + 12, "".join(body), "median step time per run")
    return _section("Step time (median)", svg, "step-time")


def _error_chart(record: dict) -> str:
    """For each compared tensor, one bar per jax mode: its largest relative error against the
    reference, on a log scale (errors span many decades)."""
    runs = [run for run in record["runs"] if run["comparison"]]
    if not runs:
        return _section("Error against the reference", "<p class='empty'>No tensors were compared.</p>", "errors-chart")
    values: dict[str, dict[str, float | None]] = {}
    for run in runs:
        for c in run["comparison"]:
            values.setdefault(c["name"], {})[run["mode"]] = c["max_rel"]

    def worst(name):
        return max((v for v in values[name].values() if v is not None), default=-1.0)

    names = sorted(values, key=worst, reverse=True)
    shown, hidden = names[:MAX_TENSORS], len(names) - MAX_TENSORS
    positive = [v for name in shown for v in values[name].values() if v is not None and v > 0 and math.isfinite(v)]
    if positive:
        hi = math.ceil(math.log10(max(positive)))
        lo = max(math.floor(math.log10(min(positive))), hi - 16)
        hi = max(hi, lo + 1)
    else:
        lo, hi = -8, 0
    modes = [run["mode"] for run in runs]
    left, width, bar, gap = 230, 560, 10, 8
    group = bar * len(modes) + gap
    top = 28
    height = top + group * len(shown) + 24

    def x_of(v: float) -> float:
        return left + width * (min(max(math.log10(v), lo), hi) - lo) / (hi - lo)

    body = [_legend(modes, left, 14)]
    step = max(1, (hi - lo) // 8)
    for decade in range(lo, hi + 1, step):
        x = x_of(10.0**decade)
        body.append(f"<line class='axis' x1='{x:.1f}' y1='{top - 4}' x2='{x:.1f}' y2='{height - 20}'/>")
        body.append(f"<text x='{x:.1f}' y='{height - 6}' text-anchor='middle'>1e{decade}</text>")
    for i, name in enumerate(shown):
        y = top + i * group
        label = name if len(name) <= 34 else name[:31] + "..."
        body.append(f"<text x='{left - 8}' y='{y + bar * len(modes) / 2 + 4:.1f}' text-anchor='end'>{_e(label)}</text>")
        for j, mode in enumerate(modes):
            v = values[name].get(mode)
            yy = y + j * bar
            if v is None or not math.isfinite(v):
                body.append(
                    f"<text x='{left + 4}' y='{yy + bar - 1}' font-size='10'>{_e('n/a' if v is None else v)}</text>"
                )
            elif v <= 0:
                body.append(f"<text x='{left + 4}' y='{yy + bar - 1}' font-size='10'>0 (exact)</text>")
            else:
                color = MODE_COLORS.get(mode, "#9ca3af")
                w = max(2.0, x_of(v) - left)
                body.append(
                    f"<rect x='{left}' y='{yy}' width='{w:.1f}' height='{bar - 1}' fill='{color}'>"
                    f"<title>{_e(f'{name} [{mode}]: {v:.3g}')}</title></rect>"
                )
    svg = _svg(left + width + 40, height, "".join(body), "largest relative error per compared tensor and mode")
    note = f"<p class='meta'>{hidden} more tensors with smaller errors are not shown.</p>" if hidden > 0 else ""
    return _section("Largest relative error per tensor (log scale)", svg + note, "errors-chart")


def _loss_chart(record: dict) -> str:
    """Each run's loss per step, the runs drawn over each other."""
    runs = [run for run in record["runs"] if any(v is not None and math.isfinite(v) for v in run["losses"])]
    if not runs:
        return ""
    finite = [v for run in runs for v in run["losses"] if v is not None and math.isfinite(v)]
    lo, hi = min(finite), max(finite)
    if hi == lo:
        lo, hi = lo - 1, hi + 1
    steps = max(len(run["losses"]) for run in runs)
    left, top, width, height = 60, 24, 600, 180

    def point(i: int, v: float) -> str:
        x = left + (width * i / (steps - 1) if steps > 1 else width / 2)
        y = top + height * (hi - v) / (hi - lo)
        return f"{x:.1f},{y:.1f}"

    body = [
        _legend([run["mode"] for run in runs], left, 14),
        f"<line class='axis' x1='{left}' y1='{top}' x2='{left}' y2='{top + height}'/>",
        f"<line class='axis' x1='{left}' y1='{top + height}' x2='{left + width}' y2='{top + height}'/>",
        f"<text x='{left - 6}' y='{top + 4}' text-anchor='end'>{_e(_summary.fmt_float(hi))}</text>",
        f"<text x='{left - 6}' y='{top + height}' text-anchor='end'>{_e(_summary.fmt_float(lo))}</text>",
        f"<text x='{left + width}' y='{top + height + 16}' text-anchor='end'>step {steps - 1}</text>",
    ]
    for run in runs:
        color = MODE_COLORS.get(run["mode"], "#9ca3af")
        # a missing loss breaks the line
        segments, current = [], []
        for i, v in enumerate(run["losses"]):
            if v is None or not math.isfinite(v):
                segments.append(current)
                current = []
            else:
                current.append(point(i, v))
        segments.append(current)
        for segment in segments:
            if len(segment) == 1:
                x, y = segment[0].split(",")
                body.append(f"<circle cx='{x}' cy='{y}' r='2.5' fill='{color}'/>")
            elif segment:
                body.append(f"<polyline fill='none' stroke='{color}' stroke-width='2' points='{' '.join(segment)}'/>")
    svg = _svg(left + width + 40, top + height + 24, "".join(body), "loss per step and run")
    return _section("Loss per step", svg, "losses")


def _ops(record: dict) -> str:
    runs = [run for run in record["runs"] if run["mode"] != "reference"]
    if not any(run["ops"] for run in runs):
        return _section("Ops by placement", "<p class='empty'>No ops were recorded.</p>", "ops")
    modes = [run["mode"] for run in runs]
    # placement -> mode -> (distinct ops, calls)
    totals: dict[str, dict[str, list[int]]] = {}
    cells: dict[str, dict[str, list[tuple[str, int]]]] = {}
    for run in runs:
        for op in run["ops"]:
            total = totals.setdefault(op["placement"], {}).setdefault(run["mode"], [0, 0])
            total[0] += 1
            total[1] += op["count"]
            cells.setdefault(op["op"], {}).setdefault(run["mode"], []).append((op["placement"], op["count"]))
    summary_rows = []
    for placement, per_mode in sorted(totals.items(), key=lambda item: item[0] != "cpu_fallback"):
        cls = "num fallback" if placement == "cpu_fallback" else "num"
        row = [_td(placement, "fallback" if placement == "cpu_fallback" else "")]
        for mode in modes:
            n_ops, calls = per_mode.get(mode, (0, 0))
            text = f"{n_ops} op{'s' * (n_ops != 1)}, {calls} call{'s' * (calls != 1)}"
            row.append(_td(text if n_ops else "-", cls if n_ops else "num"))
        summary_rows.append(row)

    def order(op):
        fallback = any(p == "cpu_fallback" for per in cells[op].values() for p, _ in per)
        return (not fallback, -sum(n for per in cells[op].values() for _, n in per), op)

    detail_rows = []
    for op in sorted(cells, key=order):
        row = [f"<td><code>{_e(op)}</code></td>"]
        for mode in modes:
            per = cells[op].get(mode, [])
            text = ", ".join(f"{p} \u00d7{n}" for p, n in per) or "-"
            row.append(_td(text, "fallback" if any(p == "cpu_fallback" for p, _ in per) else ""))
        detail_rows.append(row)
    body = _table(["placement", *modes], summary_rows) + "<h3>Each op</h3>" + _table(["op", *modes], detail_rows)
    return _section("Ops by placement", body, "ops")


def _compilations(record: dict) -> str:
    rows = []
    for run in record["runs"]:
        if run["mode"] == "reference":
            continue
        c = run["compilations"]
        reasons = "<br>".join(f"{_e(reason)} \u00d7{n}" for reason, n in c["reasons"].items()) or "-"
        rows.append([_td(run["mode"]), _td(c["count"], "num"), _td(c["recompiles"], "num"), reasons])
    if not rows:
        return ""
    return _section(
        "Compilations", _table(["mode", "compiled", "recompiles", "recompile reasons"], rows), "compilations"
    )


def _criteria(record: dict) -> str:
    if not record["criteria"]:
        return _section("Criteria", "<p class='empty'>No acceptance criteria were given.</p>", "criteria")
    rows = []
    for c in record["criteria"]:
        threshold = f"{c['op']} {_summary.fmt_float(c['threshold'])}" + ("x reference" if c["relative"] else "")
        rows.append(
            [
                _td("PASS" if c["passed"] else "FAIL", "pass" if c["passed"] else "fail"),
                f"<td><code>{_e(c['text'])}</code></td>",
                _td(c["mode"]),
                _td(c["metric"]),
                _td(_summary.fmt_float(c["value"]), "num"),
                _td(threshold),
            ]
        )
    return _section(
        "Criteria", _table(["result", "criterion", "mode", "metric", "value", "threshold"], rows), "criteria"
    )


def _errors(record: dict) -> str:
    failed = [run for run in record["runs"] if run["error"] or run["status"] != "ok"]
    if not failed:
        return ""
    parts = []
    for run in failed:
        error = run["error"]
        if error:
            parts.append(
                f"<h3>{_e(run['mode'])}: {_e(error['type'])}</h3><pre>{_e(error['message'])}</pre>"
                f"<p>at <code>{_e(error['where'])}</code></p><pre>{_e(error['traceback'])}</pre>"
            )
        else:
            parts.append(f"<h3>{_e(run['mode'])}: {_e(run['status'])}</h3>")
        if run["stdout_tail"]:
            parts.append(
                f"<details><summary>output (last lines)</summary><pre>{_e(run['stdout_tail'])}</pre></details>"
            )
    return _section("Errors", "\n".join(parts), "errors")


def _scan(record: dict) -> str:
    if not record["scan"]:
        return _section("CUDA assumptions", "<p class='empty'>The scan found none.</p>", "scan")
    rows = [
        [
            f"<td><code>{_e(f['path'])}:{f['line']}:{f['col']}</code></td>",
            _td(f["kind"]),
            f"<td><code>{_e(f['code'].strip())}</code></td>",
            _td(f["message"]),
            f"<td><code>{_e(f['rewrite'])}</code></td>",
        ]
        for f in record["scan"]
    ]
    return _section("CUDA assumptions", _table(["where", "kind", "code", "finding", "rewrite"], rows), "scan")


def _diff(record: dict) -> str:
    d = record["diff"]
    if not d:
        return ""
    lines = []
    for line in d["text"].splitlines():
        if line.startswith(("+++", "---")):
            cls = ""
        elif line.startswith("+"):
            cls = "add"
        elif line.startswith("-"):
            cls = "del"
        elif line.startswith("@@"):
            cls = "hunk"
        else:
            cls = ""
        lines.append(f"<span class='{cls}'>{_e(line)}</span>" if cls else _e(line))
    meta = (
        f"<p class='meta'>{_e(d['repo'])} &middot; against <code>{_e(d['base'])}</code> &middot; "
        f"HEAD <code>{_e(d['commit'])}</code> &middot; {_e(', '.join(d['files']))}</p>"
    )
    return _section("Changes for the migration (git diff)", meta + "<pre>" + "\n".join(lines) + "</pre>", "diff")


def _notes(record: dict) -> str:
    notes = record.get("notes") or []
    if not notes:
        return ""
    items = "".join(f"<li><span class='meta'>{_e(n['created'])}</span> {_e(n['text'])}</li>" for n in notes)
    return _section("Notes", f"<ul>{items}</ul>", "notes")
