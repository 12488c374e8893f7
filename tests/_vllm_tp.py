"""Run by tests/test_vllm.py: vLLM's engine with ``tensor_parallel_size`` from the command
line on a model folder, greedy tokens of the prompts (one JSON list a line, after
``TOKENS``). A script of its own: vLLM spawns its workers, which import the main module."""

from __future__ import annotations

import json
import sys


def main(path: str, tokenizer: str, tp: int, prompts: list[str], new: int) -> None:
    import vllm

    llm = vllm.LLM(
        model=path, tokenizer=tokenizer, dtype="float32", max_model_len=128, max_num_seqs=8,
        kv_cache_memory_bytes=4 << 20, tensor_parallel_size=tp, enforce_eager=True, seed=0,
    )  # fmt: skip
    outs = llm.generate(prompts, vllm.SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True))
    print("TOKENS", json.dumps([list(o.outputs[0].token_ids) for o in outs]), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4]), int(sys.argv[5]))
