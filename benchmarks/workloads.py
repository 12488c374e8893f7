"""The workloads of the benchmark suite (``python -m benchmarks``).

Each workload is ``setup(device, compiled)`` returning a function that runs one
iteration: ``device`` is ``"cpu"`` or ``"jax"``, ``compiled`` asks for the
``torch.compile`` version of the same program (its default backend: Inductor on the CPU;
on jax the default routes to the ``jax`` backend, NOTE [The default torch.compile on jax]). ``inner`` is how many
iterations one timed repeat runs; ``step`` says that one iteration is a whole step of a
program (fused mode then marks the step after it, as a training loop does with
``torch_jax.mark_step()``); ops that are not steps are left to accumulate in fused mode.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    group: str  # "ops", "training", "generation" or "kernels"
    setup: Callable
    inner: int
    step: bool = True


def _maybe_compile(fn, compiled: bool):
    return torch.compile(fn) if compiled else fn


def _small_op(name: str):
    def setup(device, compiled):
        g = torch.Generator().manual_seed(0)
        a = torch.randn(16, generator=g).to(device)
        b = torch.randn(16, generator=g).to(device)
        fns = {
            "add": lambda: a + b,
            "mul_scalar": lambda: a * 1.5,
            "relu": lambda: torch.relu(a),
            "exp": lambda: torch.exp(a),
            "add_ (in-place)": lambda: a.add_(b, alpha=1e-6),
            "sum": lambda: a.sum(),
        }
        return _maybe_compile(fns[name], compiled)

    return setup


def matmul_512(device, compiled):
    """A chain x <- x @ w: each product depends on the last, as in a real program (50
    products of the same two matrices would be one product to a compiler that sees
    them all, as fused eager does)."""
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(512, 512, generator=g) / 512**0.5).to(device)
    state = [torch.randn(512, 512, generator=g).to(device)]
    mm = _maybe_compile(torch.mm, compiled)

    def step():
        state[0] = mm(state[0], w)
        return state[0]

    return step


def _train_step(model, opt, loss_fn, compiled):
    """One optimizer step of ``loss_fn(model)``; with ``compiled`` the model's forward
    (and so its backward) and the optimizer's step are compiled (``torch.compile`` with
    its default backend: Inductor on the CPU, the ``jax`` backend on jax), as PyTorch's
    compiled-optimizer recipe does."""
    forward = torch.compile(model) if compiled else model
    update = torch.compile(opt.step) if compiled else opt.step

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(forward).backward()
        update()

    return step


def mlp_step(device, compiled):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(128, 784, generator=g).to(device)
    y = torch.randint(0, 10, (128,), generator=g).to(device)
    return _train_step(model, opt, lambda m: F.cross_entropy(m(x), y), compiled)


def resnet_step(device, compiled):
    import transformers

    torch.manual_seed(0)
    config = transformers.ResNetConfig(
        embedding_size=64, hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2], layer_type="basic", num_labels=10
    )
    model = transformers.ResNetForImageClassification(config).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 3, 64, 64, generator=g).to(device)
    y = torch.randint(0, 10, (16,), generator=g).to(device)
    return _train_step(model, opt, lambda m: m(pixel_values=x, labels=y).loss, compiled)


def _gpt2_config():
    import transformers

    return transformers.GPT2Config(vocab_size=8192, n_positions=128, n_embd=256, n_layer=4, n_head=4)


def gpt2_step(device, compiled):
    import transformers

    torch.manual_seed(0)
    config = _gpt2_config()
    model = transformers.GPT2LMHeadModel(config).to(device)
    # (the loss named: otherwise transformers logs a warning from inside its loss property,
    # which breaks torch.compile's graph there, Inductor's as well)
    model.loss_type = "ForCausalLM"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (8, 128), generator=g).to(device)
    return _train_step(model, opt, lambda m: m(input_ids=ids, labels=ids).loss, compiled)


def gpt2_generate(device, compiled):
    """Greedy generation of 32 tokens after a 16-token prompt, batch 1, static KV cache."""
    import transformers

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(_gpt2_config()).to(device).eval()
    if compiled:
        model.forward = torch.compile(model.forward)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 8192, (1, 16), generator=g).to(device)

    def generate():
        with torch.no_grad():
            return model.generate(
                prompt, max_new_tokens=32, min_new_tokens=32, do_sample=False,
                cache_implementation="static", pad_token_id=0,
            )  # fmt: skip

    return generate


def _example(name: str):
    """An example of ``examples/`` as a module (its ops are defined once a process)."""
    import importlib.util
    import sys
    from pathlib import Path

    module = sys.modules.get(f"examples_{name}")
    if module is None:
        path = Path(__file__).resolve().parents[1] / "examples" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(f"examples_{name}", path)
        module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


def _kernel_softmax(kernel: bool):
    """Softmax over the rows of a 256x1024 matrix, a chain x <- softmax(x) * 256 (each call
    depends on the last, as in ``matmul_512``: fused eager would otherwise compute 50 calls
    on one input once): with ``kernel``, on jax, the Pallas kernel of
    examples/pallas_softmax.py (its op); else the device's own lowering. PyTorch's own
    kernel on the CPU either way."""

    def setup(device, compiled):
        state = [torch.randn(256, 1024, generator=torch.Generator().manual_seed(0)).to(device)]
        if kernel and device == "jax":
            _example("pallas_softmax")
            softmax = torch.ops.examples.softmax
        else:
            softmax = torch.softmax
        fn = _maybe_compile(lambda x: softmax(x, -1) * 256, compiled)

        def step():
            state[0] = fn(state[0])
            return state[0]

        return step

    return setup


def _kernel_adamw(kernel: bool):
    """One AdamW step over a 4-layer 512-wide MLP's parameters (gradients set once): with
    ``kernel``, on jax, the JAX operator of examples/jax_adamw.py; else torch.optim.AdamW
    (its default, foreach) on either device."""

    def setup(device, compiled):
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Linear(512, 512) for _ in range(4)]).to(device)
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 1e-3
        if kernel and device == "jax":
            opt = _example("jax_adamw").JaxAdamW(model.parameters(), lr=1e-4)
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        return torch.compile(opt.step) if compiled else opt.step

    return setup


WORKLOADS = [
    *[
        Workload(f"small op: {n} (16 floats)", "ops", _small_op(n), 2000, step=False)
        for n in ("add", "mul_scalar", "relu", "exp", "add_ (in-place)", "sum")
    ],
    Workload("matmul 512x512 fp32 (a chain x @ w)", "ops", matmul_512, 50, step=False),
    Workload("MLP 784-512-512-10 step, SGD, batch 128", "training", mlp_step, 20),
    Workload("HF ResNet-18 step (64x64, batch 16), SGD momentum", "training", resnet_step, 3),
    Workload("GPT-2-style step (4 layers, d=256, seq 128, batch 8), AdamW", "training", gpt2_step, 3),
    Workload("GPT-2-style greedy generation (16 + 32 tokens, static cache)", "generation", gpt2_generate, 1),
    Workload("kernel: softmax 256x1024, the device's lowering", "kernels", _kernel_softmax(False), 50, step=False),
    Workload("kernel: softmax 256x1024, the Pallas example's op", "kernels", _kernel_softmax(True), 50, step=False),
    Workload("kernel: AdamW step, 4x512x512, torch.optim.AdamW", "kernels", _kernel_adamw(False), 10),
    Workload("kernel: AdamW step, 4x512x512, the JAX example's op", "kernels", _kernel_adamw(True), 10),
]
