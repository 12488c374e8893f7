"""One training step of an MLP, a CNN with BatchNorm and max-pool, and a transformer
block (embedding, LayerNorm, SDPA, GELU, cross-entropy) matches CPU: loss, every
gradient, the updated parameters and buffers, with SGD and Adam and no CPU fallback."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import torch_jax
from _models import CNN, MLP, Block, data

MODELS = {"mlp": MLP, "cnn": CNN, "block": Block}
OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-4),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adam_foreach": lambda p: torch.optim.Adam(p, lr=1e-2, foreach=True),
    "adamw_single": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=False),
}


def _step(model, opt, x, y):
    opt.zero_grad()
    out = model(x)
    loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    opt.step()
    return loss.detach(), grads


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_training_step_matches_cpu(kind, opt_name):
    torch.manual_seed(0)
    cpu_model = MODELS[kind]()
    jax_model = copy.deepcopy(cpu_model).to("jax")
    cpu_opt = OPTIMIZERS[opt_name](cpu_model.parameters())
    jax_opt = OPTIMIZERS[opt_name](jax_model.parameters())
    x, y = data(kind, "cpu")
    torch_jax.reset_stats()
    for _ in range(2):
        loss_c, grads_c = _step(cpu_model, cpu_opt, x, y)
        loss_j, grads_j = _step(jax_model, jax_opt, x.to("jax"), y.to("jax"))
        torch.testing.assert_close(loss_j.cpu(), loss_c, rtol=1e-5, atol=1e-6)
        for name in grads_c:
            torch.testing.assert_close(grads_j[name].cpu(), grads_c[name], rtol=1e-4, atol=1e-5, msg=name)
    for (name, pc), (_, pj) in zip(cpu_model.state_dict().items(), jax_model.state_dict().items()):
        assert pj.device.type == "jax", name
        torch.testing.assert_close(pj.cpu(), pc, rtol=1e-4, atol=1e-5, msg=name)
    assert torch_jax.stats()["fallbacks"] == 0


def test_loss_falls_over_steps():
    torch.manual_seed(0)
    model = MLP().to("jax")
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = data("mlp", "jax")
    losses = [_step(model, opt, x, y)[0].item() for _ in range(20)]
    assert losses[-1] < 0.5 * losses[0]


def test_batchnorm_eval_and_running_stats():
    torch.manual_seed(0)
    cpu = torch.nn.BatchNorm2d(4)
    dev = copy.deepcopy(cpu).to("jax")
    x = torch.randn(8, 4, 5, 5)
    for _ in range(3):
        cpu(x), dev(x.to("jax"))
    torch.testing.assert_close(dev.running_mean.cpu(), cpu.running_mean)
    torch.testing.assert_close(dev.running_var.cpu(), cpu.running_var)
    assert dev.num_batches_tracked.item() == 3
    cpu.eval(), dev.eval()
    torch.testing.assert_close(dev(x.to("jax")).cpu(), cpu(x), rtol=1e-5, atol=1e-5)


def test_dropout_is_random_but_scaled():
    torch.manual_seed(0)
    x = torch.ones(10000, device="jax")
    y = F.dropout(x, p=0.3, training=True)
    kept = (y != 0).float().mean().item()
    assert abs(kept - 0.7) < 0.02
    assert torch.allclose(y[y != 0].cpu(), torch.tensor(1 / 0.7))
    assert torch.equal(F.dropout(x, p=0.3, training=False).cpu(), x.cpu())


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_weight_norm_matches_cpu(dim, dtype):
    """weight_norm's fused op (_weight_norm_interface, dim 0 or the last) and its
    backward, and the composite path of other dims: output and gradients as on the CPU."""
    from torch.nn.utils.parametrizations import weight_norm

    torch.manual_seed(0)
    cpu = weight_norm(torch.nn.Conv1d(4, 6, 3).to(dtype), dim=dim)
    dev = copy.deepcopy(cpu).to("jax")
    x = torch.randn(2, 4, 9, dtype=dtype)
    y = cpu(x)
    y.square().sum().backward()
    y_dev = dev(x.to("jax"))
    y_dev.square().sum().backward()
    torch.testing.assert_close(y_dev.cpu(), y.detach())
    for (name, p), q in zip(cpu.named_parameters(), dev.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, msg=name)
