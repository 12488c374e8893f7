"""The evidence store: doctor records (record.schema.json) in a local SQLite file, with
full-text search, notes and the differences between two records; and ``torch-jax evidence``,
its command line.

NOTE [Evidence store]: each record is kept whole, as its JSON, beside a few columns the
listing shows (target, verdict, versions), and one row of an FTS5 table holds the words a
search can find in it: the target, environment, run statuses, errors, fallback ops,
recompile reasons, criteria, scan findings, changed files and the notes. Notes live in their
own table, not in the record, so a record stays what the doctor wrote (and valid against its
schema); ``Store.get`` returns the record with its notes under "notes", and ``Store.add``
takes such a dict back (``evidence show --json`` then ``evidence add``) without duplicating
notes. A note rewrites the record's FTS row, so the search ranks a record as one document.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sqlite3
import sys

from torch_jax.doctor import _summary
from torch_jax.doctor._doctor import SCHEMA

# the version of the database's tables (PRAGMA user_version), not of the records
DB_VERSION = 1

_TABLES = """
CREATE TABLE records (
    id TEXT PRIMARY KEY,
    created TEXT NOT NULL,
    target TEXT NOT NULL,
    verdict TEXT NOT NULL,
    runs TEXT NOT NULL,
    torch TEXT,
    jax TEXT,
    torch_jax TEXT,
    jax_backend TEXT,
    added TEXT NOT NULL,
    record TEXT NOT NULL
);
CREATE INDEX records_created ON records (created);
CREATE TABLE notes (
    record_id TEXT NOT NULL REFERENCES records (id) ON DELETE CASCADE,
    created TEXT NOT NULL,
    text TEXT NOT NULL
);
CREATE INDEX notes_record ON notes (record_id);
CREATE VIRTUAL TABLE search USING fts5 (id UNINDEXED, body, tokenize = 'porter unicode61');
"""

_ROW_COLUMNS = ("id", "created", "target", "verdict", "runs", "torch", "jax", "torch_jax", "jax_backend")


class UnknownRecord(KeyError):
    """No stored record has the id asked for, or several start with it."""

    def __str__(self) -> str:
        return self.args[0]


def default_path() -> str:
    """``$TORCH_JAX_EVIDENCE_DB``, else ``evidence.sqlite`` in torch_jax's cache folder."""
    explicit = os.environ.get("TORCH_JAX_EVIDENCE_DB")
    if explicit:
        return explicit
    from torch_jax import _config

    return os.path.join(_config.cache_dir(), "evidence.sqlite")


class Store:
    """The records in the SQLite file at ``path`` (``default_path()`` when None); the tables
    are made on first open. Use it as a context manager, or call ``close()``."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = os.fspath(path) if path is not None else default_path()
        if self.path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self._db = sqlite3.connect(self.path)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA foreign_keys = ON")
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version == 0:
            with self._db:
                self._db.executescript(_TABLES + f"PRAGMA user_version = {DB_VERSION};")
        elif version != DB_VERSION:
            self._db.close()
            raise RuntimeError(
                f"{self.path}: evidence database version {version}; this torch_jax reads version {DB_VERSION} "
                "(use the torch_jax that made it, or another file with --db or TORCH_JAX_EVIDENCE_DB)"
            )

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def add(self, record: dict) -> str:
        """Store ``record`` (a doctor record, optionally with "notes" as ``get`` returns them)
        and return its id; a record with the same id is replaced, its notes kept."""
        record = dict(record)
        notes = record.pop("notes", None) or []
        _check(record)
        env = record["environment"]
        columns = {
            "id": record["id"],
            "created": record["created"],
            "target": record["target"]["spec"],
            "verdict": record["verdict"],
            "runs": " ".join(f"{run['mode']}:{run['status']}" for run in record["runs"]),
            "torch": env.get("torch"),
            "jax": env.get("jax"),
            "torch_jax": env.get("torch_jax"),
            "jax_backend": env.get("jax_backend"),
            "added": _now(),
            "record": json.dumps(record),
        }
        names = ", ".join(columns)
        updates = ", ".join(f"{name} = excluded.{name}" for name in columns if name not in ("id", "added"))
        with self._db:
            self._db.execute(
                f"INSERT INTO records ({names}) VALUES ({', '.join('?' * len(columns))}) "
                f"ON CONFLICT (id) DO UPDATE SET {updates}",
                list(columns.values()),
            )
            have = {(n["created"], n["text"]) for n in self._notes(record["id"])}
            for note in notes:
                if (note["created"], note["text"]) not in have:
                    self._db.execute(
                        "INSERT INTO notes (record_id, created, text) VALUES (?, ?, ?)",
                        (record["id"], note["created"], note["text"]),
                    )
            self._index(record["id"], record)
        return record["id"]

    def get(self, id_or_prefix: str) -> dict:
        """The record whose id is ``id_or_prefix`` or the one id that starts with it, with its
        notes under "notes" (a list of {"created", "text"}, oldest first)."""
        record_id = self.resolve(id_or_prefix)
        row = self._db.execute("SELECT record FROM records WHERE id = ?", (record_id,)).fetchone()
        record = json.loads(row["record"])
        record["notes"] = self._notes(record_id)
        return record

    def resolve(self, id_or_prefix: str) -> str:
        """The full id of ``id_or_prefix``; UnknownRecord (a KeyError) when no id or several
        start with it."""
        if self._db.execute("SELECT 1 FROM records WHERE id = ?", (id_or_prefix,)).fetchone():
            return id_or_prefix
        ids = [
            row["id"]
            for row in self._db.execute(
                "SELECT id FROM records WHERE substr(id, 1, ?) = ? ORDER BY id LIMIT 6",
                (len(id_or_prefix), id_or_prefix),
            )
        ]
        if not id_or_prefix or not ids:
            raise UnknownRecord(
                f"no record with id {id_or_prefix!r} in {self.path} (`torch-jax evidence list` shows them)"
            )
        if len(ids) > 1:
            shown = ", ".join(ids[:5]) + (", ..." if len(ids) > 5 else "")
            raise UnknownRecord(f"{id_or_prefix!r} starts several record ids ({shown}); give more of the id")
        return ids[0]

    def list(self, limit: int | None = None) -> list[dict]:
        """Summary rows (id, created, target, verdict, runs, versions, notes: their count),
        newest first."""
        return self._rows("", (), limit)

    def search(self, query: str, limit: int | None = None) -> list[dict]:
        """The records whose text has every word of ``query``, best match first (FTS5's bm25),
        as ``list``'s rows with "snippet": the matching words in context. Words are matched
        as typed, punctuation included (``aten::addmm``, ``loss_rel<=1e-3``), and by their
        stem (recompile finds recompiles); ``"two words"`` must be next to each other; a word
        ending in ``*`` matches as a prefix (``fts_query``)."""
        match = fts_query(query)
        if match is None:
            return []
        return self._rows(
            "JOIN search ON search.id = records.id WHERE search MATCH ?",
            (match,),
            limit,
            extra=", snippet(search, 1, '[', ']', '...', 10) AS snippet",
            order="bm25(search), records.created DESC",
        )

    def note(self, id_or_prefix: str, text: str) -> None:
        """Append ``text``, stamped with the time, to the record's notes."""
        record_id = self.resolve(id_or_prefix)
        if not text.strip():
            raise ValueError("a note needs some text")
        with self._db:
            self._db.execute(
                "INSERT INTO notes (record_id, created, text) VALUES (?, ?, ?)", (record_id, _now(), text.strip())
            )
            self._index(record_id)

    def diff(self, a: str, b: str) -> dict:
        """What changed from record ``a`` to record ``b`` (ids or prefixes): see ``diff``."""
        return diff(self.get(a), self.get(b))

    def _notes(self, record_id: str) -> list[dict]:
        rows = self._db.execute(
            "SELECT created, text FROM notes WHERE record_id = ? ORDER BY rowid", (record_id,)
        ).fetchall()
        return [{"created": row["created"], "text": row["text"]} for row in rows]

    def _index(self, record_id: str, record: dict | None = None) -> None:
        if record is None:
            row = self._db.execute("SELECT record FROM records WHERE id = ?", (record_id,)).fetchone()
            record = json.loads(row["record"])
        body = search_text(record, self._notes(record_id))
        self._db.execute("DELETE FROM search WHERE id = ?", (record_id,))
        self._db.execute("INSERT INTO search (id, body) VALUES (?, ?)", (record_id, body))

    def _rows(self, where: str, params: tuple, limit: int | None, extra: str = "", order: str = "") -> list[dict]:
        columns = ", ".join(f"records.{name}" for name in _ROW_COLUMNS)
        sql = (
            f"SELECT {columns}, (SELECT count(*) FROM notes WHERE record_id = records.id) AS notes{extra} "
            f"FROM records {where} ORDER BY {order or 'records.created DESC, records.id DESC'}"
        )
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [dict(row) for row in self._db.execute(sql, params)]


def fts_query(text: str) -> str | None:
    """An FTS5 MATCH expression for the words of ``text``, all required: each word, or words
    in double quotes, becomes a quoted phrase, so FTS5's operators and punctuation are plain
    text (``aten::addmm`` matches the words aten and addmm next to each other). A word ending
    in ``*`` is a prefix. None when no word has a letter or a digit (nothing would match)."""
    phrases = []
    for quoted, word in re.findall(r'"([^"]*)"|(\S+)', text):
        word = quoted or word
        prefix = word.endswith("*") and len(word) > 1
        word = word.rstrip("*") if prefix else word
        if not re.search(r"\w", word):
            continue
        phrases.append('"' + word.replace('"', '""') + '"' + ("*" if prefix else ""))
    return " ".join(phrases) or None


def search_text(record: dict, notes: list[dict] = ()) -> str:
    """The words a search finds the record by (NOTE [Evidence store])."""
    target, env = record["target"], record["environment"]
    parts = [record["id"], target["kind"], target["spec"], target.get("path") or "", " ".join(target["args"])]
    parts += [f"{key} {value}" for key, value in env.items() if value not in (None, [], "")]
    parts.append("modes " + " ".join(record["config"].get("modes", [])))
    parts.append(f"verdict {record['verdict']}")
    for run in record["runs"]:
        mode = run["mode"]
        parts.append(f"{mode} {run['status']} on {run['device']}")
        if run["error"]:
            error = run["error"]
            parts.append(f"{mode} error {error['type']} {error['message']} {error['where']}")
        parts += [f"{mode} cpu_fallback {op['op']}" for op in run["ops"] if op["placement"] == "cpu_fallback"]
        compilations = run["compilations"]
        if compilations["recompiles"]:
            parts.append(f"{mode} recompiles {compilations['recompiles']}")
        parts += [f"{mode} compile {reason}" for reason in compilations["reasons"]]
    for c in record["criteria"]:
        parts.append(f"criterion {c['text']} {c['mode']} {'pass' if c['passed'] else 'fail'}")
    for finding in record["scan"]:
        parts.append(f"scan {finding['kind']} {finding['path']} {finding['message']}")
    if record["diff"]:
        parts.append("diff " + " ".join(record["diff"]["files"]))
    parts += [f"note {note['text']}" for note in notes]
    return "\n".join(part for part in parts if part)


def diff(a: dict, b: dict) -> dict:
    """What changed from record ``a`` to record ``b``. Every change is a pair {"a": old, "b":
    new} (None where a side has no value); unchanged things are left out:

    - ids: {"a", "b"}
    - environment, config, target: {key: pair}
    - verdict: pair or None
    - runs: {mode: {"status": pair?, "median_s": pair?, "step_time_ratio": b/a?,
      "fallbacks": pair?, "compilations": pair?, "recompiles": pair?}} for modes with a change
    - ops: {mode: {"added": [{"op", "placements": {placement: count}}], "removed": [...],
      "changed": [{"op", "a": {placement: count}, "b": {...}}]}}
    - errors: {"appeared": [{mode, type, message, where}], "disappeared": [...]}
    - comparisons: {mode: [{"name", "max_abs": pair, "max_rel": pair, "ok": pair}]}
    - criteria: [{"text", "mode", "passed": pair, "value": pair}] where pass/fail changed
    """
    out = {
        "ids": {"a": a["id"], "b": b["id"]},
        "environment": _dict_changes(a["environment"], b["environment"]),
        "config": _dict_changes(a["config"], b["config"]),
        "target": _dict_changes(a["target"], b["target"]),
        "verdict": _pair(a["verdict"], b["verdict"]),
        "runs": {},
        "ops": {},
        "errors": {"appeared": [], "disappeared": []},
        "comparisons": {},
        "criteria": [],
    }
    runs_a, runs_b = _by_mode(a), _by_mode(b)
    for mode in [*runs_a, *(m for m in runs_b if m not in runs_a)]:
        ra, rb = runs_a.get(mode), runs_b.get(mode)
        changes = _run_changes(ra, rb)
        if changes:
            out["runs"][mode] = changes
        ops = _op_changes(ra["ops"] if ra else [], rb["ops"] if rb else [])
        if any(ops.values()):
            out["ops"][mode] = ops
        comparisons = _comparison_changes(ra["comparison"] if ra else [], rb["comparison"] if rb else [])
        if comparisons:
            out["comparisons"][mode] = comparisons
        error_a, error_b = _error(mode, ra), _error(mode, rb)
        if _error_key(error_a) != _error_key(error_b):
            if error_a:
                out["errors"]["disappeared"].append(error_a)
            if error_b:
                out["errors"]["appeared"].append(error_b)
    criteria_a = {(c["text"], c["mode"]): c for c in a["criteria"]}
    criteria_b = {(c["text"], c["mode"]): c for c in b["criteria"]}
    for key in [*criteria_a, *(k for k in criteria_b if k not in criteria_a)]:
        ca, cb = criteria_a.get(key), criteria_b.get(key)
        passed = (ca and ca["passed"], cb and cb["passed"])
        if passed[0] != passed[1]:
            out["criteria"].append(
                {
                    "text": key[0],
                    "mode": key[1],
                    "passed": {"a": passed[0], "b": passed[1]},
                    "value": {"a": ca and ca["value"], "b": cb and cb["value"]},
                }
            )
    return out


def is_empty(d: dict) -> bool:
    """Whether ``diff`` found no change."""
    return not any(value for key, value in d.items() if key not in ("ids", "errors")) and not any(d["errors"].values())


def _check(record: dict) -> None:
    if not isinstance(record, dict) or record.get("schema") != SCHEMA:
        got = record.get("schema") if isinstance(record, dict) else type(record).__name__
        raise ValueError(f"not a doctor record: expected schema {SCHEMA!r}, got {got!r}")
    missing = [key for key in ("id", "created", "target", "environment", "runs", "verdict") if key not in record]
    if missing:
        raise ValueError(f"doctor record {record.get('id', '?')!r} lacks {', '.join(missing)}")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _pair(x, y) -> dict | None:
    return None if x == y else {"a": x, "b": y}


def _dict_changes(a: dict, b: dict) -> dict:
    keys = [*a, *(k for k in b if k not in a)]
    return {key: {"a": a.get(key), "b": b.get(key)} for key in keys if a.get(key) != b.get(key)}


def _by_mode(record: dict) -> dict:
    return {run["mode"]: run for run in record["runs"]}


def _run_facts(run: dict | None) -> dict:
    """What ``diff`` compares of a run (all None for a run the record lacks)."""
    if run is None:
        return dict.fromkeys(("status", "median_s", "fallbacks", "compilations", "recompiles"))
    return {
        "status": run["status"],
        "median_s": _summary.median_s(run),
        "fallbacks": run["fallbacks"],
        "compilations": run["compilations"]["count"],
        "recompiles": run["compilations"]["recompiles"],
    }


def _run_changes(ra: dict | None, rb: dict | None) -> dict:
    fa, fb = _run_facts(ra), _run_facts(rb)
    changes = {key: {"a": fa[key], "b": fb[key]} for key in fa if fa[key] != fb[key]}
    median = changes.get("median_s")
    if median and median["a"] and median["b"] is not None:
        changes["step_time_ratio"] = median["b"] / median["a"]
    return changes


def _placements(ops: list[dict]) -> dict:
    """op -> {placement: count}."""
    out: dict = {}
    for op in ops:
        per = out.setdefault(op["op"], {})
        per[op["placement"]] = per.get(op["placement"], 0) + op["count"]
    return out


def _op_changes(ops_a: list[dict], ops_b: list[dict]) -> dict:
    pa, pb = _placements(ops_a), _placements(ops_b)
    return {
        "added": [{"op": op, "placements": pb[op]} for op in pb if op not in pa],
        "removed": [{"op": op, "placements": pa[op]} for op in pa if op not in pb],
        "changed": [{"op": op, "a": pa[op], "b": pb[op]} for op in pa if op in pb and pa[op] != pb[op]],
    }


def _comparison_changes(ca: list[dict], cb: list[dict]) -> list[dict]:
    """The tensors compared in both runs whose errors changed (a run that stopped comparing
    shows as its status)."""
    by_name = {c["name"]: c for c in cb}
    out = []
    for c in ca:
        other = by_name.get(c["name"])
        if other is None:
            continue
        fields = {key: {"a": c[key], "b": other[key]} for key in ("max_abs", "max_rel", "ok")}
        if any(pair["a"] != pair["b"] for pair in fields.values()):
            out.append({"name": c["name"], **fields})
    return out


def _error(mode: str, run: dict | None) -> dict | None:
    error = run and run["error"]
    return {"mode": mode, **{key: error[key] for key in ("type", "message", "where")}} if error else None


def _error_key(error: dict | None):
    """Errors are the same when their type and message are (the line may move with an edit)."""
    return (error["type"], error["message"]) if error else None


# ---- the command line ----


def format_list(rows: list[dict]) -> str:
    """``list``'s or ``search``'s rows as a table (with the matching words under each
    search hit)."""
    if not rows:
        return "no records"
    lines = _summary.table(
        ["id", "created", "verdict", "target", "runs", "torch", "jax", "backend", "notes"],
        [
            [
                r["id"],
                r["created"],
                r["verdict"],
                r["target"],
                r["runs"],
                r["torch"] or "-",
                r["jax"] or "-",
                r["jax_backend"] or "-",
                str(r["notes"] or ""),
            ]
            for r in rows
        ],
    )
    if any("snippet" in r for r in rows):
        out = [lines[0]]
        for line, row in zip(lines[1:], rows):
            out += [line, "    " + " ".join(row["snippet"].split())]
        lines = out
    return "\n".join(lines)


def format_record(record: dict) -> str:
    return _summary.summary(record)


def format_diff(d: dict) -> str:
    """``diff``'s dict as lines of text."""
    lines = [f"{d['ids']['a']} -> {d['ids']['b']}"]
    if is_empty(d):
        return "\n".join([*lines, "no differences"])

    def show(pair):
        return f"{_value(pair['a'])} -> {_value(pair['b'])}"

    for section in ("target", "environment", "config"):
        for key, pair in d[section].items():
            lines.append(f"{section} {key}: {show(pair)}")
    if d["verdict"]:
        lines.append(f"verdict: {show(d['verdict'])}")
    for mode, changes in d["runs"].items():
        parts = [
            f"{key} {show(changes[key])}"
            for key in ("status", "fallbacks", "compilations", "recompiles")
            if key in changes
        ]
        if "median_s" in changes:
            m = changes["median_s"]
            ratio = f" ({changes['step_time_ratio']:.2f}x)" if "step_time_ratio" in changes else ""
            parts.append(f"step {_summary.fmt_seconds(m['a'])} -> {_summary.fmt_seconds(m['b'])}{ratio}")
        lines.append(f"{mode}: " + "; ".join(parts))
    for mode, ops in d["ops"].items():
        for op in ops["added"]:
            lines.append(f"{mode} op added   {op['op']} {_placement_text(op['placements'])}")
        for op in ops["removed"]:
            lines.append(f"{mode} op removed {op['op']} {_placement_text(op['placements'])}")
        for op in ops["changed"]:
            lines.append(f"{mode} op changed {op['op']} {_placement_text(op['a'])} -> {_placement_text(op['b'])}")
    for kind, sign in (("disappeared", "-"), ("appeared", "+")):
        for e in d["errors"][kind]:
            lines.append(f"{sign} {e['mode']} error {e['type']}: {e['message'].strip()[:200]} (at {e['where']})")
    for mode, rows in d["comparisons"].items():
        for c in rows:
            lines.append(
                f"{mode} {c['name']}: max_rel {_summary.fmt_float(c['max_rel']['a'])} -> "
                f"{_summary.fmt_float(c['max_rel']['b'])}, max_abs {_summary.fmt_float(c['max_abs']['a'])} -> "
                f"{_summary.fmt_float(c['max_abs']['b'])}"
                + ("" if c["ok"]["a"] == c["ok"]["b"] else f", ok {show(c['ok'])}")
            )
    for c in d["criteria"]:
        state = {True: "pass", False: "fail", None: "absent"}
        lines.append(
            f"criterion {c['text']} [{c['mode']}]: {state[c['passed']['a']]} -> {state[c['passed']['b']]} "
            f"(value {_summary.fmt_float(c['value']['a'])} -> {_summary.fmt_float(c['value']['b'])})"
        )
    return "\n".join(lines)


def _value(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return _summary.fmt_float(x)
    if isinstance(x, (dict, list)):
        return json.dumps(x)
    return str(x)


def _placement_text(per: dict) -> str:
    return ", ".join(f"{placement} x{count}" for placement, count in per.items())


def main(argv=None) -> int:
    """``torch-jax evidence list|show|search|diff|note|add``: 0, or 1 with a message for an
    unknown id or a file that is not a record (2 for bad arguments, as argparse exits)."""
    args = _parser().parse_args(argv)
    try:
        with Store(args.db) as store:
            return args.run(store, args)
    except (UnknownRecord, ValueError, OSError) as e:
        print(f"torch-jax evidence: {e}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    db_help = "the database file (default: $TORCH_JAX_EVIDENCE_DB, else evidence.sqlite in the cache folder)"
    parser = argparse.ArgumentParser(prog="torch-jax evidence", description="the stored records of torch-jax doctor")
    parser.add_argument("--db", default=None, help=db_help)
    # --db after the command too; SUPPRESS keeps the subcommand from resetting a --db given before it
    db = argparse.ArgumentParser(add_help=False)
    db.add_argument("--db", default=argparse.SUPPRESS, help=db_help)
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("list", parents=[db], help="the records, newest first")
    p.add_argument("--limit", type=int, default=None)
    p.set_defaults(run=lambda store, args: _print(format_list(store.list(args.limit))))

    p = commands.add_parser("show", parents=[db], help="one record (an id or a unique prefix of one)")
    p.add_argument("id")
    p.add_argument("--json", action="store_true", help="the whole record, with its notes, as JSON")
    p.add_argument("--html", metavar="PATH", help="also write the record's HTML report to PATH")
    p.set_defaults(run=_show)

    p = commands.add_parser("search", parents=[db], help="records with every word of the query")
    p.add_argument("query", nargs="+")
    p.add_argument("--limit", type=int, default=None)
    p.set_defaults(run=lambda store, args: _print(format_list(store.search(" ".join(args.query), args.limit))))

    p = commands.add_parser("diff", parents=[db], help="what changed from one record to another")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=_diff)

    p = commands.add_parser("note", parents=[db], help="add a note to a record")
    p.add_argument("id")
    p.add_argument("text", nargs="+")
    p.set_defaults(run=_note)

    p = commands.add_parser("add", parents=[db], help="store a record from a JSON file")
    p.add_argument("file")
    p.set_defaults(run=_add)
    return parser


def _print(text: str) -> int:
    print(text)
    return 0


def _show(store: Store, args) -> int:
    record = store.get(args.id)
    if args.html:
        from torch_jax.doctor import _html

        _html.write(record, args.html)
    return _print(json.dumps(record, indent=2) if args.json else format_record(record))


def _diff(store: Store, args) -> int:
    d = store.diff(args.a, args.b)
    return _print(json.dumps(d, indent=2) if args.json else format_diff(d))


def _note(store: Store, args) -> int:
    record_id = store.resolve(args.id)
    store.note(record_id, " ".join(args.text))
    return _print(f"noted on {record_id}")


def _add(store: Store, args) -> int:
    with open(args.file) as f:
        try:
            record = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{args.file}: not JSON ({e})") from None
    return _print(f"added {store.add(record)}")
