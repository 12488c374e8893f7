"""A fusion barrier for XLA:CPU: a value that XLA computes once, whatever reads it.

NOTE [Fusion barriers on XLA:CPU]: XLA:CPU's fusion copies an elementwise producer into
every fusion that reads it, however much work the producer is. A depthwise convolution
written out on the CPU (NOTE [Grouped convolutions on XLA:CPU] in ops/_conv) is a sum of
49 strided products for a 7x7 kernel, and in a fused graph of HF ConvNeXt's training
step its forward sum was recomputed inside 5-6 fusions (the permute to channels-last,
LayerNorm's statistics and its normalization, each reading the convolution's output),
its input gradient's inside 3-4. A strict op ends at the convolution, so it had none of
this: the fused step took 36-41 ms against strict's 25-33 (alternating processes), and
26-31 ms with the sums behind this barrier (strict unchanged). ``lax.optimization_barrier``
does not stop it (XLA:CPU drops the barrier before fusing); a loop over the kernel's rows
did, but made the strict step slower (35-50 ms).

``barrier(x)`` is an XLA custom call whose handler does nothing: its result aliases its
operand, so XLA writes x once into that buffer and every reader reads it. The handler
(``csrc/fusion_barrier.cc``) is built and loaded like the BLAS handler
(ffi/_cpu_blas); without it (no C++ compiler) ``barrier`` returns x. Only for values
computed on XLA:CPU: callers use it in a ``lax.platform_dependent`` CPU branch.
"""

from __future__ import annotations

import jax

from torch_jax.ffi import _build

_SOURCE = _build.CSRC / "fusion_barrier.cc"
_TARGET = "tj_fusion_barrier"
_handlers = _build.Handlers(lambda: _build.build(_SOURCE, [_TARGET]), "no fusion barriers on the CPU")


def status() -> str:
    """``"ok"`` when ``barrier`` is a custom call, else why it returns its argument."""
    _handlers.load()
    return _handlers.status


def barrier(x):
    """x, computed once on XLA:CPU rather than inside each fusion that reads it."""
    if not _handlers.load():
        return x
    return _barrier(x)


@jax.custom_jvp
def _barrier(x):
    result = jax.ShapeDtypeStruct(x.shape, x.dtype)
    return jax.ffi.ffi_call(_TARGET, result, input_output_aliases={0: 0}, vmap_method="broadcast_all")(x)


@_barrier.defjvp
def _barrier_jvp(primals, tangents):  # (the identity's: differentiable wherever it stands)
    return _barrier(primals[0]), tangents[0]
