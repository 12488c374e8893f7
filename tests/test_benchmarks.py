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


def test_the_profile_counts_the_products_and_splits_the_kernel_time(tmp_path):
    """benchmarks/profile.py on the MLP step (784-512-512-10, batch 128): its products do
    2 * 128 * (784*512 + 512*512 + 512*10) operations forward, as many for the weight
    gradients, and 2 * 128 * (512*512 + 512*10) for the input gradients of the two upper
    layers (the input needs none)."""
    from benchmarks.profile import PRODUCTS, main

    report = main(["--only", "MLP", "--quick", "--out", str(tmp_path)])
    fused, strict = report["fused"], report["strict"]
    expected = (2 * 2 * 128 * (784 * 512 + 512 * 512 + 512 * 10) + 2 * 128 * (512 * 512 + 512 * 10)) / 1e9
    assert abs(fused["product_gflop"] - expected) < 1e-6 * expected
    assert fused["ops"] == strict["ops"] > 10  # (the same program's ops, recorded or run)
    assert fused["kernels"] < strict["kernels"]  # (fused: one graph's kernels, fewer)
    kinds = fused["by_kind_ms"]
    assert kinds[PRODUCTS] > 0 and 0 < sum(kinds.values()) <= fused["busy_ms"] * 1.001
    text = (tmp_path / "profile.md").read_text()
    assert "| matrix products |" in text and "at most **" in text


def test_the_changing_shapes_benchmark_runs_each_variant_in_its_own_process(tmp_path):
    """benchmarks/shapes.py: the changing-length training loop on 10 lengths, the CPU and
    fused eager each in a fresh process; the same losses, one warning (the uploads that
    go into buckets)."""
    from benchmarks.shapes import main

    report = main(["--only", "training", "--lengths", "10", "--variants", "cpu,fused", "--out", str(tmp_path)])
    (results,) = report["results"].values()
    cpu, fused = results["cpu"], results["fused"]
    assert "error" not in cpu and "error" not in fused, results
    assert len(fused["result"]) == len(cpu["result"]) == 10
    assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(fused["result"], cpu["result"]))
    assert fused["vs_cpu"].startswith("losses within") and fused["ratio"] > 0
    assert fused["recompile_warnings"] == 1
    # (a graph for each of the first 3 lengths, then the ids are uploaded into a bucket:
    # a graph or two for it, not one a length)
    assert fused["stats"]["bucketed_ops"] > 0
    assert fused["stats"]["graphs_compiled"] + fused["stats"]["graphs_op_by_op"] < 10
    assert fused["peak_mappings"] > 0 and cpu["peak_rss_mb"] > 0 and fused["peak_rss_mb"] > 0
    text = (tmp_path / "shapes.md").read_text()
    assert "| changing-length training loop (lengths 1..10, scrambled) | jax fused eager |" in text
    assert json.loads((tmp_path / "shapes.json").read_text())["results"]


def test_ratios_are_against_the_first_variant_and_device_peaks_get_a_table():
    """A GPU run (benchmarks/accelerator_check.sh): PyTorch CUDA eager is the baseline, and the
    devices' peak memory is reported where a variant measured it."""
    from benchmarks.__main__ import markdown

    report = {
        "variants": ["cuda", "cuda_inductor", "fused"],
        "results": {
            "w": {
                "cuda": {"seconds": 2e-3, "peak_mb": 10.0, "device_peak_mb": 300.0},
                "cuda_inductor": {"error": "RuntimeError: no"},
                "fused": {"seconds": 1e-3, "peak_mb": 20.0, "device_peak_mb": 200.0},
            }
        },
    }
    text = markdown(report)
    assert "| w | 2.00 ms (1.00x) | error | 1.00 ms (0.50x) |" in text
    assert "| PyTorch CUDA eager | torch.compile (Inductor, CUDA) | jax fused eager |" in text
    assert "| w | 300 | - | 200 |" in text.split("Peak device memory")[1]
    report["results"]["w"]["cuda"].pop("device_peak_mb")
    report["results"]["w"]["fused"].pop("device_peak_mb")
    assert "Peak device memory" not in markdown(report)  # (no device measured it: a CPU run)
