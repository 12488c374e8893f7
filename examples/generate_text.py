"""Text generation on the ``jax`` device with a small Llama (Hugging Face transformers,
built from a config with random weights: nothing is downloaded).

A tiny character-level model first memorizes a short text (a few hundred AdamW steps),
then ``generate()`` continues prompts from it, greedily and with sampling. It uses a
static KV cache (``cache_implementation="static"``): the shapes then stay the same for
every new token, so each op compiles once instead of once per sequence length.

    python examples/generate_text.py [--steps 200] [--new-tokens 60]
"""

from __future__ import annotations

import argparse
import time

import torch
import transformers

TEXT = (
    "the quick brown fox jumps over the lazy dog. "
    "pack my box with five dozen liquor jugs. "
    "how vexingly quick daft zebras jump. "
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--new-tokens", type=int, default=60)
    parser.add_argument("--device", default="jax")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (its default backend)")
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()

    torch.manual_seed(0)
    device = torch.device(args.device)
    chars = sorted(set(TEXT))
    encode = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([encode[c] for c in TEXT * 2])
    config = transformers.LlamaConfig(
        vocab_size=len(chars), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        bos_token_id=None, eos_token_id=None,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).to(device)
    if args.compile:  # (the forward compiled: training and generate() both run it)
        model.forward = torch.compile(model.forward)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

    start = time.perf_counter()
    window = 64
    g = torch.Generator().manual_seed(0)
    for step in range(1, args.steps + 1):
        starts = torch.randint(0, len(TEXT), (16,), generator=g)
        ids = torch.stack([data[s : s + window] for s in starts.tolist()]).to(device)
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step == 1 or step % 50 == 0 or step == args.steps:
            print(f"step {step:4d}  loss {loss.item():.4f}")
    print(f"device {device}: trained {args.steps} steps in {time.perf_counter() - start:.1f}s")

    model.eval()
    start = time.perf_counter()
    for prompt, sample in (("the quick", False), ("pack my", False), ("how ", True)):
        ids = torch.tensor([[encode[c] for c in prompt]], device=device)
        out = model.generate(
            ids, max_new_tokens=args.new_tokens, do_sample=sample, top_k=5 if sample else None, pad_token_id=0,
            cache_implementation="static",
        )  # fmt: skip
        text = "".join(chars[i] for i in out[0].tolist())
        print(f"{'sampled' if sample else 'greedy '}: {text!r}")
    print(f"device {device}: generated 3 x {args.new_tokens} tokens in {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    main()
