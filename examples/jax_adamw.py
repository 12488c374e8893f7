"""A pure-JAX fused optimizer update as a PyTorch operator on the ``jax`` device.

``torch.ops.examples.adamw_`` updates every parameter, first moment and second moment
of a model in one operator, written in JAX: a mutating op (its schema marks the lists
it writes), whose JAX function returns the new values, which the device writes back
into the tensors. ``JaxAdamW`` is a ``torch.optim.Optimizer`` that calls it once a
step; the learning rate and the step count are run-time inputs (``traced``), so a
scheduler changes them without compiling anything. The example trains a small MLP with
it and with ``torch.optim.AdamW`` on the CPU and prints both losses.

    python examples/jax_adamw.py [--steps 30]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import torch

import torch_jax


def adamw_jax(
    params: list[jax.Array],
    grads: list[jax.Array],
    exp_avgs: list[jax.Array],
    exp_avg_sqs: list[jax.Array],
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    step: float,
) -> None:
    """AdamW (decoupled weight decay) as ``torch.optim.AdamW`` computes it, every tensor at
    once; returns the new parameters, first and second moments (the mutated arguments)."""
    bias_correction1 = 1 - beta1**step
    bias_correction2_sqrt = jnp.sqrt(1 - beta2**step)
    step_size = lr / bias_correction1
    new_params, new_avgs, new_sqs = [], [], []
    for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
        p = p * (1 - lr * weight_decay)
        m = m + (1 - beta1) * (g - m)  # (PyTorch's lerp)
        v = v * beta2 + (1 - beta2) * g * g
        denom = jnp.sqrt(v) / bias_correction2_sqrt + eps
        new_params.append(p - step_size * m / denom)
        new_avgs.append(m)
        new_sqs.append(v)
    return new_params, new_avgs, new_sqs


adamw_ = torch_jax.jax_op(
    "examples::adamw_", adamw_jax, mutates_args=("params", "exp_avgs", "exp_avg_sqs"), traced=("lr", "step")
)


class JaxAdamW(torch.optim.Optimizer):
    """AdamW whose step is the one JAX operator above (parameters on ``jax``)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            for p in params:
                if not self.state[p]:
                    self.state[p] = {
                        "step": 0,
                        "exp_avg": torch.zeros_like(p),
                        "exp_avg_sq": torch.zeros_like(p),
                    }
                self.state[p]["step"] += 1
            if not params:
                continue
            step = self.state[params[0]]["step"]
            beta1, beta2 = group["betas"]
            adamw_(
                params,
                [p.grad for p in params],
                [self.state[p]["exp_avg"] for p in params],
                [self.state[p]["exp_avg_sq"] for p in params],
                float(group["lr"]),
                beta1,
                beta2,
                group["eps"],
                group["weight_decay"],
                float(step),
            )
        return loss


def train(device: str, steps: int, jax_optimizer: bool):
    """Losses of a small MLP trained with AdamW and a linear learning-rate decay."""
    torch.manual_seed(0)
    x, y = torch.randn(256, 16), torch.randn(256, 1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    model.to(device)
    x, y = x.to(device), y.to(device)
    kind = JaxAdamW if jax_optimizer else torch.optim.AdamW
    extra = {} if jax_optimizer else {"foreach": False}
    opt = kind(model.parameters(), lr=1e-2, weight_decay=0.1, **extra)
    sched = torch.optim.lr_scheduler.LinearLR(opt, 1.0, 0.1, total_iters=steps)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    print(f"device jax ({jax.default_backend()})")
    start = time.perf_counter()
    ours, params = train("jax", args.steps, jax_optimizer=True)
    took = time.perf_counter() - start
    theirs, cpu_params = train("cpu", args.steps, jax_optimizer=False)
    for i in range(0, args.steps, max(1, args.steps // 6)):
        print(f"step {i:3d}: loss {ours[i]:.6f} (torch.optim.AdamW on the CPU: {theirs[i]:.6f})")
    gap = max((a - b).abs().max().item() for a, b in zip(params, cpu_params))
    print(f"largest parameter difference after {args.steps} steps: {gap:.2e} ({took:.2f} s on jax)")


if __name__ == "__main__":
    main()
