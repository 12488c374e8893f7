"""XLA compiler options per computation on the CPU: cheap compilation of small
computations, and which library runs convolutions; and one MLIR context for many of the
device's lowerings (:func:`lowering`), on every platform.

NOTE [Cheap compilation of small computations]: XLA:CPU compiles a computation in
30-45 ms, nearly all of it fixed cost (LLVM's code generation, and the MLIR fusion
emitters, which set up a pool of compiler instances per compilation), whatever the
computation: a strict op, or a fused graph of a few small ops. A computation over small
arrays (none of its inputs, outputs or fused graph's op results above 2^14 elements)
runs in microseconds however it is compiled, so it is compiled cheaply: with the fusion
emitters off (XLA:CPU's older LLVM emitters emit the same fusions) and LLVM at
optimization level 1. Measured on 100 small elementwise, reduction and slicing
computations: 36.0 ms each with XLA's defaults, 28.5 with the emitters off, 20.1 with
both; 673 float32 OpInfo tests ran in 187 against 271 s with the emitters off alone.
Both settings gave the same bits as XLA's defaults for exp, log, tanh, sin, erf, gelu,
pow, division, reductions, softmax, cumsum, sorts and conversions in float32 and float64
(200k inputs, special values included); complex multiplication differs in the last bit
(one emitter contracts it into fused multiply-adds). Larger computations keep XLA's
defaults: with the emitters off a 1024x2048 transpose took 7.5 against 1.0-1.4 ms,
argmax 2x as long, from about 256x256 on (at 128x128 and below the times were the same
within the calls' overhead), and the fused GPT-2 step ran 3-8% slower.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
import threading

import jax

from torch_jax.device import _state as _devices

SMALL_ELEMENTS = 1 << 14
SMALL_OPTIONS = {"xla_cpu_use_fusion_emitters": False, "xla_backend_optimization_level": 1}

# NOTE [Convolutions on XLA:CPU]: XLA:CPU hands products, convolutions and reductions to
# YNNPACK by default (its debug option xla_cpu_experimental_ynn_fusion_type lists
# INDIVIDUAL_DOT, INDIVIDUAL_CONVOLUTION and REDUCE in jax 0.10). For float32 (and
# float16 and bfloat16, which XLA:CPU convolves in float32) its own Eigen convolution is
# faster on this project's convolutions: forward and both backward convolutions of
# ResNet-18's layers at 64x64 took 2.6-3.3 against 4.5-5.2 ms, its stem 9.1 against 13.1
# ms, a 3x3 convolution over 8x64x56x56 24.6 against 40.9 ms; grouped, depthwise,
# dilated, 1-d, 3-d and input-dilated convolutions (as XLA runs them) took the same
# within noise; the fused ResNet-18 step 76-79 against 90-95 ms, strict 101-113 against
# 112-127 ms (alternating processes). Eigen has no float64 convolution: XLA emits a
# plain loop, 13x slower than YNNPACK's. So a computation with convolutions, none of
# them float64 (jax writes a complex64 one as float32 ones), keeps products and
# reductions on YNNPACK and leaves its convolutions to XLA; any other keeps XLA's
# defaults. The values differ from YNNPACK's in rounding only (relative 1e-6 in
# float32).
CONV_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_REDUCE"}
_CONVOLUTION = re.compile(r"stablehlo\.convolution\(.*->\s*tensor<(?:[\d?]+x)*(\w+)>\s*$", re.M)  # (its element type)
_EIGEN_CONVOLVES = {"f32", "f16", "bf16"}


def compile_options(index: int, inputs, shapes, lowered) -> dict | None:
    """The compiler options of a computation on jax:index with these inputs (arrays or
    Python scalars) whose other arrays (outputs, a graph's op results) have these shapes,
    lowered as `lowered` (None: XLA's defaults)."""
    if _devices.device(index).platform != "cpu":
        return None
    sizes = [math.prod(getattr(v, "shape", ())) for v in inputs] + [math.prod(s) for s in shapes]
    if max(sizes, default=0) <= SMALL_ELEMENTS:
        return _known(SMALL_OPTIONS)
    dtypes = set(_CONVOLUTION.findall(lowered.as_text()))
    if dtypes and dtypes <= _EIGEN_CONVOLVES:
        return _known(CONV_OPTIONS)
    return None


def _known(options: dict) -> dict | None:
    """The options of ``options`` that this jaxlib's XLA takes (NOTE [XLA options across
    jaxlib versions] in _compat), None if none."""
    kept = {name: value for name, value in options.items() if _option_known(name, value)}
    return kept or None


@functools.cache
def _option_known(name: str, value) -> bool:
    try:
        jax.jit(lambda x: x + 1).lower(1.0).compile(compiler_options={name: value})
    except Exception:  # (XLA's INVALID_ARGUMENT for an unknown option or value)
        return False
    return True


# NOTE [One MLIR context for many lowerings]: JAX lowers each computation into a new MLIR
# context (``jax._src.interpreters.mlir.make_ir_context``), and loading every dialect into
# it took 4.8 ms of the 12 ms that lowering a strict op took on the 2-core EPYC, of the
# 65 ms its whole compilation took. Inside :func:`lowering` a thread's lowerings share one
# context instead, a new one every ``IR_CONTEXT_USES`` lowerings: the types and attributes
# that MLIR uniques in a context live as long as it does, so a context is not kept for
# ever. Measured on nine ModuleInfos' cases (813 lowerings, alternating processes, the EPYC,
# 2026-12-07): a lowering took 6.0-6.2 against 9.9-11.4 ms, XLA's compilation after it
# about the same (39-40 ms), the cases 51-52 against 56-61 s in all, with the same
# resident memory at the end; with two pytest workers on the two cores (CI's), OpInfo's
# float32 tests took 125-131 against 131-135 s and ModuleInfo's float32 cases 107-117
# against 115 s. Nothing else changes: each module is built
# and compiled as before (the persistent cache's keys hash the module, not its context).
# Only the device's own computations share contexts (strict ops, fused graphs,
# torch.compile graphs), not a user's own ``jax.jit``; the context a lowering holds stays
# alive through its module after it is replaced here.
IR_CONTEXT_USES = 256
_ir = threading.local()
_fresh_context = None  # (JAX's own make_ir_context, once replaced)
_replaced: bool | None = None


@contextlib.contextmanager
def lowering():
    """JAX's lowerings on this thread, inside, share an MLIR context (NOTE [One MLIR context
    for many lowerings])."""
    global _replaced
    if _replaced is None:
        _replaced = _share_contexts()
    if not _replaced:
        yield
        return
    _ir.depth = getattr(_ir, "depth", 0) + 1
    try:
        yield
    finally:
        _ir.depth -= 1


def _make_ir_context():
    if not getattr(_ir, "depth", 0):
        return _fresh_context()
    context = getattr(_ir, "context", None)
    if context is None or _ir.uses >= IR_CONTEXT_USES:
        context = _ir.context = _fresh_context()
        _ir.uses = 0
    _ir.uses += 1
    return context


def _share_contexts() -> bool:
    """Put :func:`_make_ir_context` in JAX's place, once; False where this JAX has no
    ``make_ir_context`` to replace (then every lowering makes its own, as JAX does)."""
    global _fresh_context
    try:
        from jax._src.interpreters import mlir
    except ImportError:
        return False
    made = getattr(mlir, "make_ir_context", None)
    if made is None or not callable(made):
        return False
    if made is not _make_ir_context:
        _fresh_context = made
        mlir.make_ir_context = _make_ir_context
    return True
