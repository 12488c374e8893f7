"""2-D matrix products on XLA:CPU through the BLAS that PyTorch's CPU build ships.

NOTE [Matrix products through PyTorch's BLAS]: on Intel's CPUs XLA:CPU's own matrix
kernels run 1.15-1.35x slower than MKL, which PyTorch's x86 CPU build links and exports
(measured on a 2-core AVX-512 Xeon, a chain of products inside one XLA computation, per product:
128x512 @ 512x512 301-319 us against PyTorch's 255-264; 1024x256 @ 256x256 611-654 against
471-495; 1024^3 8.4 against 7.1-7.2 ms). So on the CPU a float32 or float64 2-D product is
an XLA custom call (the typed FFI) whose handler calls that BLAS's ``sgemm_``/``dgemm_``
(the same products: 244-318, 473-494 and 7.2-8.0 us/ms). The product stays inside the op's
or the fused graph's one XLA computation, between XLA's fused elementwise kernels; other
platforms lower the same primitive to XLA's dot. A transpose feeding the product (a weight
``w.t()``, the ``grad.t()`` of a weight gradient) becomes the BLAS's transpose flag instead
of a copy: the primitive is bound with the transpose's operand when the traced value was
made by ``lax.transpose``. The BLAS runs single-threaded in blocks on XLA's own threads
(``csrc/cpu_gemm.cc`` says why).

Only fused graphs call the BLAS (``in_graph``, around a graph's compilation); strict
mode's ops keep XLA's dot. XLA's CPU client runs a computation inline, on the calling
thread, when its cost analysis counts fewer than 1000 flops, and it counts a custom call
as none: a strict ``mm`` through the BLAS returned only once computed (1024^3: 8.7 ms
later, against 1.0 ms for XLA's dot), which ends asynchronous dispatch for it. A fused
graph counts its elementwise work, so it stays asynchronous unless it holds little
besides products. In one process, alternating with XLA's dot (two runs): the fused GPT-2
step 273.0 -> 260.8 and 299.0 -> 289.7 ms (PyTorch's 280.4 and 302.8), the 512x512 product
chain 1.14 -> 1.11 and 1.22 -> 1.18 ms, the MLP step the same within noise.

Only on Intel's CPUs, by default: MKL runs slower kernels on other vendors' x86 CPUs,
where XLA's dot (YNNPACK) is the faster one. On a 2-core AMD EPYC with AVX-512 (Zen 5,
2026-12-03), the GPT-2 step's three LM-head products (1024x256 @ 256x8192 and its two
gradients) took 51-54 ms in one XLA computation with XLA's dot, 78-83 ms through the BLAS
call and 72-79 ms in PyTorch; the benchmark suite's fused GPT-2 step 223 and 230 ms with
XLA's dot against 311 and 333 ms with the BLAS call (PyTorch 301-404 ms in the same runs),
the MLP step 3.30 and 3.78 against 6.04 and 5.18 ms (PyTorch 3.25-4.02 ms). On a 2-core
AMD EPYC with AVX2 only (2026-12-02) the two flipped between runs. ``config.cpu_blas``
(``TORCH_JAX_CPU_BLAS=1`` or ``0``) overrides the vendor's default.

The handler (``csrc/cpu_gemm.cc``) is compiled with the machine's C++ compiler against
jaxlib's FFI headers the first time a product is compiled, into a cache directory
(``$TORCH_JAX_CACHE_DIR``, else ``$XDG_CACHE_HOME/torch_jax`` or ``~/.cache/torch_jax``),
keyed by the source and jaxlib's version. Without a compiler or without the BLAS symbols
(a torch build without MKL), products use XLA's dot; ``status()`` says which and why.
Batched products stay on XLA's dot (it is faster than a loop of BLAS calls on
attention-sized batches), and so do other dtypes, empty products and products past the
BLAS's 32-bit sizes. ``config.cpu_blas`` is read when a product is compiled (it is part
of a fused graph's cache key; an op that strict mode compiled before keeps its choice).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading

import jax
import numpy as np
from jax import lax

try:  # (JAX internals: where they move, products use XLA's dot)
    from jax._src.core import ShapedArray
    from jax._src.interpreters.partial_eval import DynamicJaxprTracer
except ImportError:
    ShapedArray = DynamicJaxprTracer = None
from jax.extend import core
from jax.interpreters import mlir

from torch_jax._config import config
from torch_jax.ffi._build import CSRC, Handlers, build

_SOURCE = CSRC / "cpu_gemm.cc"
_TARGETS = {np.dtype(np.float32): "tj_gemm_f32", np.dtype(np.float64): "tj_gemm_f64"}
_INT_MAX = 2**31 - 1


def status() -> str:
    """``"ok"`` when fused graphs' float32/float64 2-D products on the CPU call the BLAS,
    else the reason they use XLA's dot (tries the build if it has not been tried)."""
    _handlers.load()
    return _handlers.status


def _open_blas():
    if DynamicJaxprTracer is None:
        raise RuntimeError("this JAX has no jax._src DynamicJaxprTracer/ShapedArray")
    import torch

    blas = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
    try:
        fns = blas.sgemm_, blas.dgemm_, blas.MKL_Set_Num_Threads_Local
    except AttributeError:
        raise RuntimeError("this torch build exports no MKL (sgemm_, dgemm_, MKL_Set_Num_Threads_Local)") from None
    lib = build(_SOURCE, _TARGETS.values())
    lib.tj_set_blas(*(ctypes.cast(f, ctypes.c_void_p) for f in fns))
    return lib


_handlers = Handlers(_open_blas, "matrix products use XLA's dot")


def _xla_dot(a, b, *, trans_a, trans_b):
    a, b = (a.T if trans_a else a), (b.T if trans_b else b)
    return lax.dot_general(a, b, (((1,), (0,)), ((), ())), precision=lax.Precision.HIGHEST)


def _abstract(a, b, *, trans_a, trans_b):
    return ShapedArray((a.shape[1] if trans_a else a.shape[0], b.shape[0] if trans_b else b.shape[1]), a.dtype)


gemm_p = core.Primitive("torch_jax_gemm")
gemm_p.def_abstract_eval(_abstract)
gemm_p.def_impl(_xla_dot)
_xla_lowering = mlir.lower_fun(_xla_dot, multiple_results=False)
mlir.register_lowering(gemm_p, _xla_lowering)


def _cpu_lowering(ctx, a, b, *, trans_a, trans_b):
    if not _handlers.load():
        return _xla_lowering(ctx, a, b, trans_a=trans_a, trans_b=trans_b)
    target = _TARGETS[np.dtype(ctx.avals_in[0].dtype)]
    return jax.ffi.ffi_lowering(target)(ctx, a, b, trans_a=np.int32(trans_a), trans_b=np.int32(trans_b))


mlir.register_lowering(gemm_p, _cpu_lowering, platform="cpu")


def untransposed(x):
    """(operand, transposed): the array a traced 2-D transpose was made from, if it was;
    through a chain of transposes (a transposed view read, then transposed again by the
    graph: a compiled backward's ``t(t(w))``), the array at its start."""
    transposed = False
    while True:
        eqn = getattr(x, "parent", None)  # (the tracing equation that made x: JAX internals,
        # so anything unexpected just keeps x)
        if eqn is None or getattr(eqn, "primitive", None) is not lax.transpose_p:
            return x, transposed
        if tuple(eqn.params.get("permutation", ())) != (1, 0) or len(eqn.in_tracers) != 1:
            return x, transposed
        src = eqn.in_tracers[0]
        if type(src) is not DynamicJaxprTracer:
            return x, transposed
        x, transposed = src, not transposed


_tracing = threading.local()


@contextlib.contextmanager
def in_graph():
    """Products traced inside the block (a fused graph's) may call the BLAS."""
    before = getattr(_tracing, "graph", False)
    _tracing.graph = True
    try:
        yield
    finally:
        _tracing.graph = before


def matmul(a, b):
    """``a @ b`` for 2-D float32/float64 operands through the BLAS primitive, or None
    where XLA's dot should compute it (see the NOTE)."""
    if not config.cpu_blas or not getattr(_tracing, "graph", False):
        return None
    if type(a) is not DynamicJaxprTracer or type(b) is not DynamicJaxprTracer:
        return None
    dtype = np.dtype(a.dtype)
    if dtype not in _TARGETS or np.dtype(b.dtype) != dtype or a.ndim != 2 or b.ndim != 2:
        return None
    m, k = a.shape
    n = b.shape[1]
    if not (0 < m and 0 < k and 0 < n and max(m * k, k * n, m * n) <= _INT_MAX):  # (LP64 BLAS)
        return None
    a, trans_a = untransposed(a)
    b, trans_b = untransposed(b)
    return gemm_p.bind(a, b, trans_a=trans_a, trans_b=trans_b)
