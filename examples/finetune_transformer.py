"""Fine-tune a small GPT-2 (Hugging Face transformers, built from a config with random
weights: nothing is downloaded) on the ``jax`` device and print the loss falling.

The task is synthetic: sequences that count up modulo the vocabulary from a random
start, so the model must learn "next = previous + 1". AdamW with warmup and cosine
decay, gradient clipping, and a checkpoint saved and reloaded with ``save_pretrained``
/ ``from_pretrained(device_map="jax")`` at the end.

    python examples/finetune_transformer.py [--steps 120]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
import transformers


def counting_batch(batch: int, length: int, vocab: int, g: torch.Generator) -> torch.Tensor:
    start = torch.randint(0, vocab, (batch, 1), generator=g)
    return (start + torch.arange(length)) % vocab


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--device", default="jax")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (its default backend)")
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()

    torch.manual_seed(0)
    device = torch.device(args.device)
    vocab = 64
    config = transformers.GPT2Config(vocab_size=vocab, n_positions=64, n_embd=128, n_layer=2, n_head=4)
    model = transformers.GPT2LMHeadModel(config).to(device)
    if args.compile:  # (the forward compiled: the model itself stays a PreTrainedModel, for save_pretrained)
        model.forward = torch.compile(model.forward)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sched = transformers.get_cosine_schedule_with_warmup(opt, num_warmup_steps=10, num_training_steps=args.steps)
    g = torch.Generator().manual_seed(0)

    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        ids = counting_batch(16, 32, vocab, g).to(device)
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step == 1 or step % 20 == 0:
            print(f"step {step:4d}  loss {loss.item():.4f}  lr {sched.get_last_lr()[0]:.2e}")
    print(f"device {device}: {args.steps} steps in {time.perf_counter() - start:.1f}s")

    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        reloaded = transformers.GPT2LMHeadModel.from_pretrained(d, device_map=str(device))
    prompt = torch.tensor([[5, 6, 7, 8]], device=device)
    out = reloaded.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=0)
    print("reloaded model continues 5 6 7 8 with:", " ".join(str(t) for t in out[0, 4:].tolist()))


if __name__ == "__main__":
    main()
