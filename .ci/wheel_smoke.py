"""Smoke test of torch_jax installed from its wheel, in a venv of its own.

    cd "$(mktemp -d)" && /path/to/venv/bin/python /path/to/.ci/wheel_smoke.py

Run by .ci/wheel_check.sh from an empty folder outside the checkout, so that only the
installed package can be imported. It checks what the editable install of the test
suite cannot: that the wheel holds the package data (the FFI handlers' C++ sources, the
doctor's schema) and declares the entry points (torch's autoload, torch.compile's
backend, the console script). Prints a line per check passed; a failed check prints why
and the script exits 1 after trying the others.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import traceback
from pathlib import Path

import torch

import torch_jax

PACKAGE = Path(torch_jax.__file__).resolve().parent
CSRC = ["cpu_gemm.cc", "fusion_barrier.cc", "paged_attention.cc", "parallel_for.h"]
TIMEOUT = 600  # (seconds; a fresh process imports torch and JAX, and may compile the C++ handlers)


class Failed(Exception):
    pass


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise Failed(message)


def _run(cmd: list[str], env: dict | None = None) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        raise Failed(f"{cmd[0]} ... did not finish in {TIMEOUT} s") from None
    _require(done.returncode == 0, f"exit status {done.returncode}:\n{done.stderr.strip()[-3000:]}")
    return done.stdout.strip()


def _python(code: str, env: dict | None = None) -> str:
    return _run([sys.executable, "-c", textwrap.dedent(code)], env)


def _inside_package(path) -> bool:
    return Path(path).resolve().is_relative_to(PACKAGE)


def _same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    _require(got.device.type == "jax", f"{what}: the result is on {got.device}, not jax")
    # (XLA's and PyTorch's kernels may sum a product in another order)
    _require(torch.allclose(got.cpu(), want, rtol=1e-5, atol=1e-5), f"{what}: {got.cpu()} != CPU's {want}")


def installed() -> str:
    # (purelib lies under sys.prefix: an editable install or a checkout on sys.path does not)
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    _require(PACKAGE.is_relative_to(site), f"torch_jax imported from {PACKAGE}, not from {site}")
    version = importlib.metadata.version("torch_jax")
    _require(
        version == torch_jax.__version__,
        f"the metadata's version {version} != torch_jax.__version__ {torch_jax.__version__}",
    )
    return f"torch_jax {version} from {PACKAGE}"


def autoload() -> str:
    # (no import of torch_jax: torch loads it through the torch.backends entry point)
    out = _python("import torch; x = torch.ones(3, device='jax'); print((x + 1).cpu().tolist())")
    _require(out == "[2.0, 2.0, 2.0]", f"printed {out!r}")
    return "import torch alone registers the jax device"


def eager_modes() -> str:
    a, b = torch.randn(4, 5), torch.randn(5, 3)
    try:
        for mode in ("strict", "fused"):
            torch_jax.config.mode = mode
            _same(a.to("jax") + 1, a + 1, f"{mode} add")
            _same(a.to("jax") @ b.to("jax"), a @ b, f"{mode} matmul")
    finally:
        torch_jax.config.mode = "strict"
    return "an add and a matmul in strict and in fused mode equal the CPU's"


def ffi_handlers() -> str:
    # (a fresh process with an empty cache: the handlers are compiled here, from the sources
    # the wheel installed, and the cache directory is read when torch_jax is imported)
    with tempfile.TemporaryDirectory() as cache:
        out = _python(
            """
            import json, torch
            import torch_jax
            from torch_jax.kernels import _paged
            from torch_jax.ffi import _cpu_blas, _fusion_barrier
            print(json.dumps({
                "fusion_barrier": _fusion_barrier.status(),
                "paged": _paged._handlers.load(),
                "paged_status": _paged._handlers.status,
                "cpu_blas": _cpu_blas.status(),
                "mkl": torch.backends.mkl.is_available(),
                "sources": [str(_cpu_blas._SOURCE), str(_paged._KERNEL), str(_cpu_blas._SOURCE.with_name("parallel_for.h"))],
            }))
            """,
            env=dict(os.environ, TORCH_JAX_CACHE_DIR=cache),
        )
        built = sorted(p.name for p in Path(cache).rglob("*.so"))
    facts = json.loads(out.splitlines()[-1])
    _require(facts["fusion_barrier"] == "ok", f"fusion barrier: {facts['fusion_barrier']}")
    _require(facts["paged"], f"paged attention: {facts['paged_status']}")
    # (the BLAS handler needs the MKL symbols that torch's x86 CPU build exports)
    _require(facts["cpu_blas"] == "ok" or not facts["mkl"], f"cpu_blas, with MKL in torch: {facts['cpu_blas']}")
    outside = [s for s in facts["sources"] if not _inside_package(s)]
    _require(not outside, f"built from sources outside the installed package: {outside}")
    expected = ["fusion_barrier", "paged_attention"] + (["cpu_gemm"] if facts["cpu_blas"] == "ok" else [])
    missing = [stem for stem in expected if not any(name.startswith(f"{stem}-") for name in built)]
    _require(not missing, f"no .so built for {missing} in the cache directory (it holds {built})")
    return f"built {', '.join(built)}; cpu_blas: {facts['cpu_blas']}"


def console_script() -> str:
    script = Path(sys.prefix) / "bin" / "torch-jax"
    _require(script.is_file(), f"no {script}")
    _run([str(script), "doctor", "--help"])
    return f"{script} doctor --help"


def compile_backend() -> str:
    entries = [e for e in importlib.metadata.entry_points(group="torch_dynamo_backends") if e.name == "jax"]
    _require(
        len(entries) == 1 and entries[0].value.startswith("torch_jax."),
        f"torch_dynamo_backends entry points named jax: {[e.value for e in entries]}",
    )
    torch._dynamo.reset()

    def fn(a, b):
        return torch.relu(a @ b + 1).sum(0)

    a, b = torch.randn(4, 5), torch.randn(5, 3)
    _same(torch.compile(fn, backend="jax")(a.to("jax"), b.to("jax")), fn(a, b), "torch.compile")
    return f"torch.compile(backend='jax') through {entries[0].value}"


def package_data() -> str:
    schema = PACKAGE / "doctor" / "record.schema.json"
    _require(schema.is_file(), f"no {schema}")
    json.loads(schema.read_text())
    present = sorted(p.name for p in (PACKAGE / "ffi" / "csrc").glob("*") if p.suffix in (".cc", ".h"))
    missing = sorted(set(CSRC) - set(present))
    _require(not missing, f"ffi/csrc lacks {missing} (it holds {present})")
    return f"doctor/record.schema.json, ffi/csrc/{{{','.join(present)}}}"


CHECKS = [installed, autoload, eager_modes, ffi_handlers, console_script, compile_backend, package_data]


def main() -> int:
    failed = []
    for check in CHECKS:
        try:
            passed = check()
        except Failed as e:
            failed.append(check.__name__)
            print(f"FAILED {check.__name__}: {e}", flush=True)
        except Exception:
            failed.append(check.__name__)
            print(f"FAILED {check.__name__}:\n{traceback.format_exc()}", flush=True)
        else:
            print(f"ok {check.__name__}: {passed}", flush=True)
    if failed:
        print(f"wheel smoke test FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
