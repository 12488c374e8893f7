"""LLM serving: vLLM on jax (NOTE [vLLM on jax] in torch_jax/vllm/_platform.py) against
Hugging Face ``generate()`` on PyTorch's CPU and on jax, in this one process.

    python -m benchmarks.serving [--prompts 64] [--new 64] [--width 256] [--layers 4]
                                 [--variants vllm,hf-cpu,hf-jax] [--out DIR | --no-write]

A tiny random Llama (the tests' model maker, tests/_vllm_models.py: config and tokenizer
made here) in float32, greedy, ``--prompts`` prompts of 8 to 64 words, each asked for
``--new`` tokens. ``vllm``: vLLM's engine in this process with every prompt in one batch
(``max_num_seqs`` = the prompts), its defaults otherwise (vLLM's compilation through the
jax backend); a warm-up run of the same requests first, then the timed one. ``hf-cpu``:
``generate()`` on the CPU, the prompts batched with left padding; ``hf-jax``: the same on
jax in strict eager mode (``hf-jax-fused``: fused). Each row: the wall time of the
generation, throughput (new tokens a second), for vLLM the start-up (the engine's
construction: loading and compiling), the time to first token and time per output token
(vLLM's own metrics), and the XLA computations compiled during the timed run; the tokens
of each variant are compared with the CPU's.

Needs vLLM (``pip install "torch_jax[vllm]"``, torch 2.14).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch

from benchmarks import machine, write_report

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
import _vllm_models  # noqa: E402  (the tests' model maker)

VARIANTS = ["vllm", "hf-cpu", "hf-jax", "hf-jax-fused"]
DEFAULT = "vllm,hf-cpu,hf-jax"


def _prompts(n: int) -> list[str]:
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(8, 65, (n,), generator=g).tolist()
    return [" ".join(f"w{int(w)}" for w in torch.randint(0, 170, (k,), generator=g)) for k in lengths]


def _compiles() -> int:
    import torch_jax

    stats = torch_jax.stats()
    return stats.get("compiles", 0) + stats.get("compiled_graph_compiles", 0)


def _vllm(path, tokenizer, prompts, new) -> dict:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import vllm

    start = time.perf_counter()
    llm = vllm.LLM(
        model=path, tokenizer=tokenizer, dtype="float32", max_model_len=256, max_num_seqs=len(prompts),
        max_num_batched_tokens=4096, kv_cache_memory_bytes=256 << 20, disable_log_stats=False, seed=0,
        enable_prefix_caching=False,  # (the timed run repeats the warm-up's prompts: the same work as HF's)
    )  # fmt: skip
    startup = time.perf_counter() - start
    params = vllm.SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)  # (warm-up: the same batch)
    before = {m.name: m for m in llm.get_metrics()}
    import torch_jax

    torch_jax.reset_stats()
    compiles = _compiles()
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - start
    after = {m.name: m for m in llm.get_metrics()}
    counts = torch_jax.stats()
    breakdown = _breakdown(llm, prompts, params)
    breakdown["eager_ops_per_step"] = counts.get("ops", 0) / max(breakdown["steps"], 1)
    breakdown["host_transfers_per_step"] = counts.get("host_transfers", 0) / max(breakdown["steps"], 1)

    def mean(name):  # (a histogram's mean over the timed run)
        a, b = after.get(name), before.get(name)
        if a is None or not hasattr(a, "sum"):
            return None
        count = a.count - (b.count if b else 0)
        return (a.sum - (b.sum if b else 0)) / count if count else None

    return {
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "wall_s": wall,
        "startup_s": startup,
        "ttft_s": mean("vllm:time_to_first_token_seconds"),
        "tpot_s": mean("vllm:request_time_per_output_token_seconds") or mean("vllm:inter_token_latency_seconds"),
        "compiles": _compiles() - compiles,
        "breakdown": breakdown,
    }


def _breakdown(llm, prompts, params) -> dict:
    """Where a step's time goes: the same generation once more, each call of the compiled
    model step timed alone (the device's queue drained before and after it); the rest of
    the run's time is vLLM's own Python (scheduling, input preparation, sampling,
    detokenizing), its eager ops and host transfers. The drains add a little to each step,
    and take away what asynchronous scheduling overlaps."""
    import jax

    from torch_jax.compile import _graph
    from torch_jax.device import _state

    calls = []
    original = _graph.Program.__call__

    def timed(self, *args):
        # (the step's token count: its first input, the token ids; read first, as the call
        # empties the list of its inputs)
        first = args[0][0] if args and isinstance(args[0], list) and args[0] else args[0] if args else None
        tokens = getattr(first, "shape", (0,))[0]
        jax.block_until_ready(list(_state.last.values()))
        start = time.perf_counter()
        out = original(self, *args)
        jax.block_until_ready(list(_state.last.values()))
        calls.append((tokens, time.perf_counter() - start))
        return out

    _graph.Program.__call__ = timed
    try:
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - start
    finally:
        _graph.Program.__call__ = original
    counts = [n for n, _ in calls]
    steady = max(set(counts), key=counts.count) if counts else 0  # (the decode steps' padded token count)
    decode = [t for n, t in calls if n == steady]
    prefill = [t for n, t in calls if n != steady]
    return {
        "steps": len(calls),
        "wall_s": wall,
        "prefill_compute_s": sum(prefill),
        "decode_compute_ms": 1000 * sum(decode) / max(len(decode), 1),
        "rest_ms_per_step": 1000 * (wall - sum(t for _, t in calls)) / max(len(calls), 1),
    }


def _hf(path, tokenizer, prompts, new, device) -> dict:
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(tokenizer)
    tok.padding_side = "left"
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval().to(device)
    batch = tok(prompts, return_tensors="pt", padding=True).to(device)
    kwargs = dict(max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=tok.pad_token_id)
    with torch.no_grad():
        model.generate(**batch, **kwargs)  # (warm-up)
        compiles = _compiles() if device != "cpu" else 0
        start = time.perf_counter()
        out = model.generate(**batch, **kwargs)
        tokens = out[:, batch.input_ids.shape[1] :].cpu().tolist()
        wall = time.perf_counter() - start
    return {"tokens": tokens, "wall_s": wall, "compiles": (_compiles() - compiles) if device != "cpu" else None}


def _divergence(path, tokenizer, prompt, got, want) -> dict:
    """Where a prompt's tokens first differ from the CPU's, and the gap there between the two
    tokens' logits, the model run on the CPU in float64 on the prompt alone (no padding)."""
    import transformers

    at = next(k for k, (a, b) in enumerate(zip(got, want)) if a != b)
    tok = transformers.AutoTokenizer.from_pretrained(tokenizer)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64).eval()
    ids = torch.tensor([tok(prompt).input_ids + want[:at]])
    with torch.no_grad():
        logits = model(ids).logits[0, -1]
    return {"step": at, "logit_gap": float((logits[want[at]] - logits[got[at]]).abs())}


def _same(row: dict, prompts: int) -> str:
    if row["same_tokens_as_cpu"] is None:
        return "-"
    if row["same_tokens_as_cpu"]:
        return "all"
    return f"{prompts - row['prompts_differing']} of {prompts}"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--variants", default=DEFAULT)
    parser.add_argument("--out", default="docs/benchmarks")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    path, tokenizer = _vllm_models.make_model(
        "llama",
        tempfile.mkdtemp(prefix="tj-serving"),
        layers=args.layers,
        width=args.width,
        heads=8,
        kv_heads=4,
        max_len=256,
    )
    prompts = _prompts(args.prompts)
    rows = {}
    for variant in args.variants.split(","):
        if variant == "vllm":
            import torch_jax

            saved = torch_jax.config.bucketing, torch_jax.config.deferred_checks
            rows[variant] = _vllm(path, tokenizer, prompts, args.new)
            # (vLLM's worker, here in this process, turns torch_jax's shape buckets off and
            # defers value checks: NOTE [No shape buckets under vLLM], NOTE [vLLM's
            # asynchronous scheduling on jax]; the HF rows run with the settings they would have)
            torch_jax.config.bucketing, torch_jax.config.deferred_checks = saved
        elif variant == "hf-cpu":
            rows[variant] = _hf(path, tokenizer, prompts, args.new, "cpu")
        elif variant in ("hf-jax", "hf-jax-fused"):
            import torch_jax

            before = torch_jax.config.mode
            torch_jax.set_mode("fused" if variant == "hf-jax-fused" else "strict")
            try:
                rows[variant] = _hf(path, tokenizer, prompts, args.new, "jax")
            finally:
                torch_jax.set_mode(before)
        else:
            raise SystemExit(f"unknown variant {variant!r}; choose from {VARIANTS}")
        row = rows[variant]
        row["throughput"] = args.prompts * args.new / row["wall_s"]
        print(f"{variant}: {row['wall_s']:.2f} s, {row['throughput']:.0f} tokens/s", flush=True)
    reference = rows.get("hf-cpu")
    for row in rows.values():
        row["same_tokens_as_cpu"] = None if reference is None else row["tokens"] == reference["tokens"]
        if reference is not None and not row["same_tokens_as_cpu"]:
            pairs = [(i, a, b) for i, (a, b) in enumerate(zip(row["tokens"], reference["tokens"])) if a != b]
            row["prompts_differing"] = len(pairs)
            row["divergences"] = [_divergence(path, tokenizer, prompts[i], a, b) for i, a, b in pairs]
    report = {
        "machine": machine(),
        "prompts": args.prompts,
        "new": args.new,
        "width": args.width,
        "layers": args.layers,
    }
    report["rows"] = {k: {n: v for n, v in r.items() if n != "tokens"} for k, r in rows.items()}
    lines = [
        "# Serving: vLLM on jax against Hugging Face generate()",
        "",
        f"{args.prompts} prompts x {args.new} new tokens, greedy, a random Llama (width {args.width}, "
        f"{args.layers} layers, float32); `python -m benchmarks.serving`, {report['machine']['date']}, "
        f"{report['machine']['cpus']} CPUs ({report['machine']['cpu_model']}), torch {report['machine']['torch']}.",
        "",
        "| variant | wall s | tokens/s | vs hf-cpu | start-up s | TTFT s | s/output token | compiles (timed run) | prompts with the CPU's tokens |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def fmt(x, spec=".3f"):
        return "-" if x is None else format(x, spec)

    base = rows.get("hf-cpu", {}).get("throughput")
    for name, r in report["rows"].items():
        ratio = None if not base else r["throughput"] / base
        lines.append(
            f"| {name} | {fmt(r['wall_s'], '.2f')} | {fmt(r['throughput'], '.0f')} | {fmt(ratio, '.2f')}x | "
            f"{fmt(r.get('startup_s'), '.1f')} | {fmt(r.get('ttft_s'))} | {fmt(r.get('tpot_s'), '.4f')} | "
            f"{fmt(r.get('compiles'), 'd')} | {_same(r, args.prompts)} |"
        )
    b = rows.get("vllm", {}).get("breakdown")
    if b:
        lines += [
            "",
            f"Where vLLM's time goes (the same run once more, each compiled step timed alone: {b['wall_s']:.2f} s, "
            f"{b['steps']} steps): the prefill's computation {1000 * b['prefill_compute_s']:.0f} ms; a decode step's "
            f"computation {b['decode_compute_ms']:.1f} ms; the rest, {b['rest_ms_per_step']:.1f} ms a step, is vLLM's "
            f"own Python, its {b['eager_ops_per_step']:.0f} eager ops and {b['host_transfers_per_step']:.0f} host "
            "transfers a step. (Timing each step alone waits for it, which takes away what asynchronous "
            "scheduling overlaps: vLLM's Python for the next step beside the device's computation; the timed "
            "run above keeps it.)",
        ]
    gaps = [d for r in rows.values() for d in r.get("divergences", [])]
    lines += [
        "",
        "The CPU's tokens are those of its left-padded batch (the tests, tests/test_vllm.py, compare",
        "vLLM's tokens with transformers' prompt by prompt: identical there).",
    ]
    if gaps:
        worst = max(d["logit_gap"] for d in gaps)
        lines.append(
            f"Where a prompt's tokens differ, the two tokens' logits at the first difference (float64, "
            f"the prompt alone) are at most {worst:.2e} apart."
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        write_report(args.out, "serving", report, text)
    return report


if __name__ == "__main__":
    main()
