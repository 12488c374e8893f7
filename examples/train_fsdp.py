"""Train a small transformer language model with FSDP2 on the ``jax`` device, one process
per device, and print the loss falling (on rank 0).

Each block and the whole model are sharded with ``fully_shard`` over a 1-D device mesh;
each rank trains on its own part of the batch. The text is synthetic (a repeating
sequence of random tokens), so the example needs no downloads. The only device-specific
word is the device name: ``--device cpu`` runs the same program on the CPU with gloo.

    torchrun --standalone --nproc-per-node=2 examples/train_fsdp.py [--steps 40] [--device jax]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 64, dim: int = 64, heads: int = 4, layers: int = 2, context: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(context, dim) * 0.02)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(layers)
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(n, device=tokens.device)
        x = self.embed(tokens) + self.pos[:n]
        for block in self.blocks:
            x = block(x, src_mask=mask, is_causal=True)
        return self.head(self.norm(x))


def batches(rank: int, world: int, batch: int, context: int, vocab: int):
    """Windows of one long text that repeats a random 48-token phrase; each rank its own."""
    g = torch.Generator().manual_seed(0)
    phrase = torch.randint(0, vocab, (48,), generator=g)
    text = phrase.repeat(64)
    g = torch.Generator().manual_seed(1 + rank)
    while True:
        starts = torch.randint(0, len(text) - context - 1, (batch,), generator=g)
        window = torch.stack([text[s : s + context + 1] for s in starts.tolist()])
        yield window[:, :-1], window[:, 1:]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--device", default="jax")
    parser.add_argument("--batch", type=int, default=8, help="sequences per rank a step")
    args = parser.parse_args()

    dist.init_process_group()  # (gloo for CPU tensors and torch_jax's backend for jax ones)
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh(args.device, (world,))  # (makes jax:LOCAL_RANK current)
    torch.manual_seed(0)  # (the same initial weights on every rank)
    model = TinyLM().to(args.device)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = batches(rank, world, args.batch, 32, 64)

    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        x, y = next(data)
        x, y = x.to(args.device), y.to(args.device)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step == 1 or step % 10 == 0:
            mean = loss.detach().clone()
            dist.all_reduce(mean, dist.ReduceOp.AVG)
            if rank == 0:
                print(f"step {step:3d}  loss {mean.item():.4f}", flush=True)
    if rank == 0:
        shard = next(model.parameters()).to_local().device
        print(
            f"{args.steps} steps in {time.perf_counter() - start:.1f} s on {world} processes (rank 0's shard on {shard})"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
