"""A Pallas kernel as a PyTorch operator on the ``jax`` device: a row softmax.

The kernel is written once in Pallas, JAX's kernel language. On a GPU or TPU Pallas
compiles it for the chip; on the CPU it runs in Pallas's interpret mode (the same
kernel, traced as JAX ops). JAX cannot differentiate a ``pallas_call``, so the kernel
brings its backward as a ``jax.custom_vjp`` (here in plain JAX: dx = y * (g - sum(g * y))).
``torch_jax.jax_op`` makes it ``torch.ops.examples.softmax``: it runs in strict and
fused eager and inside ``torch.compile`` graphs, with autograd. The example also puts the
kernel in place of the device's own softmax lowering (``torch_jax.override``), checked
against it first (``torch_jax.check_override``), so that ``F.softmax`` in any model runs
the kernel.

    python examples/pallas_softmax.py
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import torch
import torch.nn.functional as F
from jax.experimental import pallas as pl

import torch_jax

BLOCK_ROWS = 8


def _kernel(x_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)  # (half precision in, float32 inside, as PyTorch's kernels)
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = (e / jnp.sum(e, axis=-1, keepdims=True)).astype(o_ref.dtype)


def _softmax_rows(x: jax.Array) -> jax.Array:
    """Softmax of each row of a 2-D array: one program per block of rows."""
    rows, cols = x.shape
    block = min(rows, BLOCK_ROWS)
    spec = pl.BlockSpec((block, cols), lambda i: (i, 0))
    return pl.pallas_call(
        _kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(pl.cdiv(rows, block),),
        in_specs=[spec],
        out_specs=spec,
        interpret=jax.default_backend() == "cpu",
    )(x)


@jax.custom_vjp
def softmax_last(x: jax.Array) -> jax.Array:
    """Softmax over the last dim, any rank (the kernel on the rows of a 2-D view)."""
    if x.ndim == 0 or x.size == 0:
        return jax.nn.softmax(x, axis=-1) if x.ndim else jnp.ones_like(x)
    return _softmax_rows(x.reshape(-1, x.shape[-1])).reshape(x.shape)


def _forward(x):
    y = softmax_last(x)
    return y, y


def _backward(y, g):
    y32, g32 = y.astype(jnp.float32), g.astype(jnp.float32)
    return ((y32 * (g32 - jnp.sum(g32 * y32, axis=-1, keepdims=True))).astype(y.dtype),)


softmax_last.defvjp(_forward, _backward)


def softmax_jax(x: jax.Array, dim: int = -1) -> jax.Array:
    return jnp.moveaxis(softmax_last(jnp.moveaxis(x, dim, -1)), -1, dim)


# torch.ops.examples.softmax(x, dim): the kernel as a PyTorch operator
softmax = torch_jax.jax_op("examples::softmax", softmax_jax)


def softmax_lowering(x, dim, half_to_float):
    """The kernel in the shape of ``aten._softmax``'s lowering (its schema's arguments:
    ``half_to_float`` asks for a float32 result of a half input)."""
    y = softmax_jax(x, dim)
    return y.astype(jnp.float32) if half_to_float else y


def _time(fn, *args, repeats: int = 20) -> float:
    fn(*args)
    torch.jax.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args)
        torch.jax.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--cols", type=int, default=512)
    args = parser.parse_args()
    print(
        f"device jax ({jax.default_backend()}, Pallas {'interpret mode' if jax.default_backend() == 'cpu' else 'compiled'})"
    )

    torch.manual_seed(0)
    x = torch.randn(args.rows, args.cols)
    xj = x.to("jax").requires_grad_()
    y = torch.ops.examples.softmax(xj, -1)
    weights = torch.randn(args.rows, args.cols)
    (y * weights.to("jax")).sum().backward()

    x64 = x.double().requires_grad_()
    ref = torch.softmax(x64, -1)
    (ref * weights.double()).sum().backward()
    x32 = x.clone().requires_grad_()
    cpu = torch.softmax(x32, -1)
    (cpu * weights).sum().backward()
    for what, got, on_cpu, exact in (("values", y, cpu, ref), ("gradients", xj.grad, x32.grad, x64.grad)):
        ours = (got.detach().cpu().double() - exact).abs().max().item()
        theirs = (on_cpu.detach().double() - exact).abs().max().item()
        print(f"{what}: largest distance from float64 {ours:.2e} (PyTorch CPU float32: {theirs:.2e})")

    report = torch_jax.check_override(torch.ops.aten._softmax.default, softmax_lowering, x.to("jax"), -1, False)
    print(f"check against the default lowering: {report}")
    with torch_jax.override(torch.ops.aten._softmax.default, softmax_lowering):
        via_functional = F.softmax(x.to("jax"), dim=-1)
    print(f"F.softmax with the kernel in place: largest difference {(via_functional.cpu() - cpu).abs().max():.2e}")

    xt = x.to("jax")
    kernel = _time(lambda a: torch.ops.examples.softmax(a, -1), xt)
    default = _time(lambda a: torch.softmax(a, -1), xt)
    print(f"time: kernel {kernel * 1e3:.3f} ms, default lowering {default * 1e3:.3f} ms ({kernel / default:.2f}x)")


if __name__ == "__main__":
    main()
