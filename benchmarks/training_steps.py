"""Whole training steps of real models, strict eager on ``jax`` against PyTorch CPU
eager, side by side in one process (warmed up, median of repeats, ratio jax / CPU):

- a GPT-2-style language model (Hugging Face GPT2LMHeadModel from a config with
  random weights: 4 layers, d=256, 4 heads, sequence 128, batch 8), AdamW;
- the Hugging Face ResNet (ResNet-18 layout: depths 2-2-2-2, widths 64-128-256-512)
  on 64x64 images, batch 16, SGD with momentum.

    python benchmarks/training_steps.py [--repeats 5] [--markdown]
"""

from __future__ import annotations

import argparse

import torch
import transformers

from eager_overhead import compare


def gpt2_step(device):
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=8192, n_positions=128, n_embd=256, n_layer=4, n_head=4)
    model = transformers.GPT2LMHeadModel(config).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, config.vocab_size, (8, 128), generator=torch.Generator().manual_seed(0)).to(device)

    def step():
        opt.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()

    return step


def resnet_step(device):
    torch.manual_seed(0)
    config = transformers.ResNetConfig(
        embedding_size=64, hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2], layer_type="basic", num_labels=10
    )
    model = transformers.ResNetForImageClassification(config).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 3, 64, 64, generator=g).to(device)
    y = torch.randint(0, 10, (16,), generator=g).to(device)

    def step():
        opt.zero_grad(set_to_none=True)
        model(pixel_values=x, labels=y).loss.backward()
        opt.step()

    return step


WORKLOADS = [
    ("GPT-2-style step (4 layers, d=256, seq 128, batch 8), AdamW", gpt2_step, 3),
    ("HF ResNet-18 step (64x64, batch 16), SGD momentum", resnet_step, 3),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()
    compare(WORKLOADS, args.repeats, args.markdown)


if __name__ == "__main__":
    main()
