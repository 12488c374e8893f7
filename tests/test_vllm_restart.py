"""vLLM's step on jax compiled whole (NOTE [vLLM's step as one computation] in
src/torch_jax/vllm/_attention.py): every token bucket compiles at start-up, none while
serving, and a second start compiles none (vLLM's AOT artifact, then torch_jax's
persistent compilation cache). Two starts, each a process of its own (tests/_vllm_start.py),
with caches of their own, started empty."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'torch_jax[vllm]')")

import _vllm_models  # noqa: E402
from test_vllm import PROMPTS, _hf_greedy  # noqa: E402
from test_vllm_parallel import run_in_session  # noqa: E402

NEW = 6
BUCKETS = 2  # (max_num_batched_tokens=32: 16 and 32 tokens)


def _start(path, tokenizer, prompts, env) -> tuple[list, dict]:
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_vllm_start.py")
    returncode, text = run_in_session([script, path, tokenizer, json.dumps(prompts), str(NEW)], env, 300, "vLLM")
    found = {}
    for line in text.splitlines():
        for tag in ("TOKENS", "STATS"):
            if line.startswith(tag + " "):
                found[tag] = json.loads(line[len(tag) + 1 :])
    assert returncode == 0 and len(found) == 2, text[-6000:]
    return found["TOKENS"], found["STATS"]


def test_buckets_compile_at_start_and_a_second_start_compiles_none(tmp_path):
    path, tokenizer = _vllm_models.make_model("llama", str(tmp_path / "model"))
    prompts = PROMPTS[:3]  # (3, 41 and 9 words: a prefill in chunks of 32 tokens, then decodes)
    want = _hf_greedy(path, tokenizer, prompts, NEW)
    # (the persistent compilation cache on, in a folder of the test's: conftest turns it off for the tests)
    env = dict(
        os.environ,
        TORCH_JAX_COMPILATION_CACHE="1",
        TORCH_JAX_CACHE_DIR=str(tmp_path / "torch_jax"),
        VLLM_CACHE_ROOT=str(tmp_path / "vllm"),
    )
    first_tokens, first = _start(path, tokenizer, prompts, env)
    assert first_tokens == want
    # the first start: each bucket compiled once, as one computation (nothing op by op)
    assert first["start"]["compiled_graph_compiles"] == BUCKETS, first
    assert first["run"]["compiled_graph_compiles"] == 0 and first["run"]["compiled_graph_eager_calls"] == 0, first
    assert first["run"]["compiled_graph_calls"] >= NEW, first
    second_tokens, second = _start(path, tokenizer, prompts, env)
    assert second_tokens == want
    assert second["start"]["compiled_graph_compiles"] == 0, second
    assert second["start"]["compiled_graph_loads"] == BUCKETS, second
    assert second["run"]["compiled_graph_compiles"] == 0 and second["run"]["compiled_graph_eager_calls"] == 0, second
