"""Assertions on a tensor's value: ``torch._assert_async`` and its functional form, which
AOTAutograd's graphs hold. (``torch._check`` on sizes leaves ``_assert_scalar`` in
compiled graphs: a rule in compile/_rules.)

NOTE [Asserts are value checks]: ``_assert_async`` raises if its one-element tensor is
zero (False), "asynchronously" on CUDA: the kernel asserts on the device and the error
surfaces at a later synchronization. Here it is a value check of the computation
(NOTE [Deferred value checks] in runtime/_fused, ``_context.check``), as an index out of
range is, so each executor does what it does for every other value error: strict eager
reads the flag after the op (a host wait, which is what the CPU's kernel does: it reads
the value), fused eager and compiled graphs keep the flag in the graph's outputs and
raise at the next wait, as CUDA does, so a training step that asserts (TorchTitan's)
still runs as one graph. Reading the value at the op instead would cut every fused graph
there, and the CPU fallback reads it too and copies the tensor. The errors of the shape
(no elements, several) depend only on the shape, so they are raised at once, as on
CUDA, with the CPU's messages.
"""

from __future__ import annotations

import jax.numpy as jnp

from torch_jax.ops import _context
from torch_jax.ops._registry import aten, lower


def _check_nonzero(x, message: str) -> None:
    n = x.size
    if n == 0:
        raise RuntimeError("Boolean value of Tensor with no values is ambiguous")
    if n > 1:
        raise RuntimeError("Boolean value of Tensor with more than one value is ambiguous")
    # (``message`` is the user's text: braces are not format fields; NaN and a complex
    # number with one nonzero part are nonzero, as ``bool()`` says on the CPU)
    _context.check(jnp.all(x == 0), RuntimeError, message.replace("{", "{{").replace("}", "}}"))


@lower(aten._assert_async.default)
def assert_async(x):
    _check_nonzero(x, "Expected Tensor with single nonzero value, but got zero")


@lower(aten._assert_async.msg)
def assert_async_msg(x, assert_msg):
    _check_nonzero(x, assert_msg or "Assertion is failed")


@lower(aten._functional_assert_async.msg)
def functional_assert_async_msg(x, assert_msg, dep_token):
    # (the functional form that export and AOTAutograd make: the token orders the check
    # among the graph's effects; the CPU returns a copy of it)
    _check_nonzero(x, assert_msg or "Assertion is failed")
    return dep_token
