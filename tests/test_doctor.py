"""``torch-jax doctor``: real workloads from examples/ run on the CPU and on jax, and the
record says what ran where, how close it came, what it cost, what failed and why, and
whether the user's criteria held (the schema: src/torch_jax/doctor/record.schema.json)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import jsonschema
import pytest

from torch_jax.doctor import _cli, _criteria, _doctor, _store, schema

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")


def _record(tmp_path, *argv, quiet=True):
    """``torch-jax doctor`` in this process (each run is its own process anyway): the exit
    status and the record, checked against the schema."""
    out = tmp_path / "out"
    own = ["--out", str(out), "--db", str(tmp_path / "db.sqlite")] + (["--quiet"] if quiet else [])
    status = _cli.main(["doctor", *argv[:1], *own, *argv[1:]])
    with open(out / "record.json") as f:
        record = json.load(f)
    jsonschema.Draft202012Validator(schema()).validate(record)
    assert (out / "report.html").stat().st_size > 2000
    return status, record


def _run(record, mode):
    return next(r for r in record["runs"] if r["mode"] == mode)


def _placements(run) -> dict:
    out = {}
    for row in run["ops"]:
        out.setdefault(row["placement"], {})[row["op"]] = row["count"]
    return out


def test_training_script_in_every_mode(tmp_path):
    status, record = _record(
        tmp_path,
        os.path.join(EXAMPLES, "train_cnn.py"),
        "--accept",
        "loss_rel<=1e-4,grad_rel<=1e-4,param_rel<=1e-4,fallbacks==0,compiled:recompiles==0",
        "--",
        "--steps",
        "5",
        "--device",
        "{device}",
    )
    assert [(r["mode"], r["device"], r["status"]) for r in record["runs"]] == [
        ("reference", "cpu", "ok"),
        ("strict", "jax", "ok"),
        ("fused", "jax", "ok"),
        ("compiled", "jax", "ok"),
    ]
    assert record["verdict"] == "pass" and status == 0, record["criteria"]
    assert {c["mode"] for c in record["criteria"]} == {"strict", "fused", "compiled"}
    reference = _run(record, "reference")
    assert reference["steps"] == 5 and len(reference["losses"]) == 5 and reference["ops"] == []
    for mode in ("strict", "fused", "compiled"):
        run = _run(record, mode)
        assert run["steps"] == 5 and run["step_time"]["n"] == 3  # (5 steps, 2 of warm-up)
        assert run["peak_memory"]["host_rss_bytes"] > 100 * 2**20
        names = {c["name"] for c in run["comparison"]}
        assert {"loss", "grad:features.0.weight", "grad:head.bias", "param:head.weight"} <= names
        assert all(c["ok"] for c in run["comparison"])
        placements = _placements(run)
        assert "cpu_fallback" not in placements and run["fallbacks"] == 0
        assert run["compilations"]["count"] > 0
    assert _placements(_run(record, "strict"))["lowered"]["aten::convolution_overrideable"] == 2 * (
        5 + 1
    )  # (2 layers; + the test batch)
    compiled = _placements(_run(record, "compiled"))
    assert "aten::convolution_backward" in compiled["compiled"]  # the model's graphs went to XLA
    assert _run(record, "compiled")["compilations"]["reasons"]
    env = record["environment"]
    assert env["jax_backend"] == "cpu" and env["torch"].startswith("2.") and env["jax_devices"]
    assert record["command"][:3] == ["torch-jax", "doctor", os.path.join(EXAMPLES, "train_cnn.py")]
    assert [f["kind"] for f in record["scan"]] == ["pin-memory"]  # (train_cnn pins its loader's batches)
    assert record["diff"]["repo"] and record["diff"]["base"] == "HEAD"
    with _store.Store(str(tmp_path / "db.sqlite")) as store:
        assert store.get(record["id"])["verdict"] == "pass"


def test_cpu_fallback_is_counted_and_fails_its_criterion(tmp_path):
    status, record = _record(
        tmp_path,
        os.path.join(EXAMPLES, "migration", "kernel_ridge.py"),
        "--modes",
        "strict",
        "--accept",
        "output_rel<=1e-9,fallbacks==0",
        "--",
        "--batches",
        "3",
    )
    strict = _run(record, "strict")
    assert strict["status"] == "ok" and strict["device"] == "jax"
    fallen = _placements(strict)["cpu_fallback"]
    assert fallen["aten::linalg_ldl_factor_ex.out"] == 3 and fallen["aten::linalg_ldl_solve.out"] == 3
    assert strict["fallbacks"] == 6 and strict["steps"] == 3  # (a model without an optimizer: its calls)
    [output] = strict["comparison"]
    assert output["name"] == "output:0" and output["shape"] == [32, 1] and output["max_rel"] < 1e-9
    rows = {c["metric"]: c for c in record["criteria"]}
    assert rows["output_rel"]["passed"] and not rows["fallbacks"]["passed"] and rows["fallbacks"]["value"] == 6
    assert record["verdict"] == "fail" and status == 1


def test_failing_workload_says_where_and_the_scan_says_why(tmp_path):
    status, record = _record(tmp_path, os.path.join(EXAMPLES, "migration", "cuda_only.py"), "--modes", "strict,fused")
    reference, strict, fused = record["runs"]
    assert reference["status"] == "ok" and reference["steps"] == 20
    for run in (strict, fused):
        assert run["status"] == "failed" and run["comparison"] == []
        assert run["error"]["type"] == "AssertionError" and "CUDA" in run["error"]["message"]
        assert run["error"]["where"].startswith(os.path.join(EXAMPLES, "migration", "cuda_only.py") + ":")
        assert "model.cuda()" in run["error"]["traceback"] or ".cuda()" in run["error"]["traceback"]
    assert record["verdict"] == "error" and status == 1
    kinds = {f["kind"] for f in record["scan"]}
    assert {"cuda-call", "torch-cuda-api", "cudnn-flag"} <= kinds
    assert any("torch.accelerator" in f["rewrite"] for f in record["scan"] if f["kind"] == "cuda-call")


def test_rerun_and_the_migration_diff(tmp_path):
    """A script in its own git repository: the doctor keeps the change made for the
    migration, and ``rerun`` repeats the record's run."""
    repo = tmp_path / "repo"
    repo.mkdir()
    script = repo / "train.py"
    with open(os.path.join(EXAMPLES, "migration", "cuda_only.py")) as f:
        script.write_text(f.read())

    def git(*args):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)

    git("init", "-q")
    git("-c", "user.email=t@t", "-c", "user.name=t", "add", "train.py")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "the CUDA version")
    # the migration: torch.accelerator instead of CUDA's calls
    text = script.read_text()
    text = text.replace(
        "model, x, y = model.cuda(), x.cuda(), y.cuda()",
        "device = torch.accelerator.current_accelerator()\n        model, x, y = model.to(device), x.to(device), y.to(device)",
    )
    text = text.replace("torch.cuda.synchronize()", "torch.accelerator.synchronize()")
    script.write_text(text)
    status, record = _record(tmp_path, str(script), "--modes", "strict", "--accept", "loss_rel<=1e-4")
    assert record["verdict"] == "pass" and status == 0, record["runs"][1]["error"]
    assert record["diff"]["files"] == ["train.py"] and "+        device = torch.accelerator" in record["diff"]["text"]
    assert record["diff"]["repo"] == str(repo)
    assert [f["kind"] for f in record["scan"]] == ["cudnn-flag"]  # (the flag is harmless and stays)

    db = str(tmp_path / "db.sqlite")
    assert _cli.main(["rerun", record["id"][:20], "--db", db, "--out", str(tmp_path / "again")]) == 0
    with _store.Store(db) as store:
        rows = store.list()
        assert len(rows) == 2 and store.get(rows[0]["id"])["command"] == record["command"]
        assert [r["id"] for r in store.search("cudnn")] and store.search("train")


def test_entry_point_timeout_and_a_dying_process(tmp_path, monkeypatch, capfd):
    """``module:function`` targets; a run that hangs or whose process dies still has a row."""
    (tmp_path / "doctor_entry.py").write_text(
        "import os, time, torch\n"
        "def model():\n"
        "    torch.manual_seed(0)\n"
        "    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))\n"
        "    return net, torch.randn(4, 8)\n"
        "def dies():\n"
        "    os.kill(os.getpid(), 9)\n"
        "def hangs():\n"
        "    time.sleep(60)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    status, record = _record(
        tmp_path, "doctor_entry:model", "--modes", "strict,compiled", "--steps", "4", "--accept", "output_rel<=1e-5"
    )
    assert record["target"]["kind"] == "entry" and record["config"]["steps"] == 4
    for run in record["runs"]:
        assert run["status"] == "ok" and run["steps"] == 4, run["error"]
    assert {c["name"] for c in _run(record, "compiled")["comparison"]} == {"output:0"}
    assert record["verdict"] == "pass" and status == 0

    status, record = _record(tmp_path, "doctor_entry:dies", "--modes", "strict")
    assert [r["status"] for r in record["runs"]] == ["failed", "failed"] and status == 1
    assert record["runs"][1]["error"]["type"] == "ProcessDied" and record["runs"][1]["returncode"] == -9

    monkeypatch.setattr(_doctor, "PROGRESS_EVERY_S", 1.0)
    status, record = _record(tmp_path, "doctor_entry:hangs", "--modes", "strict", "--timeout", "4", quiet=False)
    assert [r["status"] for r in record["runs"]] == ["timeout", "timeout"] and record["verdict"] == "error"
    assert record["runs"][0]["error"]["type"] == "Timeout" and record["runs"][0]["returncode"] is None
    lines = capfd.readouterr().err.splitlines()
    assert "[doctor] reference on cpu: running" in lines
    # (the time the run took: 4 s and up to the next check, a second later, and a loaded machine's delay)
    assert any(re.fullmatch(r"\[doctor\] strict on jax: timeout in [4-6]\.\d s, 0 steps", line) for line in lines), (
        lines
    )
    assert "[doctor] strict on jax: 2 s, 0 steps" in lines  # (a line while it runs)


def test_acceptance_criteria():
    parsed = _criteria.parse(["loss_rel<=1e-3, step_time<=1.2x", "fused:fallbacks==0"])
    assert [(c.mode, c.metric, c.op, c.threshold, c.relative) for c in parsed] == [
        (None, "loss_rel", "<=", 1e-3, False),
        (None, "step_time", "<=", 1.2, True),
        ("fused", "fallbacks", "==", 0.0, False),
    ]
    with pytest.raises(ValueError, match="unknown metric 'loss'"):
        _criteria.parse(["loss<=1"])
    with pytest.raises(ValueError, match="expected"):
        _criteria.parse(["loss_rel about 1"])

    def run(mode, median, fallbacks, status="ok"):
        step = {"median_s": median, "min_s": median, "max_s": median, "iqr_s": 0.0, "n": 3}
        return {"mode": mode, "status": status, "step_time": step, "fallbacks": fallbacks, "comparison": []}

    runs = [
        run("reference", 0.010, 0),
        run("strict", 0.011, 0),
        run("fused", 0.013, 2),
        run("compiled", 0, 0, "failed"),
    ]
    rows, verdict = _criteria.check(parsed, runs)
    got = [(r["mode"], r["metric"], r["passed"]) for r in rows]
    assert got == [
        ("strict", "loss_rel", False),  # (nothing compared: no value)
        ("fused", "loss_rel", False),
        ("compiled", "loss_rel", False),
        ("strict", "step_time", True),
        ("fused", "step_time", False),
        ("compiled", "step_time", False),  # (a failed run fails every criterion)
        ("fused", "fallbacks", False),
    ]
    assert rows[3]["threshold"] == pytest.approx(0.012) and rows[3]["reference"] == 0.010
    assert verdict == "fail"
    assert _criteria.check([], runs) == ([], "error")
    assert _criteria.check([], runs[:3]) == ([], "none")


def test_console_script_and_module_entry(tmp_path):
    """``python -m torch_jax`` is the ``torch-jax`` command (pyproject's console script)."""
    out = subprocess.run(
        [sys.executable, "-m", "torch_jax", "scan", os.path.join(EXAMPLES, "migration")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "cuda_only.py" in out.stdout and "cuda-call" in out.stdout
    out = subprocess.run([sys.executable, "-m", "torch_jax", "--help"], capture_output=True, text=True, check=True)
    assert "doctor" in out.stdout and "evidence" in out.stdout
