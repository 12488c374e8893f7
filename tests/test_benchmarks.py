"""The benchmark suite runs end to end (a smoke run: a tenth of the iterations, two
repeats) and writes its table, results and chart. Speed itself is not asserted here:
benchmarks print ratios, tests check behaviour (steady state compiles nothing)."""

from __future__ import annotations

import json

from benchmarks.__main__ import main, update_readme


def test_the_suite_runs_and_writes_its_report(tmp_path):
    report = main(["--quick", "--only", "add (16", "MLP", "--variants", "cpu,strict,fused", "--out", str(tmp_path)])
    assert set(report["results"]) == {"small op: add (16 floats)", "MLP 784-512-512-10 step, SGD, batch 128"}
    for results in report["results"].values():
        assert set(results) == {"cpu", "strict", "fused"}
        for r in results.values():
            assert "error" not in r and r["seconds"] > 0
    mlp = report["results"]["MLP 784-512-512-10 step, SGD, batch 128"]
    assert mlp["strict"]["compiles_while_timed"] == 0 and mlp["fused"]["compiles_while_timed"] == 0
    assert mlp["fused"]["ops_per_graph"] > 10  # a whole step per graph
    assert json.loads((tmp_path / "results.json").read_text())["variants"] == ["cpu", "strict", "fused"]
    text = (tmp_path / "README.md").read_text()
    assert "| MLP 784-512-512-10 step, SGD, batch 128 |" in text and "torchax" in text
    assert (tmp_path / "chart.png").read_bytes()[:4] == b"\x89PNG"
    readme = tmp_path / "README.md.in"
    readme.write_text("before\n<!-- benchmarks:start -->\nold\n<!-- benchmarks:end -->\nafter\n")
    update_readme(report, str(readme))
    text = readme.read_text()
    assert text.startswith("before\n<!-- benchmarks:start -->\nLast run:") and text.endswith(
        "<!-- benchmarks:end -->\nafter\n"
    )
    assert "old" not in text and "| MLP 784-512-512-10 step, SGD, batch 128 |" in text
    assert "fused takes" in text and "(target <= 1x:" in text
