"""Small models for the tests: an MLP, a CNN with BatchNorm and max-pool, and a
transformer block (embedding, LayerNorm, causal SDPA, GELU MLP).

The attention projection and the convolution before BatchNorm have no bias, as is
usual: those biases have mathematically zero gradients (softmax ignores a shift of
all scores, BatchNorm a shift of its input), so their floating-point noise would be
amplified by Adam into differences that say nothing about correctness.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 10))

    def forward(self, x):
        return self.net(x)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 16, 3, stride=2)
        self.fc = nn.Linear(16 * 3 * 3, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.c1(x))), 2)
        x = F.relu(self.c2(x))
        return self.fc(torch.flatten(x, 1))


class Block(nn.Module):
    def __init__(self, vocab=50, d=32, heads=4):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(16, d) * 0.02)
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
        self.head = nn.Linear(d, vocab)
        self.heads = heads

    def forward(self, idx):
        B, T = idx.shape
        x = self.emb(idx) + self.pos[:T]
        h = self.ln1(x)
        q, k, v = self.qkv(h).split(x.shape[-1], dim=-1)
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, -1))
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return self.head(x)


def data(kind, device):
    g = torch.Generator().manual_seed(0)
    if kind == "mlp":
        return torch.randn(8, 32, generator=g).to(device), torch.randint(0, 10, (8,), generator=g).to(device)
    if kind == "cnn":
        return torch.randn(4, 3, 16, 16, generator=g).to(device), torch.randint(0, 10, (4,), generator=g).to(device)
    idx = torch.randint(0, 50, (2, 16), generator=g)
    return idx.to(device), idx.roll(-1, 1).to(device)


def step(kind, device, opt_name="adam", steps=2):
    torch.manual_seed(0)
    m = {"mlp": MLP, "cnn": CNN, "block": Block}[kind]().to(device)
    opt = (
        torch.optim.Adam(m.parameters(), 1e-2)
        if opt_name == "adam"
        else torch.optim.SGD(m.parameters(), 0.1, momentum=0.9)
    )
    x, y = data(kind, device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        out = m(x)
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, m
