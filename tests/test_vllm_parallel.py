"""vLLM's tensor parallelism on jax (NOTE [vLLM on jax] in src/torch_jax/vllm/_platform.py):
two workers, each on its jax device, in a process of its own (tests/_vllm_tp.py: vLLM
spawns its workers). A file of its own, so that CI's workers take it beside the others."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'torch_jax[vllm]')")

import _vllm_models  # noqa: E402
from test_vllm import NEW, PROMPTS, _hf_greedy  # noqa: E402


def run_in_session(args: list, env: dict, timeout: int, what: str) -> tuple[int, str]:
    """``python args`` in a session of its own, so that vLLM's engine and worker processes
    are stopped with it, whatever happens; its return code and output (a test failure
    after ``timeout`` seconds)."""
    proc = subprocess.Popen(
        [sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        start_new_session=True,
    )  # fmt: skip
    try:
        text, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        text, _ = proc.communicate()
        pytest.fail(f"{what} did not finish in {timeout} s:\n{text[-6000:]}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # (what is left of its workers)
    return proc.returncode, text


def test_tensor_parallel_over_two_devices_gives_the_tokens_of_one(tmp_path):
    """tensor_parallel_size=2: two vLLM workers, each on its jax device, their collectives
    on the jax process group (XLA's), against transformers' greedy tokens (those of
    tensor_parallel_size=1 above)."""
    path, tokenizer = _vllm_models.make_model("qwen2", str(tmp_path))
    want = _hf_greedy(path, tokenizer, PROMPTS[:4])
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # (each worker: its host's devices)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_vllm_tp.py")
    # (its process group rendezvous through a file, JAX's coordinator on 127.0.0.1)
    returncode, text = run_in_session(
        [script, path, tokenizer, "2", json.dumps(PROMPTS[:4]), str(NEW)], env, 400, "vLLM with tensor_parallel_size=2"
    )
    lines = [line for line in text.splitlines() if line.startswith("TOKENS ")]
    assert returncode == 0 and lines, text[-6000:]
    assert json.loads(lines[-1][len("TOKENS ") :]) == want
    assert "backend=jax" in text  # (vLLM's log of its process group)
