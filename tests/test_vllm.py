"""vLLM on jax (NOTE [vLLM on jax] in src/torch_jax/vllm/_platform.py): its engine on tiny
random Llama, Qwen2 and GPT-2 models made here, against Hugging Face transformers on the
CPU: greedy tokens (one prompt; sixteen of different lengths with continuous batching, KV
blocks crossing, chunked prefill and prefix caching; a KV cache small enough to preempt),
logprobs, seeded and sampled tokens, stop strings and ``max_tokens``. One engine a model
for the file (an engine's start compiles the model: most of the time)."""

from __future__ import annotations

import math
import os

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'torch_jax[vllm]')")

import _vllm_models  # noqa: E402

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # (the engine in this process)

NEW = 12
PROMPTS = [
    " ".join(f"w{(7 * i + 3 * k) % 170}" for k in range(n))
    for i, n in enumerate([3, 41, 9, 17, 5, 60, 2, 33, 14, 26, 8, 50, 11, 4, 37, 20])
]
BLOCK = 16
BLOCK_BYTES = {"llama": 2 * 2 * BLOCK * 2 * 16 * 4}  # (layers * (K, V) * block * kv heads * head dim * float32)


def _engine(kind: str, tmp_path_factory, **kwargs):
    path, tokenizer = _vllm_models.make_model(kind, str(tmp_path_factory.mktemp(kind)))
    settings = dict(
        model=path,
        tokenizer=tokenizer,
        dtype="float32",
        max_model_len=128,
        block_size=BLOCK,
        max_num_seqs=8,
        max_num_batched_tokens=64,  # (the longer prompts prefill in chunks)
        enable_prefix_caching=True,
        enable_chunked_prefill=True,
        kv_cache_memory_bytes=1 << 22,
        disable_log_stats=False,
        seed=0,
    )
    settings.update(kwargs)
    llm = vllm.LLM(**settings)
    return llm, path, tokenizer


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    made = {}

    def get(kind):
        if kind not in made:
            extra = {}
            if kind == "llama":  # (10 blocks, 160 tokens: eight requests at once need more, so the scheduler preempts)
                extra = dict(kv_cache_memory_bytes=10 * BLOCK_BYTES["llama"])
            if kind == "gpt2":  # (the sampling tests: many short requests at once)
                extra = dict(max_num_seqs=64, max_num_batched_tokens=512)
            made[kind] = _engine(kind, tmp_path_factory, **extra)
        return made[kind]

    yield get
    made.clear()


def _hf(path: str, tokenizer: str):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, transformers.AutoTokenizer.from_pretrained(tokenizer)


def _hf_greedy(path, tokenizer, prompts, new=NEW):
    model, tok = _hf(path, tokenizer)
    out = []
    for prompt in prompts:
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            got = model.generate(
                ids, max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=tok.pad_token_id
            )
        out.append(got[0, ids.shape[1] :].tolist())
    return out


def _greedy(**kwargs):
    return vllm.SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True, **kwargs)


def _metric(llm, name: str) -> float:
    return sum(getattr(m, "value", 0) for m in llm.get_metrics() if m.name == name)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gpt2"])
def test_greedy_tokens_are_transformers_tokens_on_the_cpu(engines, kind):
    llm, path, tokenizer = engines(kind)
    # (vLLM's default, asynchronous scheduling: NOTE [vLLM's asynchronous scheduling on jax])
    assert llm.llm_engine.vllm_config.scheduler_config.async_scheduling
    want = _hf_greedy(path, tokenizer, PROMPTS)
    one = llm.generate(PROMPTS[:1], _greedy())
    assert [list(o.outputs[0].token_ids) for o in one] == want[:1]
    preempted = _metric(llm, "vllm:num_preemptions")
    outs = llm.generate(PROMPTS, _greedy())  # (continuous batching: eight at a time, chunked prefills)
    assert [list(o.outputs[0].token_ids) for o in outs] == want
    if kind == "llama":
        assert _metric(llm, "vllm:num_preemptions") > preempted  # (the small KV cache preempted)
    long = PROMPTS.index(max(PROMPTS, key=len))  # (60 words: three full blocks to reuse)
    hits = _metric(llm, "vllm:prefix_cache_hits")
    again = llm.generate([PROMPTS[long]], _greedy())
    assert list(again[0].outputs[0].token_ids) == want[long]
    again = llm.generate([PROMPTS[long]], _greedy())
    assert list(again[0].outputs[0].token_ids) == want[long]
    assert _metric(llm, "vllm:prefix_cache_hits") >= hits + 3 * BLOCK  # (its blocks were cached)


def test_logprobs_are_transformers_logprobs(engines):
    llm, path, tokenizer = engines("qwen2")
    model, tok = _hf(path, tokenizer)
    outs = llm.generate(PROMPTS[:4], _greedy(logprobs=3))
    for prompt, out in zip(PROMPTS[:4], outs):
        completion = out.outputs[0]
        ids = tok(prompt, return_tensors="pt").input_ids
        full = torch.cat([ids[0], torch.tensor(completion.token_ids)])[None]
        with torch.no_grad():
            logits = model(full).logits[0, ids.shape[1] - 1 : -1].double()
        want = logits.log_softmax(-1)
        for step, (token, top) in enumerate(zip(completion.token_ids, completion.logprobs)):
            assert set(top) >= {token} and len(top) >= 3
            for t, lp in top.items():
                assert math.isclose(lp.logprob, float(want[step, t]), abs_tol=2e-4), (step, t)
            assert sorted(top, key=lambda t: -top[t].logprob)[:3] == want[step].topk(3).indices.tolist()


def test_a_seeded_sampled_run_repeats(engines):
    # (on an engine that does not preempt: a preempted request's generator is not rewound
    # when vLLM recomputes it, on any device)
    llm, *_ = engines("qwen2")
    params = vllm.SamplingParams(temperature=1.0, top_p=0.9, max_tokens=NEW, seed=1234, ignore_eos=True)
    first = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS[:6], params)]
    second = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS[:6], params)]
    assert first == second
    other = vllm.SamplingParams(temperature=1.0, top_p=0.9, max_tokens=NEW, seed=4321, ignore_eos=True)
    assert [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS[:6], other)] != first


def test_sampled_tokens_follow_the_model_distribution(engines):
    """The first sampled token of 400 requests (top-k 4, temperature 1.5) against the
    model's probabilities on the CPU: a chi-square test at p = 1e-4."""
    llm, path, tokenizer = engines("gpt2")
    model, tok = _hf(path, tokenizer)
    prompt = PROMPTS[2]
    with torch.no_grad():
        logits = model(tok(prompt, return_tensors="pt").input_ids).logits[0, -1].double() / 1.5
    top = logits.topk(4)
    probs = top.values.softmax(-1)
    n = 400
    params = vllm.SamplingParams(temperature=1.5, top_k=4, max_tokens=1, seed=None)
    counts = dict.fromkeys(top.indices.tolist(), 0)
    for out in llm.generate([prompt] * n, params):
        counts[out.outputs[0].token_ids[0]] += 1  # (a token outside the top 4 raises KeyError)
    expected = n * probs
    observed = torch.tensor([counts[t] for t in top.indices.tolist()], dtype=torch.float64)
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < 21.1, (counts, probs.tolist())  # (chi-square, 3 degrees of freedom, p = 1e-4)


def test_stop_strings_and_max_tokens(engines):
    llm, path, tokenizer = engines("gpt2")
    want = _hf_greedy(path, tokenizer, PROMPTS[:1])[0]
    (out,) = llm.generate(PROMPTS[:1], vllm.SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))
    assert list(out.outputs[0].token_ids) == want[:5] and out.outputs[0].finish_reason == "length"
    _, tok = _hf(path, tokenizer)
    # (the stop string: the first generated word, from the third on, not generated before it)
    k = next(k for k in range(2, len(want)) if tok.decode([want[k]]) not in tok.decode(want[:k]))
    stop = tok.decode([want[k]])
    (out,) = llm.generate(
        PROMPTS[:1], vllm.SamplingParams(temperature=0.0, max_tokens=NEW, stop=[stop], ignore_eos=True)
    )
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == stop
    assert out.outputs[0].text.strip() == tok.decode(want[:k]).strip()
