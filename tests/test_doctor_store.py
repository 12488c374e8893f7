"""The doctor's evidence store (SQLite with full-text search), the differences between two
records, ``torch-jax evidence``'s commands, the terminal summary and the HTML report, down
to a screenshot of the page in headless Chromium."""

from __future__ import annotations

import json
import sqlite3

import jsonschema
import pytest

from _browser import needs_chromium, screenshot
from doctor_records import failed_record, run_of, sample_record, schema
from torch_jax.doctor import _html, _store, _summary

SAMPLE_ID = "20250301T101500Z-train_tiny-a1b2c3"
FAILED_ID = "20250302T090000Z-train_tiny-d4e5f6"


@pytest.fixture
def store(tmp_path):
    with _store.Store(tmp_path / "evidence.sqlite") as s:
        yield s


def _llama_record() -> dict:
    """A third record: another target, created last, that recompiles."""
    record = sample_record(id="20250303T080000Z-llama-0f0f0f", created="2025-03-03T08:00:00+00:00")
    record["target"] = dict(record["target"], spec="llama_finetune.py", path="/home/user/proj/llama_finetune.py")
    run_of(record, "fused")["compilations"].update(recompiles=4, reasons={"KV cache length 17 -> 18": 4})
    return record


@pytest.mark.parametrize("make", [sample_record, failed_record, _llama_record])
def test_sample_records_follow_the_schema(make):
    validator = jsonschema.Draft202012Validator(schema())
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(make())]
    assert errors == []


def test_add_and_get(store):
    assert store.add(sample_record()) == SAMPLE_ID
    got = store.get(SAMPLE_ID)
    assert got.pop("notes") == []
    assert got == sample_record()
    assert store.get("20250301")["id"] == SAMPLE_ID  # a unique prefix


def test_get_unknown_or_ambiguous(store):
    store.add(sample_record())
    store.add(failed_record())
    with pytest.raises(KeyError, match="no record with id 'nope'"):
        store.get("nope")
    with pytest.raises(KeyError, match="starts several record ids"):
        store.get("2025030")
    with pytest.raises(KeyError, match="no record"):
        store.get("")


def test_add_replaces_a_record_and_rejects_others(store):
    store.add(sample_record())
    store.add(sample_record(verdict="pass"))
    assert [row["verdict"] for row in store.list()] == ["pass"]
    with pytest.raises(ValueError, match="not a doctor record"):
        store.add({"schema": "something/else", "id": "x"})


def test_list_newest_first(store):
    for record in (failed_record(), _llama_record(), sample_record()):
        store.add(record)
    rows = store.list()
    assert [row["id"] for row in rows] == ["20250303T080000Z-llama-0f0f0f", FAILED_ID, SAMPLE_ID]
    assert rows[1]["runs"] == "reference:ok strict:ok fused:ok compiled:failed"
    assert rows[1]["verdict"] == "error"
    assert (rows[2]["torch"], rows[2]["jax"], rows[2]["torch_jax"], rows[2]["jax_backend"]) == (
        "2.11.0",
        "0.10.1",
        "0.1.0",
        "cpu",
    )
    assert [row["id"] for row in store.list(limit=1)] == ["20250303T080000Z-llama-0f0f0f"]


@pytest.mark.parametrize(
    "query, expected",
    [
        ("llama recompile", {"20250303T080000Z-llama-0f0f0f"}),  # "recompile" finds "recompiles" (stemmed)
        ("KV cache", {"20250303T080000Z-llama-0f0f0f"}),  # a recompile reason
        ("aten::_embedding_bag", {SAMPLE_ID, FAILED_ID, "20250303T080000Z-llama-0f0f0f"}),  # a fallback op
        ("aten::_fft_r2c", {FAILED_ID}),  # in an error message
        ("NotImplementedError train_tiny.py:31", {FAILED_ID}),  # the error's type and where
        ("loss_rel<=1e-3 fail", {SAMPLE_ID, "20250303T080000Z-llama-0f0f0f"}),  # criteria and results
        ("cudnn-flag", {SAMPLE_ID, "20250303T080000Z-llama-0f0f0f"}),  # a scan finding's kind
        ('"compiled failed"', {FAILED_ID}),  # a phrase: a run's status
        ("compiled failed", {SAMPLE_ID, FAILED_ID, "20250303T080000Z-llama-0f0f0f"}),  # words: "fail" is everywhere
        ("llam*", {"20250303T080000Z-llama-0f0f0f"}),  # a prefix
        ("nonexistentword", set()),
        # FTS5's own syntax in user text is plain text, and never a syntax error
        ('OR AND NOT ( ) NEAR(a b) col:x ^ "unbalanced', set()),
        ("<= ::", set()),  # nothing to search for
    ],
)
def test_search(store, query, expected):
    for record in (sample_record(), failed_record(), _llama_record()):
        store.add(record)
    assert {row["id"] for row in store.search(query)} == expected


def test_search_ranks_by_relevance(store):
    store.add(sample_record())
    store.add(_llama_record())
    store.note(SAMPLE_ID, "compare with llama once")
    llama = "20250303T080000Z-llama-0f0f0f"
    store.note(llama, "llama llama: the llama run after the llama tokenizer fix")
    rows = store.search("llama")
    assert [row["id"] for row in rows] == [llama, SAMPLE_ID]
    assert "[llama]" in rows[0]["snippet"]


def test_notes(store):
    store.add(sample_record())
    store.note("20250301", "slow on strict: aten::addmm falls back under bf16")
    store.note(SAMPLE_ID, "second note")
    notes = store.get(SAMPLE_ID)["notes"]
    assert [n["text"] for n in notes] == ["slow on strict: aten::addmm falls back under bf16", "second note"]
    assert all(n["created"].endswith("+00:00") for n in notes)
    assert [row["id"] for row in store.search("bf16 aten::addmm")] == [SAMPLE_ID]
    assert store.list()[0]["notes"] == 2
    # a record as `get` returns it goes back in without doubling its notes
    store.add(store.get(SAMPLE_ID))
    assert len(store.get(SAMPLE_ID)["notes"]) == 2
    with pytest.raises(KeyError):
        store.note("nope", "text")
    with pytest.raises(ValueError, match="needs some text"):
        store.note(SAMPLE_ID, "  ")


def test_database_version(tmp_path):
    path = tmp_path / "e.sqlite"
    _store.Store(path).close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == _store.DB_VERSION
        db.execute("PRAGMA user_version = 99")
    with pytest.raises(RuntimeError, match="version 99"):
        _store.Store(path)


def test_default_path(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_JAX_EVIDENCE_DB", str(tmp_path / "x.sqlite"))
    assert _store.default_path() == str(tmp_path / "x.sqlite")
    monkeypatch.delenv("TORCH_JAX_EVIDENCE_DB")
    monkeypatch.setenv("TORCH_JAX_CACHE_DIR", str(tmp_path / "cache"))
    assert _store.default_path() == str(tmp_path / "cache" / "evidence.sqlite")


def _changed_record() -> dict:
    """The sample record after an upgrade of torch: aten::gelu now falls back in strict
    mode, the compiled run fails and the fused steps take twice as long."""
    record = sample_record(id="20250305T120000Z-train_tiny-ffffff", created="2025-03-05T12:00:00+00:00")
    record["environment"]["torch"] = "2.12.0"
    strict = run_of(record, "strict")
    next(op for op in strict["ops"] if op["op"] == "aten::gelu")["placement"] = "cpu_fallback"
    strict["ops"].append({"op": "aten::erf", "placement": "lowered", "count": 40})
    strict["fallbacks"] += 40
    compiled = run_of(record, "compiled")
    compiled.update(status="failed", step_time=None, comparison=[])
    compiled["error"] = {
        "type": "RuntimeError",
        "message": "Dynamo failed to trace",
        "where": "train_tiny.py:40 (step)",
        "traceback": "Traceback ...",
    }
    fused = run_of(record, "fused")
    fused["step_time"]["median_s"] *= 2
    fused["comparison"][0]["max_rel"] = 0.5
    for c in record["criteria"]:
        if c["mode"] == "fused" and c["metric"] == "step_time":
            c.update(value=0.024, passed=False)
    return record


def test_diff(store):
    store.add(sample_record())
    store.add(_changed_record())
    d = store.diff("20250301", "20250305")
    assert d["ids"] == {"a": SAMPLE_ID, "b": "20250305T120000Z-train_tiny-ffffff"}
    assert d["environment"] == {"torch": {"a": "2.11.0", "b": "2.12.0"}}
    assert d["config"] == {} and d["target"] == {} and d["verdict"] is None  # fail both times
    assert d["runs"]["strict"] == {"fallbacks": {"a": 20, "b": 60}}
    assert d["runs"]["fused"] == {"median_s": {"a": 0.012, "b": 0.024}, "step_time_ratio": 2.0}
    assert d["runs"]["compiled"] == {"status": {"a": "ok", "b": "failed"}, "median_s": {"a": 0.007, "b": None}}
    assert "reference" not in d["runs"]
    assert d["ops"] == {
        "strict": {
            "added": [{"op": "aten::erf", "placements": {"lowered": 40}}],
            "removed": [],
            "changed": [{"op": "aten::gelu", "a": {"lowered": 40}, "b": {"cpu_fallback": 40}}],
        }
    }
    assert d["errors"] == {
        "appeared": [
            {
                "mode": "compiled",
                "type": "RuntimeError",
                "message": "Dynamo failed to trace",
                "where": "train_tiny.py:40 (step)",
            }
        ],
        "disappeared": [],
    }
    assert d["comparisons"] == {
        "fused": [
            {
                "name": "loss",
                "max_abs": {"a": 1e-7, "b": 1e-7},
                "max_rel": {"a": 5e-8, "b": 0.5},
                "ok": {"a": True, "b": True},
            }
        ]
    }
    assert d["criteria"] == [
        {
            "text": "step_time<=1.5x",
            "mode": "fused",
            "passed": {"a": True, "b": False},
            "value": {"a": 0.012, "b": 0.024},
        }
    ]
    # and back: the error disappears, the op comes back
    back = store.diff("20250305", "20250301")
    assert back["errors"]["disappeared"][0]["type"] == "RuntimeError" and back["errors"]["appeared"] == []
    assert back["ops"]["strict"]["removed"] == [{"op": "aten::erf", "placements": {"lowered": 40}}]
    json.dumps(d)  # the --json output

    text = _store.format_diff(d)
    for line in [
        "environment torch: 2.11.0 -> 2.12.0",
        "fused: step 12.00 ms -> 24.00 ms (2.00x)",
        "compiled: status ok -> failed",
        "strict op changed aten::gelu lowered x40 -> cpu_fallback x40",
        "strict op added   aten::erf lowered x40",
        "+ compiled error RuntimeError: Dynamo failed to trace (at train_tiny.py:40 (step))",
        "criterion step_time<=1.5x [fused]: pass -> fail",
    ]:
        assert line in text, text


def test_diff_of_a_record_with_itself(store):
    store.add(sample_record())
    d = store.diff(SAMPLE_ID, SAMPLE_ID)
    assert _store.is_empty(d)
    assert _store.format_diff(d).endswith("no differences")
    assert not _store.is_empty(store.diff(SAMPLE_ID, SAMPLE_ID) | {"verdict": {"a": "pass", "b": "fail"}})


def _main(capsys, *argv) -> tuple[int, str, str]:
    rc = _store.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_main_commands(tmp_path, capsys):
    db = str(tmp_path / "cli.sqlite")
    for record in (sample_record(), failed_record()):
        path = tmp_path / f"{record['id']}.json"
        path.write_text(json.dumps(record))
        assert _main(capsys, "--db", db, "add", str(path)) == (0, f"added {record['id']}\n", "")

    rc, out, _ = _main(capsys, "list", "--db", db)  # --db before or after the command
    assert rc == 0
    assert out.index(FAILED_ID) < out.index(SAMPLE_ID)

    rc, out, _ = _main(capsys, "--db", db, "show", "20250302")
    assert rc == 0
    assert "NotImplementedError" in out and "verdict: ERROR" in out

    html_path = tmp_path / "page.html"
    rc, out, _ = _main(capsys, "--db", db, "show", SAMPLE_ID, "--json", "--html", str(html_path))
    assert rc == 0 and json.loads(out) == sample_record() | {"notes": []}
    assert "<svg" in html_path.read_text()

    assert _main(capsys, "--db", db, "note", "20250301", "works", "with", "bf16") == (0, f"noted on {SAMPLE_ID}\n", "")
    rc, out, _ = _main(capsys, "--db", db, "search", "bf16")
    assert rc == 0 and SAMPLE_ID in out and FAILED_ID not in out and "[bf16]" in out
    rc, out, _ = _main(capsys, "--db", db, "search", "aten::_fft_r2c")
    assert rc == 0 and FAILED_ID in out and SAMPLE_ID not in out

    rc, out, _ = _main(capsys, "--db", db, "diff", SAMPLE_ID, FAILED_ID)
    assert rc == 0 and "compiled: status ok -> failed" in out
    rc, out, _ = _main(capsys, "--db", db, "diff", SAMPLE_ID, FAILED_ID, "--json")
    assert rc == 0 and json.loads(out)["runs"]["compiled"]["status"] == {"a": "ok", "b": "failed"}

    for argv in (["show", "nope"], ["note", "nope", "x"], ["diff", SAMPLE_ID, "nope"]):
        rc, out, err = _main(capsys, "--db", db, *argv)
        assert (rc, out) == (1, ""), argv
        assert "no record with id 'nope'" in err
    rc, _, err = _main(capsys, "--db", db, "show", "2025")
    assert rc == 1 and "several" in err
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    rc, _, err = _main(capsys, "--db", db, "add", str(bad))
    assert rc == 1 and "not JSON" in err


def test_main_uses_the_environment_database(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TORCH_JAX_EVIDENCE_DB", str(tmp_path / "env.sqlite"))
    path = tmp_path / "r.json"
    path.write_text(json.dumps(sample_record()))
    assert _main(capsys, "add", str(path))[0] == 0
    assert (tmp_path / "env.sqlite").exists()
    assert SAMPLE_ID in _main(capsys, "list")[1]


def test_summary():
    text = _summary.summary(sample_record())
    lines = text.splitlines()
    assert lines[0].startswith("examples/train_tiny.py -- --device '{device}' --steps 20 (script)")
    assert "torch 2.11.0  jax 0.10.1  torch_jax 0.1.0  backend cpu (cpu)" in lines[1]
    strict = next(line for line in lines if line.startswith("strict "))
    assert strict.split() == ["strict", "jax", "ok", "18.00", "ms", "1.80x", "1.00e-07", "20", "14"] + [
        "858.3",
        "MiB",
        "114.4",
        "MiB",
    ]
    assert "3 (1 re)" in next(line for line in lines if line.startswith("compiled "))
    assert "FAIL  step_time<=1.5x  strict    0.018" in text
    assert "verdict: FAIL" in text and "scan: 2 CUDA assumptions (cuda-call, cudnn-flag)" in text

    failed = _summary.summary(failed_record())
    assert "compiled   jax     failed  -" in failed
    assert "compiled: NotImplementedError: aten::_fft_r2c" in failed
    assert "at examples/train_tiny.py:31 (forward)" in failed
    assert "criteria" not in failed and "verdict: ERROR" in failed


def test_render():
    record = sample_record()
    run_of(record, "strict")["comparison"][1]["name"] = "grad:<b>fc1</b>"
    page = _html.render(record | {"notes": [{"created": "2025-03-04T00:00:00+00:00", "text": "keep <this>"}]})
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "") and "https://" not in page
    assert "<script" not in page
    for section in ("environment", "command", "runs", "step-time", "errors-chart", "losses", "ops", "compilations"):
        assert f"<section id='{section}'>" in page
    for section in ("criteria", "scan", "diff", "notes"):
        assert f"<section id='{section}'>" in page
    assert page.count("<svg") == 3
    for mode, color in _html.MODE_COLORS.items():
        assert f"fill='{color}'" in page, mode
    assert "<td class='fallback'>cpu_fallback \u00d720</td>" in page
    assert "<td class='fail'>FAIL</td>" in page and "<td class='pass'>PASS</td>" in page
    assert "new input shape (batch 8 -&gt; 5) \u00d71" in page
    assert "<span class='add'>+    model = Tiny().to(device)</span>" in page
    assert "grad:&lt;b&gt;fc1&lt;/b&gt;" in page and "<b>fc1" not in page
    assert "keep &lt;this&gt;" in page
    assert "torch-jax doctor examples/train_tiny.py --accept &#x27;loss_rel&lt;=1e-3&#x27;" in page


def test_render_escapes_and_handles_failed_runs():
    record = failed_record()
    error = run_of(record, "compiled")["error"]
    error["message"] = "<script>alert('x')</script>"
    error["traceback"] += '  File "<stdin>", line 1\n'
    for run in record["runs"]:
        run["comparison"] = []
    page = _html.render(record)
    assert "<script" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "&lt;stdin&gt;" in page
    assert "failed: no step time" in page
    assert "No tensors were compared." in page and "No acceptance criteria were given." in page
    assert "<section id='diff'>" not in page and "<section id='notes'>" not in page
    assert page.count("<svg") == 2  # the step times and the losses

    for run in record["runs"]:
        run.update(step_time=None, losses=[])
    page = _html.render(record)
    assert "No run has step times." in page and "<svg" not in page


def test_write(tmp_path):
    path = tmp_path / "r.html"
    _html.write(sample_record(), path)
    assert path.read_text(encoding="utf-8") == _html.render(sample_record())


def _rgb(color: str) -> tuple[int, int, int]:
    return tuple(int(color[i : i + 2], 16) for i in (1, 3, 5))


@needs_chromium
def test_page_renders_in_a_browser(tmp_path):
    """The page as a browser draws it: not blank, and the charts' bars are there in each
    run's colour (SVG that a browser rejects draws nothing)."""
    page = tmp_path / "record.html"
    _html.write(sample_record(), page)
    _, counts = screenshot(page, tmp_path / "shot.png", 1200, 2400)
    total = 1200 * 2400
    assert total - counts.get((255, 255, 255), 0) > total // 20  # over 5% of the page drawn
    assert len(counts) > 100  # text, tables and charts, not a flat page
    for mode, color in _html.MODE_COLORS.items():
        # a bar of the step-time chart alone is over 20 px tall and 100 px wide
        assert counts.get(_rgb(color), 0) > 2000, f"{mode}'s colour {color} is missing from the screenshot"
    assert counts.get(_rgb("#fee2e2"), 0) > 500  # the fallback cells' background
