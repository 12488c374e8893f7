"""Matrix products: mm, bmm, addmm, baddbmm, addbmm, mv, dot, outer products.

Precision follows ``torch.get_float32_matmul_precision()`` ("highest", PyTorch's
default, is exact float32 on every backend; "high"/"medium" allow TF32/bf16 passes),
read when the op is compiled. float16/bfloat16 products accumulate in float32.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from torch_jax.ffi import _cpu_blas, _fusion_barrier
from torch_jax.ops._promote import cast, promote
from torch_jax.ops._registry import aten, lower

_PRECISION = {"highest": lax.Precision.HIGHEST, "high": lax.Precision.HIGH, "medium": lax.Precision.DEFAULT}
_LOW = (np.dtype(jnp.float16), np.dtype(jnp.bfloat16))


def _dot(a, b, contract, batch=((), ())):
    out = a.dtype
    acc = jnp.float32 if out in _LOW else None
    r = lax.dot_general(
        a,
        b,
        (contract, batch),
        precision=_PRECISION[torch.get_float32_matmul_precision()],
        preferred_element_type=acc,
    )
    return r.astype(out)


def matmul2d(a, b):
    blas = _cpu_blas.matmul(a, b)  # (None where XLA's dot computes it)
    if blas is not None:
        return blas
    if a.dtype == np.float32 and _cpu_blas.untransposed(a)[1] and not _cpu_blas.untransposed(b)[1]:
        return lax.platform_dependent(a, b, cpu=_transposed_lhs_on_cpu, default=_plain_matmul)
    if a.shape[0] == 1 or b.shape[1] == 1:
        return lax.platform_dependent(a, b, cpu=_vector_product_on_cpu, default=_plain_matmul)
    return _plain_matmul(a, b)


def _vector_product_on_cpu(a, b):
    """``a @ b`` where one side is a single row or column (a decoding step's products).

    NOTE [Vector products on XLA:CPU]: XLA:CPU computes a small vector-matrix product as a
    loop fusion, one output element per iteration, and fuses the vector's elementwise
    producers into it, so they run again for every output element. In a fused graph of
    GPT-2's greedy decoding the final LayerNorm (256 elements) ran 8192 times inside the
    tied LM head's product; with the vector behind a fusion barrier (NOTE [Fusion barriers
    on XLA:CPU] in ffi/_fusion_barrier) it runs once, and the whole token's graph took
    0.66 against 1.09 ms when run alone. Larger products call a GEMM kernel, which reads
    computed operands."""
    if a.shape[0] == 1:
        return _plain_matmul(_fusion_barrier.barrier(a), b)
    return _plain_matmul(a, _fusion_barrier.barrier(b))


def _plain_matmul(a, b):
    return _dot(a, b, ((1,), (0,)))


def _transposed_lhs_on_cpu(a, b):
    """``a @ b`` where ``a`` is a transpose (``x.t() @ grad``: every weight gradient).

    NOTE [Weight gradients on XLA:CPU]: XLA folds a transpose into the product that reads
    it, and XLA:CPU runs a product whose left operand is contracted along its leading
    dimension with its own dot kernel, not YNNPACK, at about half the speed (2-core AMD
    EPYC, float32: 1024x1024 @ 1024x256 3.05 ms, the GPT-2 step's LM-head gradient
    8192x1024 @ 1024x256 20.5 ms). Behind an optimization barrier, so that it is not
    folded, the smaller of two copies is made instead: the transposed operand itself, or
    the other operand transposed with the product computed transposed and turned back
    (1.84-1.87 and 13.5 ms). Other platforms' products take transposes for free."""
    m, k = a.shape
    n = b.shape[1]
    if m * k <= n * k + m * n:
        return _plain_matmul(lax.optimization_barrier(a), b)
    return lax.optimization_barrier(_plain_matmul(lax.optimization_barrier(b.T), a.T)).T


def bmm3d(a, b):
    return _dot(a, b, ((2,), (1,)), ((0,), (0,)))


def _scaled_add(beta, inp, alpha, prod):
    # beta == 0 ignores inp entirely (NaN in inp does not propagate), as in PyTorch
    scaled = jnp.where(beta == 0, jnp.zeros_like(inp), inp * cast(beta, inp.dtype))
    return scaled + cast(alpha, prod.dtype) * prod


@lower(aten.mm.default)
def mm(a, b):
    return matmul2d(a, b)


@lower(aten.bmm.default)
def bmm(a, b):
    return bmm3d(a, b)


@lower(aten.addmm.default)
def addmm(inp, a, b, beta=1, alpha=1):
    return _scaled_add(beta, inp.astype(a.dtype), alpha, matmul2d(a, b))


@lower(aten.baddbmm.default)
def baddbmm(inp, a, b, beta=1, alpha=1):
    return _scaled_add(beta, inp.astype(a.dtype), alpha, bmm3d(a, b))


@lower(aten.addbmm.default)
def addbmm(inp, a, b, beta=1, alpha=1):
    prod = bmm3d(a, b).sum(axis=0).astype(a.dtype)
    return _scaled_add(beta, inp.astype(a.dtype), alpha, prod)


@lower(aten.mv.default)
def mv(a, v):
    return _dot(a, v, ((1,), (0,)))


@lower(aten.addmv.default)
def addmv(inp, a, v, beta=1, alpha=1):
    return _scaled_add(beta, inp.astype(a.dtype), alpha, mv(a, v))


@lower(aten.dot.default)
def dot(a, b):
    return _dot(a, b, ((0,), (0,)))


@lower(aten.vdot.default)
def vdot(a, b):
    return _dot(jnp.conj(a), b, ((0,), (0,)))


@lower(aten.addr.default)
def addr(inp, v1, v2, beta=1, alpha=1):
    (inp, v1, v2), out = promote(inp, v1, v2)
    prod = v1[:, None] * v2[None, :]
    if out == np.dtype(np.bool_):
        return jnp.logical_or(jnp.logical_and(inp, beta), jnp.logical_and(prod, alpha))
    return cast(_scaled_add(beta, inp, alpha, prod), out)
