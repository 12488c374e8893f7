"""XLA compiler options per computation: cheap compilation of small computations on the
CPU.

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

import math

from torch_jax.device import _state as _devices

SMALL_ELEMENTS = 1 << 14
SMALL_OPTIONS = {"xla_cpu_use_fusion_emitters": False, "xla_backend_optimization_level": 1}


def compile_options(index: int, inputs, shapes) -> dict | None:
    """The compiler options of a computation on jax:index with these inputs (arrays or
    Python scalars) whose other arrays (outputs, a graph's op results) have these shapes
    (None: XLA's defaults)."""
    if _devices.device(index).platform != "cpu":
        return None
    sizes = [math.prod(getattr(v, "shape", ())) for v in inputs] + [math.prod(s) for s in shapes]
    return SMALL_OPTIONS if max(sizes, default=0) <= SMALL_ELEMENTS else None
