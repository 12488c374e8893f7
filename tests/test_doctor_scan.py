"""``torch-jax scan``: the CUDA assumptions found in Python sources, one table of cases per
kind (the lines found and the rewrite offered), what is left alone, the directory walk and
the command line."""

from __future__ import annotations

import collections
import json
import pathlib
import textwrap

import pytest

from torch_jax.doctor import _scan

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTE = "  # device = torch.accelerator.current_accelerator()"
ACC = "torch.accelerator.current_accelerator()"


def scan_source(tmp_path, source: str, name: str = "w.py") -> list[_scan.Finding]:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source).lstrip("\n"))
    return _scan.scan(path)


def found(findings) -> list[tuple[int, str]]:
    return [(f.line, f.kind) for f in findings]


# kind -> (source, the lines of its findings: every finding, all of that kind)
CASES = {
    "cuda-call": (
        """
        import torch
        model = torch.nn.Linear(2, 2).cuda()
        x = torch.ones(2).cuda(0)
        y = x.cuda(non_blocking=True)
        z = x.to("cpu")
        """,
        [2, 3, 4],
    ),
    "cuda-device-string": (
        """
        import argparse
        import torch
        device = torch.device("cuda")
        x = torch.zeros(2, device="cuda:1")
        x = x.to("cuda")
        if x.device.type == "cuda":
            pass
        def f(t, device="cuda"):
            return t
        print("cuda")
        name = "cuda"
        parser = argparse.ArgumentParser()
        parser.add_argument("--device", default="cuda")
        with torch.autocast("cuda"):
            pass
        y = torch.device(f"cuda:{rank}")
        if x.is_cuda:
            pass
        """,
        [3, 4, 5, 6, 8, 13, 14, 16, 17],
    ),
    "torch-cuda-api": (
        """
        import torch
        from torch.cuda.amp import GradScaler, autocast
        from torch import cuda
        if torch.cuda.is_available():
            n = torch.cuda.device_count()
        torch.cuda.synchronize()
        torch.cuda.manual_seed_all(0)
        torch.cuda.set_device(1)
        print(torch.cuda.get_device_name(0))
        with torch.cuda.amp.autocast(dtype=torch.bfloat16):
            pass
        scaler = GradScaler()
        cuda.empty_cache()
        peak = torch.cuda.max_memory_allocated() / 2**30
        """,
        [2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 13, 14],
    ),
    "cudnn-flag": (
        """
        import torch
        from torch.backends import cudnn
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.deterministic = True
        torch.backends.cuda.matmul.allow_tf32 = True
        cudnn.allow_tf32 = False
        with torch.backends.cuda.sdp_kernel(enable_flash=False):
            pass
        """,
        [3, 4, 5, 6, 7],
    ),
    "nccl": (
        """
        import torch.distributed as dist
        dist.init_process_group(backend="nccl", init_method="env://")
        dist.init_process_group("nccl")
        backend = dist.Backend.NCCL
        dist.init_process_group(backend="gloo")
        print("nccl")
        """,
        [2, 3, 4],
    ),
    "cuda-extension": (
        """
        from torch.utils.cpp_extension import CUDAExtension, load, load_inline
        ext = CUDAExtension("k", ["k.cpp", "k.cu"])
        mod = load(name="k", sources=["k.cpp", "k_kernel.cu"])
        cpu = load(name="c", sources=["c.cpp"])
        inl = load_inline(name="i", cpp_sources="", cuda_sources="__global__ void f() {}")
        """,
        [1, 2, 3, 5],
    ),
    "triton-kernel": (
        """
        import triton
        import triton.language as tl

        @triton.autotune(configs=[], key=["n"])
        @triton.jit
        def add_kernel(x_ptr, n):
            tl.load(x_ptr)
        """,
        [1, 2, 4, 5],
    ),
    "pin-memory": (
        """
        import torch
        loader = torch.utils.data.DataLoader([], pin_memory=True)
        other = torch.utils.data.DataLoader([], pin_memory=False)
        x = torch.ones(2).pin_memory()
        """,
        [2, 4],
    ),
    "cuda-env": (
        """
        import os
        import subprocess
        os.environ["CUDA_VISIBLE_DEVICES"] = "0"
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        if "CUDA_VISIBLE_DEVICES" in os.environ:
            pass
        subprocess.run(["python"], env={**os.environ, "CUDA_VISIBLE_DEVICES": "1"})
        print("set CUDA_VISIBLE_DEVICES to choose a GPU")
        names = {"CUDA_VISIBLE_DEVICES": 1}
        """,
        [3, 4, 5, 7],
    ),
}


@pytest.mark.parametrize("kind", CASES)
def test_each_kind_finds_its_lines(tmp_path, kind):
    source, lines = CASES[kind]
    assert found(scan_source(tmp_path, source)) == [(line, kind) for line in lines]


# (source, kind, the rewrite offered for its first finding of that kind)
REWRITES = [
    ("m = torch.nn.Linear(2, 2).cuda()", "cuda-call", "torch.nn.Linear(2, 2).to(device)" + NOTE),
    ("x = torch.ones(2).cuda(0)", "cuda-call", "torch.ones(2).to(torch.device(device.type, 0))" + NOTE),
    ("y = x.cuda(non_blocking=True)", "cuda-call", "x.to(device, non_blocking=True)" + NOTE),
    ('d = torch.device("cuda")', "cuda-device-string", ACC),
    ('d = torch.device("cuda", 1)', "cuda-device-string", f"torch.device({ACC}.type, 1)"),
    ('x = torch.zeros(2, device="cuda:1")', "cuda-device-string", f"device=torch.device({ACC}.type, 1)"),
    ('x = x.to("cuda")', "cuda-device-string", f"x.to({ACC})"),
    ('x = x.to(f"cuda:{rank}")', "cuda-device-string", f"x.to(torch.device({ACC}.type, rank))"),
    ('ok = x.device.type == "cuda"', "cuda-device-string", 'x.device.type != "cpu"'),
    ('ok = str(device) != "cuda"', "cuda-device-string", 'torch.device(device).type == "cpu"'),
    ('def f(t, device="cuda"): pass', "cuda-device-string", f"device=None, and in the body: device = device or {ACC}"),
    ('DEVICE = "cuda:0"', "cuda-device-string", f"DEVICE = torch.device({ACC}.type, 0)"),
    ('p.add_argument("--device", default="cuda")', "cuda-device-string", f"default=str({ACC})"),
    ('torch.autocast("cuda")', "cuda-device-string", f"torch.autocast({ACC}.type)"),
    ('torch.autocast(device_type="cuda")', "cuda-device-string", f"device_type={ACC}.type"),
    ('s = torch.load("f.pt", map_location="cuda")', "cuda-device-string", f"map_location={ACC}"),
    ("ok = x.is_cuda", "cuda-device-string", 'x.device.type != "cpu"'),
    ('device = "cuda:" + str(rank)', "cuda-device-string", f"device = torch.device({ACC}.type, rank)"),
    ('x = x.to("cuda:{}".format(rank))', "cuda-device-string", f"x.to(torch.device({ACC}.type, rank))"),
    ('config = {"device": "cuda"}', "cuda-device-string", f"'device': {ACC}"),
    ('def get_device(): return "cuda"', "cuda-device-string", f"return {ACC}"),
    ('ok = "cuda" in str(x.device)', "cuda-device-string", 'torch.device(x.device).type != "cpu"'),
    ('ok = device.type not in ["cuda", "cpu"]', "cuda-device-string", f"device.type not in [{ACC}.type, 'cpu']"),
    ('ok = "cuda" in device_types', "cuda-device-string", f"{ACC}.type in device_types"),
    (
        'device = torch.device("cuda" if torch.cuda.is_available() else "cpu")',
        "cuda-device-string",
        "torch.accelerator.current_accelerator(check_available=True) or torch.device('cpu')",
    ),
    ("torch.cuda.is_available()", "torch-cuda-api", "torch.accelerator.is_available()"),
    ("torch.cuda.device_count()", "torch-cuda-api", "torch.accelerator.device_count()"),
    ("torch.cuda.synchronize()", "torch-cuda-api", "torch.accelerator.synchronize()"),
    ("torch.cuda.current_device()", "torch-cuda-api", "torch.accelerator.current_device_index()"),
    ("torch.cuda.set_device(rank)", "torch-cuda-api", "torch.accelerator.set_device_index(rank)"),
    ("torch.cuda.manual_seed(0)", "torch-cuda-api", "torch.manual_seed(0)"),
    ("torch.cuda.manual_seed_all(0)", "torch-cuda-api", "torch.manual_seed(0)"),
    ("torch.cuda.empty_cache()", "torch-cuda-api", "torch.accelerator.empty_cache()"),
    ("torch.cuda.memory_allocated()", "torch-cuda-api", "torch.accelerator.memory_allocated()"),
    ("torch.cuda.max_memory_allocated()", "torch-cuda-api", "torch.accelerator.max_memory_allocated()"),
    ("torch.cuda.reset_peak_memory_stats()", "torch-cuda-api", "torch.accelerator.reset_peak_memory_stats()"),
    ("s = torch.cuda.Stream()", "torch-cuda-api", "torch.Stream()"),
    ("e = torch.cuda.Event(True)", "torch-cuda-api", "torch.Event(enable_timing=True)"),
    ("torch.cuda.get_device_name(0)", "torch-cuda-api", _scan.GUARD),
    (
        "with torch.cuda.amp.autocast(dtype=torch.bfloat16): pass",
        "torch-cuda-api",
        "torch.amp.autocast(device.type, dtype=torch.bfloat16)" + NOTE,
    ),
    ("s = torch.cuda.amp.GradScaler()", "torch-cuda-api", "torch.amp.GradScaler(device.type)" + NOTE),
    (
        "from torch.cuda.amp import autocast, GradScaler",
        "torch-cuda-api",
        "from torch.amp import autocast, GradScaler  (these take the device type: autocast(device.type), "
        "GradScaler(device.type))",
    ),
    ("torch.backends.cudnn.deterministic = True", "cudnn-flag", "torch.use_deterministic_algorithms(True)"),
    ("torch.backends.cuda.matmul.allow_tf32 = True", "cudnn-flag", 'torch.set_float32_matmul_precision("high")'),
    ("torch.backends.cudnn.allow_tf32 = False", "cudnn-flag", 'torch.set_float32_matmul_precision("highest")'),
    ("tf32 = torch.backends.cudnn.allow_tf32", "cudnn-flag", 'torch.get_float32_matmul_precision() != "highest"'),
    ("torch.backends.cudnn.enabled = False", "cudnn-flag", _scan.BACKEND_FLAG),
    (
        'dist.init_process_group(backend="nccl", init_method="env://")',
        "nccl",
        "dist.init_process_group(init_method='env://')  (or backend=torch.distributed.get_default_backend_for_device("
        "device))" + NOTE,
    ),
    ('ok = "nccl" in backend', "nccl", "torch.distributed.get_default_backend_for_device(device) in backend" + NOTE),
    ("b = dist.Backend.NCCL", "nccl", "torch.distributed.get_default_backend_for_device(device)" + NOTE),
    (
        "loader = DataLoader(ds, pin_memory=True)",
        "pin-memory",
        "pin_memory=torch.accelerator.is_available(), or leave it off",
    ),
    ("y = x.pin_memory()", "pin-memory", "x.pin_memory() if torch.accelerator.is_available() else x"),
    ('os.environ["CUDA_VISIBLE_DEVICES"] = "0"', "cuda-env", _scan.CUDA_ENV["CUDA_VISIBLE_DEVICES"]),
    ('os.environ.update(CUDA_LAUNCH_BLOCKING="1")', "cuda-env", _scan.CUDA_ENV["CUDA_LAUNCH_BLOCKING"]),
    (
        "import triton",
        "triton-kernel",
        "Triton kernels run only on the GPUs Triton targets; on a jax device write "
        "the kernel with torch ops, or as a JAX/Pallas kernel for the jax device",
    ),
]


@pytest.mark.parametrize("source,kind,rewrite", REWRITES, ids=[r[0] for r in REWRITES])
def test_rewrites_are_concrete_for_the_line(tmp_path, source, kind, rewrite):
    header = "import torch\nimport torch.distributed as dist\n"
    findings = [f for f in scan_source(tmp_path, header + source) if f.kind == kind]
    assert findings, f"no {kind} finding"
    assert findings[0].rewrite == rewrite
    assert findings[0].line == 3 and findings[0].code == source.strip()


def test_messages_say_what_assumes_cuda(tmp_path):
    findings = scan_source(
        tmp_path, "import torch\nx.cuda()\ntorch.cuda.synchronize()\nl = DataLoader(d, pin_memory=True)\n"
    )
    assert [f.message for f in findings] == [
        "`.cuda()` moves to a CUDA device",
        "`torch.cuda.synchronize` works on CUDA only",
        "`pin_memory=True` assumes a CUDA host allocator (the jax device accepts it)",
    ]


def test_comments_docstrings_and_other_strings_are_left_alone(tmp_path):
    source = '''
        """Runs x.cuda() and torch.cuda.is_available() on "cuda" with NCCL."""
        import torch

        def f(x, node):
            """Call x.cuda() first; see torch.backends.cudnn.benchmark and CUDA_VISIBLE_DEVICES."""
            # x = x.cuda(); torch.cuda.synchronize(); os.environ["CUDA_VISIBLE_DEVICES"] = "0"
            print("moving to cuda", "cuda", "nccl")
            label = "cuda"
            kinds = {"cuda": 1}
            if node.attr == "cuda":
                pass
            return f"cuda is {x}"
        '''
    assert scan_source(tmp_path, source) == []


def test_one_finding_per_line_column_and_kind(tmp_path):
    # (the chained calls start at the same column; the two statements do not)
    findings = scan_source(tmp_path, "y = x.cuda().cuda()\na.cuda(); b.cuda()\n")
    assert [(f.line, f.col, f.kind) for f in findings] == [
        (1, 4, "cuda-call"),
        (2, 0, "cuda-call"),
        (2, 10, "cuda-call"),
    ]


def test_imports_resolve_aliases(tmp_path):
    source = """
        import torch as th
        from torch import cuda as c
        import os as system
        th.cuda.synchronize()
        c.is_available()
        system.environ["CUDA_VISIBLE_DEVICES"] = "1"
        th.backends.cudnn.benchmark = True
        """
    assert found(scan_source(tmp_path, source)) == [
        (2, "torch-cuda-api"),
        (4, "torch-cuda-api"),
        (5, "torch-cuda-api"),
        (6, "cuda-env"),
        (7, "cudnn-flag"),
    ]


def test_directory_walk_skips_environments_and_finds_cuda_sources(tmp_path):
    (tmp_path / "a.py").write_text("x.cuda()\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "b.py").write_text("import torch\ntorch.cuda.synchronize()\n")
    (tmp_path / "pkg" / "kernel.cu").write_text("__global__ void f() {}\n")
    (tmp_path / "pkg" / "kernel.cuh").write_text("#pragma once\n")
    (tmp_path / "notes.txt").write_text("x.cuda()\n")
    skipped = [".git", ".venv", ".venv-cpu", "venv", "__pycache__", "build", "dist", "node_modules", "site-packages"]
    for name in skipped:
        (tmp_path / name / "lib").mkdir(parents=True)
        (tmp_path / name / "lib" / "c.py").write_text("x.cuda()\n")
        (tmp_path / name / "k.cu").write_text("\n")
    findings = _scan.scan(tmp_path)
    assert [(f.path, f.line, f.kind) for f in findings] == [
        ("a.py", 1, "cuda-call"),
        ("pkg/b.py", 2, "torch-cuda-api"),
        ("pkg/kernel.cu", 1, "cuda-extension"),
        ("pkg/kernel.cuh", 1, "cuda-extension"),
    ]
    assert findings[2].code == ""
    # a file given directly keeps its path as given
    assert [f.path for f in _scan.scan(tmp_path / "a.py")] == [str(tmp_path / "a.py")]


def test_a_file_that_does_not_parse_is_one_finding(tmp_path):
    (tmp_path / "bad.py").write_text("import torch\ndef f(:\n    pass\n")
    (tmp_path / "good.py").write_text("x.cuda()\n")
    (tmp_path / "nul.py").write_bytes(b"x = 1\x00\n")
    findings = _scan.scan(tmp_path)
    assert [(f.path, f.line, f.kind) for f in findings] == [
        ("bad.py", 2, "syntax-error"),
        ("good.py", 1, "cuda-call"),
        ("nul.py", 1, "syntax-error"),
    ]
    assert findings[0].message.startswith("SyntaxError: ") and findings[0].code == "def f(:"


def test_a_file_that_cannot_be_read_is_one_finding(tmp_path):
    (tmp_path / "gone.py").symlink_to(tmp_path / "missing.py")
    (tmp_path / "good.py").write_text("x.cuda()\n")
    findings = _scan.scan(tmp_path)
    assert [(f.path, f.line, f.kind) for f in findings] == [("gone.py", 1, "unreadable"), ("good.py", 1, "cuda-call")]
    assert findings[0].message.startswith("FileNotFoundError: ")


def test_undecodable_bytes_are_replaced_not_fatal(tmp_path):
    (tmp_path / "latin.py").write_bytes(b"# caf\xe9\nname = 'caf\xe9'\ny = z.cuda()\n")
    assert found(_scan.scan(tmp_path / "latin.py")) == [(3, "cuda-call")]


def test_format_findings(tmp_path):
    findings = scan_source(tmp_path, "import torch\nx = x.cuda()\ntorch.cuda.synchronize()\n")
    text = _scan.format_findings(findings)
    path = str(tmp_path / "w.py")
    assert f"{path}:2:5: cuda-call: `.cuda()` moves to a CUDA device\n    x = x.cuda()\n    -> x.to(device)" in text
    assert f"{path}:3:1: torch-cuda-api:" in text
    summary = text.split("\n\n")[-1].splitlines()
    assert summary[0] == "2 CUDA assumptions in 1 file:"
    assert [line.split()[:2] for line in summary[1:]] == [["cuda-call", "1"], ["torch-cuda-api", "1"]]
    assert _scan.format_findings([]) == "no CUDA assumptions found"


def test_format_findings_puts_the_root_before_relative_paths(tmp_path):
    (tmp_path / "a.py").write_text("x.cuda()\n")
    text = _scan.format_findings(_scan.scan(tmp_path), root=tmp_path)
    assert text.startswith(f"{tmp_path / 'a.py'}:1:1: cuda-call:")


def test_main_prints_json_records(tmp_path, capsys):
    (tmp_path / "a.py").write_text("import torch\nx.cuda()\ntorch.backends.cudnn.benchmark = True\n")
    assert _scan.main([str(tmp_path), "--json"]) == 0  # a report: findings are no failure
    records = json.loads(capsys.readouterr().out)
    assert [(r["path"], r["line"], r["col"], r["kind"]) for r in records] == [
        ("a.py", 2, 0, "cuda-call"),
        ("a.py", 3, 0, "cudnn-flag"),
    ]
    keys = ("path", "line", "col", "kind", "code", "message", "rewrite")
    assert all(tuple(r) == keys for r in records)
    schema = json.loads((ROOT / "src" / "torch_jax" / "doctor" / "record.schema.json").read_text())
    assert set(schema["$defs"]["finding"]["required"]) == set(keys)


def test_main_prints_text_and_rejects_a_missing_path(tmp_path, capsys):
    (tmp_path / "a.py").write_text("x = 1\n")
    assert _scan.main([str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == "no CUDA assumptions found"
    assert _scan.main([str(tmp_path / "missing")]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError):
        _scan.scan(tmp_path / "missing")


def test_the_examples_take_their_device_from_an_argument():
    findings = _scan.scan(ROOT / "examples")
    # the scripts at the top take their device from --device: what is left is train_cnn.py's
    # DataLoader(pin_memory=True), which the jax device accepts
    top = [(f.path, f.kind) for f in findings if "/" not in f.path]
    assert top == [("train_cnn.py", "pin-memory")]
    assert len(list((ROOT / "examples").glob("*.py"))) >= 4
    # migration/cuda_only.py is written for CUDA on purpose (a workload for the doctor);
    # kernel_ridge.py takes its device from torch.accelerator
    migration = collections.defaultdict(set)
    for f in findings:
        if "/" in f.path:
            migration[f.path].add(f.kind)
    assert dict(migration) == {"migration/cuda_only.py": {"cuda-call", "cudnn-flag", "torch-cuda-api"}}
