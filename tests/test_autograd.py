"""Autograd on the device, against the same program on CPU: retained graphs, double
backward, accumulation, grad modes, hooks, checkpointing, anomaly detection, torch.func
and forward-mode AD."""

from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.utils.checkpoint as checkpoint
from torch.func import grad, jacfwd, jacrev, jvp, vjp, vmap

from conftest import to_cpu


def _close(a, b, **kw):
    torch.testing.assert_close(to_cpu(a), to_cpu(b), **kw)


def _pair(*shape, seed=0):
    torch.manual_seed(seed)
    x = torch.randn(*shape, dtype=torch.float64)
    return x.clone().requires_grad_(), x.to("jax").requires_grad_()


def test_retain_graph_and_accumulation():
    grads = []
    for x in _pair(5):
        y = (x.sin() * x).sum()
        y.backward(retain_graph=True)
        y.backward()  # accumulates into x.grad
        grads.append(x.grad)
    _close(grads[1], grads[0])
    x = _pair(5)[1]
    y = (x * x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.backward()


def test_double_backward_and_hessian_vector_product():
    out = []
    for x in _pair(4):
        g = torch.autograd.grad((x.exp() * x.cos()).sum(), x, create_graph=True)[0]
        v = torch.ones_like(x)
        hvp = torch.autograd.grad(g, x, grad_outputs=v, create_graph=True)[0]
        third = torch.autograd.grad(hvp.sum(), x)[0]
        out.append((g, hvp, third))
    _close(out[1], out[0])


def test_grad_modes():
    x = _pair(3)[1]
    with torch.no_grad():
        y = x * 2
    assert not y.requires_grad
    with torch.inference_mode():
        z = x * 2
    assert z.is_inference() and not z.requires_grad
    with torch.enable_grad():
        w = x * 2
    assert w.requires_grad
    with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
        (z * x).sum().backward()


def _hooked_step(dev):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2)).double().to(dev)
    seen = []
    m[0].register_forward_pre_hook(lambda mod, args: seen.append("pre"))
    m[0].register_forward_hook(lambda mod, args, out: out * 2)  # replaces the output
    m[2].register_full_backward_hook(lambda mod, gin, gout: seen.append(("bwd", gout[0].device.type)))
    m[2].weight.register_post_accumulate_grad_hook(lambda p: seen.append("acc"))
    x = torch.linspace(-1, 1, 6, dtype=torch.float64).reshape(2, 3).to(dev).requires_grad_()
    x.register_hook(lambda g: g * 3)
    m(x).pow(2).sum().backward()
    return (x.grad, m[0].weight.grad, m[2].weight.grad), seen


def test_tensor_and_module_hooks():
    cpu_grads, cpu_seen = _hooked_step("cpu")
    grads, seen = _hooked_step("jax")
    _close(grads, cpu_grads)
    assert seen == [s if isinstance(s, str) else ("bwd", "jax") for s in cpu_seen]
    assert ("bwd", "jax") in seen


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_checkpoint_matches_plain_backward(use_reentrant):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.GELU(), torch.nn.Dropout(0.3), torch.nn.Linear(6, 6))
    m = m.double().to("jax")
    x = torch.randn(4, 6, dtype=torch.float64, device="jax", requires_grad=True)
    # checkpointing replays the forward with the same RNG state (dropout masks match)
    torch.manual_seed(1)
    checkpoint.checkpoint(m, x, use_reentrant=use_reentrant).square().sum().backward()
    ckpt = [p.grad.clone() for p in m.parameters()] + [x.grad.clone()]
    m.zero_grad()
    x.grad = None
    torch.manual_seed(1)
    m(x).square().sum().backward()
    plain = [p.grad for p in m.parameters()] + [x.grad]
    _close(ckpt, plain)


def test_detect_anomaly_names_the_backward_that_made_nan():
    x = torch.zeros(3, device="jax", requires_grad=True)
    with pytest.raises(RuntimeError, match="Function 'SqrtBackward0' returned nan values"):
        with pytest.warns(UserWarning), torch.autograd.detect_anomaly():
            (x.sqrt() * 0).sum().backward()


def _f(x):
    return (x.sin() * x.exp()).sum(-1)


def test_torch_func_grad_vmap_jacobians():
    cpu, jx = (x.detach() for x in _pair(3, 4))
    for fn in (
        lambda x: grad(lambda r: _f(r).sum())(x),
        lambda x: vmap(_f)(x),
        lambda x: vmap(grad(_f))(x),
        lambda x: jacrev(_f)(x),
        lambda x: jacfwd(_f)(x),
        lambda x: jacfwd(jacrev(lambda r: _f(r).sum()))(x[0]),  # a Hessian
        lambda x: vjp(_f, x)[1](torch.ones_like(x[:, 0])),
        lambda x: jvp(_f, (x,), (torch.ones_like(x),)),
    ):
        _close(fn(jx), fn(cpu))


def test_forward_mode_ad():
    outs = []
    for x in _pair(5):
        x = x.detach()
        with fwAD.dual_level():
            dual = fwAD.make_dual(x, torch.ones_like(x))
            y = torch.nn.functional.softplus(dual * dual).log_softmax(0)
            outs.append(fwAD.unpack_dual(y))
    _close(tuple(outs[1]), tuple(outs[0]))


def test_custom_autograd_function():
    class Cube(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x**3

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 3 * x * x * g

    grads = []
    for x in _pair(4):
        Cube.apply(x).sum().backward()
        grads.append(x.grad)
    _close(grads[1], grads[0])


@pytest.mark.parametrize("call", ["backward", "grad"])
def test_backward_on_the_second_device_from_another_thread(call):
    """NOTE [Backward on jax:N]: the engine's switch to the calling thread is per thread; a
    backward on jax:1 from a thread other than the one that started the device (Ray Train's
    training thread) hit the engine's internal assert on its device queues."""
    import threading

    torch.ones(1, device="jax")  # (the device starts on this thread)
    out = {}

    def work():
        try:
            x = torch.tensor([1.0, 2.0, 3.0], device="jax:1", requires_grad=True)
            y = (x * x).sum()
            out["grad"] = torch.autograd.grad(y, x)[0] if call == "grad" else (y.backward(), x.grad)[1]
            out["multithreading"] = torch._C._is_multithreading_enabled()
        except Exception as e:  # (re-raised on the test's thread)
            out["error"] = e

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    assert out["grad"].device == torch.device("jax:1")
    torch.testing.assert_close(out["grad"].cpu(), torch.tensor([2.0, 4.0, 6.0]))
    assert out["multithreading"]  # (the thread's own setting is left as it was)
