"""``python -m torch_jax.report coverage``: the report files, the journal that lets the
every-sample sweep run in pieces, and the claims that share OpInfos between workers."""

from __future__ import annotations

import json

import torch

from torch_jax.report import _coverage

OPS = {"abs", "neg"}


def _lines(journal) -> list[dict]:
    return [json.loads(line) for path in sorted(journal.parent.glob(journal.name + ".*")) for line in open(path)]


def test_journal_skips_recorded_pairs(tmp_path):
    journal = tmp_path / "sweep"
    first = _coverage.run([torch.float32], OPS, max_samples=1, progress=False, journal=str(journal))
    assert sorted(r.op for r in first) == sorted(OPS)
    assert all(r.status == "pass" for r in first)
    assert sorted(r["op"] for r in _lines(journal)) == sorted(OPS)
    again = _coverage.run([torch.float32], OPS, max_samples=1, progress=False, journal=str(journal))
    assert [r.__dict__ for r in again] == [r.__dict__ for r in first]
    assert len(_lines(journal)) == len(OPS)  # taken from the journal, not run (and recorded) again


def test_claimed_opinfos_run_once(tmp_path):
    claims = tmp_path / "claims"
    claims.mkdir()
    assert _coverage._claim(str(claims), "abs")
    first = _coverage.run([torch.float32], OPS, max_samples=1, progress=False, claims=str(claims))
    assert [r.op for r in first] == ["neg"]  # abs was claimed by another worker
    assert _coverage.run([torch.float32], OPS, max_samples=1, progress=False, claims=str(claims)) == []


def test_report_files(tmp_path):
    out = tmp_path / "out"
    assert (
        _coverage.main(["--ops", "abs", "--dtypes", "float32", "--max-samples", "1", "--out", str(out), "--quiet"]) == 0
    )
    data = json.loads((out / "coverage.json").read_text())
    assert [(r["op"], r["dtype"], r["status"]) for r in data["results"]] == [("abs", "float32", "pass")]
    assert "| (OpInfo, dtype) pairs compared | 1 |" in (out / "COVERAGE.md").read_text()


def test_module_section(tmp_path):
    out = tmp_path / "out"
    args = ["--ops", "abs", "--dtypes", "float32", "--max-samples", "1", "--out", str(out), "--quiet"]
    assert _coverage.main([*args, "--modules", "nn.ReLU,nn.Softsign"]) == 0
    text = (out / "COVERAGE.md").read_text()
    assert "| (OpInfo, dtype) pairs compared | 1 |" in text
    assert "| nn.ReLU | ok | ok |" in text and "| nn.Softsign | ok | ok |" in text
    assert "**4 of 4 (ModuleInfo, dtype, mode) cases" in text
    # --modules-only rewrites the module section in place and leaves the rest alone
    assert _coverage.main(["--modules-only", "--modules", "nn.Tanh", "--out", str(out), "--quiet"]) == 0
    again = (out / "COVERAGE.md").read_text()
    assert "| (OpInfo, dtype) pairs compared | 1 |" in again
    assert "| nn.Tanh | ok | ok |" in again and "nn.ReLU" not in again
    assert again.count(_coverage.MODULES_START) == 1
    data = json.loads((out / "coverage.json").read_text())
    assert [(r["op"], r["status"]) for r in data["modules"]] == [("nn.Tanh", "pass")] * 2
    assert [r["op"] for r in data["results"]] == ["abs"]
