"""Run by tests/test_vllm_restart.py: one start of vLLM's engine on jax (vLLM's compilation,
its defaults), greedy tokens of the prompts, then torch_jax's counts of what compiled
(``TOKENS`` and ``STATS`` lines, JSON): at start-up, and in the generation after it."""

from __future__ import annotations

import json
import os
import sys


def main(path: str, tokenizer: str, prompts: list[str], new: int) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # (the engine in this process: its counts)
    import vllm

    import torch_jax

    llm = vllm.LLM(
        model=path, tokenizer=tokenizer, dtype="float32", max_model_len=64, max_num_seqs=4,
        max_num_batched_tokens=32, kv_cache_memory_bytes=1 << 20, seed=0,
    )  # fmt: skip
    start = torch_jax.stats()
    torch_jax.reset_stats()
    outs = llm.generate(prompts, vllm.SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True))
    run = torch_jax.stats()
    print("TOKENS", json.dumps([list(o.outputs[0].token_ids) for o in outs]), flush=True)
    keys = ("compiled_graph_compiles", "compiled_graph_loads", "compiled_graph_calls", "compiled_graph_eager_calls")
    print("STATS", json.dumps({"start": {k: start.get(k, 0) for k in keys}, "run": {k: run.get(k, 0) for k in keys}}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]))
