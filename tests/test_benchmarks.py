"""The benchmark suite runs end to end (a smoke run: a tenth of the iterations, two
repeats) and writes its table, results and chart. Speed itself is not asserted here:
benchmarks print ratios, tests check behaviour (steady state compiles nothing)."""

from __future__ import annotations

import json

from benchmarks.__main__ import main, update_readme


def test_the_suite_runs_and_writes_its_report(tmp_path):
    variants = ["cpu", "strict", "fused", "compiled"]
    report = main(["--quick", "--only", "add (16", "MLP", "--variants", ",".join(variants), "--out", str(tmp_path)])
    assert set(report["results"]) == {"small op: add (16 floats)", "MLP 784-512-512-10 step, SGD, batch 128"}
    for results in report["results"].values():
        assert set(results) == set(variants)
        for r in results.values():
            assert "error" not in r and r["seconds"] > 0 and r["warmup_seconds"] > 0
    mlp = report["results"]["MLP 784-512-512-10 step, SGD, batch 128"]
    assert all(mlp[v]["compiles_while_timed"] == 0 for v in ("strict", "fused", "compiled"))
    assert mlp["fused"]["ops_per_graph"] > 10  # a whole step per graph
    assert json.loads((tmp_path / "results.json").read_text())["variants"] == variants
    text = (tmp_path / "README.md").read_text()
    assert "| MLP 784-512-512-10 step, SGD, batch 128 |" in text and "torchax" in text
    assert "Build and warm-up" in text
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
    assert "MLP 784-512-512-10 step, SGD, batch 128, compiled:" in text and "fused eager's time (" in text


def test_the_compiled_headline_reads_the_targets():
    from benchmarks.__main__ import compiled_headline

    step = "GPT-2-style step (4 layers)"
    report = {
        "results": {
            step: {
                "cpu": {"seconds": 0.2},
                "inductor": {"seconds": 0.19},
                "fused": {"seconds": 0.15},
                "compiled": {"seconds": 0.09, "compiles_while_timed": 0},
            },
            "small op": {"fused": {"seconds": 1e-5}, "compiled": {"seconds": 2e-5, "compiles_while_timed": 0}},
        }
    }
    lines = compiled_headline(report)
    assert lines[0] == (
        f"- {step}, compiled: 0.45x PyTorch CPU eager's time (target <= 0.5x: met); 0.47x Inductor's time "
        "(faster: target faster); 0.60x fused eager's time (faster: target faster); 0 compilations while timed"
    )
    assert lines[1] == (
        "- small op, compiled: 2.00x fused eager's time (not faster: target faster); 0 compilations while timed"
    )


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
    compiled = report["compiled"]  # (torch.compile's graphs: the same products)
    assert abs(compiled["product_gflop"] - expected) < 1e-6 * expected
    assert compiled["by_kind_ms"][PRODUCTS] > 0 and compiled["kernels"] < strict["kernels"]
    text = (tmp_path / "profile.md").read_text()
    assert "| matrix products |" in text and "at most **" in text and "| torch.compile on jax |" in text


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


def test_the_dispatch_benchmark_runs_and_splits_an_ops_time(tmp_path):
    from benchmarks import dispatch

    report = dispatch.main(["--calls", "50", "--rounds", "1", "--out", str(tmp_path)])
    rows = {r["op"]: r for r in report["rows"]}
    assert set(rows) == set(dispatch._cases())
    for r in rows.values():
        assert all(r[k] > 0 for k in ("cpu", "jax.jit", "strict", "fused"))
    add = rows["add"]  # (one kernel call: its pieces measured alone)
    assert all(add[k] > 0 for k in ("describe + lookup", "executable", "result"))
    assert "dispatch" not in rows["mul_ (in place)"]  # (a write: not repeatable alone)
    assert report["floor"] > 0 and report["median strict / jax.jit"] > 0
    assert "| add |" in (tmp_path / "dispatch.md").read_text()
    assert json.loads((tmp_path / "dispatch.json").read_text())["rows"][0]["op"] == "add"
