"""Factories (arange, full, eye, linspace, ...) and random number ops.

Random ops draw from the device generator (NOTE [Device RNG] in device/_state):
``torch.manual_seed`` fixes their numbers, every call gets a fresh key.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from torch_jax import _compat
from torch_jax.ops import _context
from torch_jax.ops._promote import cast
from torch_jax.ops._registry import aten, lower


@lower(aten.arange.start_step, static=("start", "end", "step"))
def arange(start, end=None, step=1, dtype=None, layout=None, device=None, pin_memory=None):
    out = _context.out_dtype()
    n = max(0, math.ceil((end - start) / step))
    if np.issubdtype(out, np.integer):
        # the CPU's integer arange works in int64 (its accumulate type): start and step
        # truncate toward zero, and before torch 2.14 int64 outputs even count in int64
        # (aten/src/ATen/native/RangeFactories.cpp; NOTE [int64 arange's length] in _compat)
        start_i, step_i = int(start), int(step)
        if out == np.int64 and step_i != 0 and _compat.int64_arange_counts_in_int64():
            sgn = (step_i > 0) - (step_i < 0)
            num = int(end) - start_i + step_i - sgn
            n = max(0, abs(num) // abs(step_i) * (1 if (num < 0) == (step_i < 0) else -1))
        return (start_i + jnp.arange(n, dtype=jnp.int64) * step_i).astype(out)
    # PyTorch computes start + i * step in double for floating outputs
    return (start + jnp.arange(n, dtype=jnp.float64) * step).astype(out)


# NOTE [arange without its out= form]: PyTorch's arange(end) and arange(start, end) call
# the C++ arange(start, end, step) as a function, not through the dispatcher, and that
# makes an empty tensor and calls arange.start_out: an allocation, a resize and a copy
# around the op (27 against 12 us a call; HF's masks call it a few times a token).
# Lowered here, the dispatcher sends them straight to the lowering.
@lower(aten.arange.default, static=("end",))
def arange_end(end, dtype=None, layout=None, device=None, pin_memory=None):
    return arange(0, end)


@lower(aten.arange.start, static=("start", "end"))
def arange_start(start, end, dtype=None, layout=None, device=None, pin_memory=None):
    return arange(start, end)


@lower(aten.range.step, static=("start", "end", "step"))
def range_(start, end, step=1, dtype=None, layout=None, device=None, pin_memory=None):
    """The deprecated ``torch.range``: ``end`` included; PyTorch counts the elements and
    computes them in the accumulate type (int64 or double)."""
    out = _context.out_dtype()
    if np.issubdtype(out, np.integer):
        # (the meta kernel has checked that (end - start) / step >= 0)
        start, end, step = int(start), int(end), int(step)
        return (start + jnp.arange((end - start) // step + 1, dtype=jnp.int64) * step).astype(out)
    n = int((end - start) / step + 1)
    return (start + jnp.arange(n, dtype=jnp.float64) * step).astype(out)


@lower(aten.range.default, static=("start", "end"))
def range_unit_step(start, end, dtype=None, layout=None, device=None, pin_memory=None):
    return range_(start, end)


@lower(aten.full.default)
def full(size, fill_value, dtype=None, layout=None, device=None, pin_memory=None):
    out = _context.out_dtype()
    return jnp.full(tuple(size), cast(fill_value, out), out)


@lower(aten.scalar_tensor.default)
def scalar_tensor(s, dtype=None, layout=None, device=None, pin_memory=None):
    return cast(s, _context.out_dtype())


@lower(aten.eye.m)
def eye(n, m, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.eye(n, m, dtype=_context.out_dtype())


@lower(aten.eye.default)
def eye_square(n, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.eye(n, dtype=_context.out_dtype())


@lower(aten.linspace.default, static=("start", "end"))
def linspace(start, end, steps, dtype=None, layout=None, device=None, pin_memory=None):
    out = _context.out_dtype()
    if np.issubdtype(out, np.integer):
        # the CPU converts start and end to the integer dtype first (linspace(4.3, -3)
        # runs from 4), then steps in double and truncates
        start, end = (int(np.array(int(v)).astype(out)) for v in (start, end))
        return jnp.trunc(_linspace_values(start, end, steps)).astype(out)
    return _linspace_values(start, end, steps).astype(out)


def _linspace_values(start, end, steps):
    """linspace in double; PyTorch fills the first half from start and the second from end."""
    if steps == 1:
        return jnp.full((1,), start, jnp.float64)
    step = (end - start) / max(steps - 1, 1)
    i = jnp.arange(steps, dtype=jnp.float64)
    half = steps // 2
    return jnp.where(i < half, start + step * i, end - step * (steps - 1 - i))


@lower(aten.logspace.default, static=("start", "end", "base"))
def logspace(start, end, steps, base=10.0, dtype=None, layout=None, device=None, pin_memory=None):
    out = _context.out_dtype()
    if not np.issubdtype(out, np.integer):
        return jnp.power(jnp.float64(base), _linspace_values(start, end, steps)).astype(out)
    # integer outputs: the CPU kernel converts start and end to the dtype first (wrapping),
    # and the powers through int64 (wrapping again)
    start, end = (int(np.array(int(v)).astype(out)) for v in (start, end))
    vals = jnp.power(jnp.float64(base), _linspace_values(start, end, steps))
    # out of int64's range the x86 conversion gives INT64_MIN (XLA's would saturate)
    wide = jnp.where(jnp.abs(vals) < 2.0**63, jnp.trunc(vals), -(2.0**63)).astype(jnp.int64)
    return wide.astype(out)


@lower(aten._efficientzerotensor.default)
def efficientzerotensor(size, dtype=None, layout=None, device=None, pin_memory=None):
    # autograd's zero gradients (sgn, view_as_real...); a plain zero tensor behaves the same
    return jnp.zeros(tuple(size), _context.out_dtype())


# ---------------------------------------------------------------- random


def _acc(dtype):
    """The dtype random numbers are drawn in: float32 for the half types, the real part's
    dtype for complex (real and imaginary parts are drawn independently, as on CPU)."""
    dtype = np.dtype(dtype)
    if dtype in (np.dtype(jnp.float16), np.dtype(jnp.bfloat16)):
        return np.dtype(np.float32)
    if np.issubdtype(dtype, np.complexfloating):
        return np.dtype(np.float64 if dtype == np.complex128 else np.float32)
    return dtype


def _draw(sample, shape, dtype):
    """``sample(key, shape, acc)`` as ``dtype``; complex dtypes draw both parts."""
    key = _context.rng_key()
    acc = _acc(dtype)
    if np.issubdtype(np.dtype(dtype), np.complexfloating):
        parts = sample(key, (*shape, 2), acc)
        return jax.lax.complex(parts[..., 0], parts[..., 1]).astype(dtype)
    return sample(key, shape, acc)


def _uniform(shape, dtype, low, high):
    u = _draw(jax.random.uniform, shape, dtype)
    if np.issubdtype(np.dtype(dtype), np.complexfloating):
        re = low + (high - low) * u.real
        im = low + (high - low) * u.imag
        return jax.lax.complex(re, im).astype(dtype)
    return (low + (high - low) * u).astype(dtype)


@lower(aten.uniform_.default, random=True)
def uniform_(x, low=0.0, high=1.0, generator=None):
    return _uniform(x.shape, x.dtype, low, high)


@lower(aten.normal_.default, random=True)
def normal_(x, mean=0.0, std=1.0, generator=None):
    acc = jnp.float32 if x.dtype in (jnp.float16, jnp.bfloat16) else x.dtype
    z = jax.random.normal(_context.rng_key(), x.shape, acc)
    return (mean + std * z).astype(x.dtype)


@lower(aten.normal.Tensor_float, random=True)
def normal_tensor_float(mean, std=1.0, generator=None):
    z = jax.random.normal(_context.rng_key(), mean.shape, _context.out_dtype())
    return mean + std * z


@lower(aten.normal.float_Tensor, random=True)
def normal_float_tensor(mean, std, generator=None):
    z = jax.random.normal(_context.rng_key(), std.shape, _context.out_dtype())
    return mean + std * z


@lower(aten.normal.Tensor_Tensor, random=True)
def normal_tensor_tensor(mean, std, generator=None):
    shape = jnp.broadcast_shapes(mean.shape, std.shape)
    z = jax.random.normal(_context.rng_key(), shape, _context.out_dtype())
    return mean + std * z


@lower(aten.bernoulli_.float, random=True)
def bernoulli_float_(x, p=0.5, generator=None):
    return jax.random.bernoulli(_context.rng_key(), p, x.shape).astype(x.dtype)


@lower(aten.bernoulli_.Tensor, random=True)
def bernoulli_tensor_(x, p, generator=None):
    u = jax.random.uniform(_context.rng_key(), x.shape, jnp.float64 if p.dtype == jnp.float64 else jnp.float32)
    return (u < p).astype(x.dtype)


@lower(aten.bernoulli.default, random=True)
def bernoulli(p, generator=None):
    u = jax.random.uniform(_context.rng_key(), p.shape, jnp.float64 if p.dtype == jnp.float64 else jnp.float32)
    return (u < p).astype(p.dtype)


@lower(aten.exponential_.default, random=True)
def exponential_(x, lambd=1.0, generator=None):
    acc = _acc(x.dtype)
    return (jax.random.exponential(_context.rng_key(), x.shape, acc) / lambd).astype(x.dtype)


@lower(aten.cauchy_.default, random=True)
def cauchy_(x, median=0.0, sigma=1.0, generator=None):
    z = jax.random.cauchy(_context.rng_key(), x.shape, _acc(x.dtype))
    return (median + sigma * z).astype(x.dtype)


@lower(aten.log_normal_.default, random=True)
def log_normal_(x, mean=1.0, std=2.0, generator=None):
    z = jax.random.normal(_context.rng_key(), x.shape, _acc(x.dtype))
    return jnp.exp(mean + std * z).astype(x.dtype)


@lower(aten.geometric_.default, random=True)
def geometric_(x, p, generator=None):
    # the number of Bernoulli(p) trials up to the first success: ceil(log(u) / log(1 - p))
    # u in (0, 1]: a draw of exactly 0 (clamped to the tiniest float) was a 1-in-10^7
    # outlier of ~300 trials, far past anything the CPU's 24-bit uniforms can give
    u = 1 - jax.random.uniform(_context.rng_key(), x.shape, jnp.float64 if x.dtype == jnp.float64 else jnp.float32)
    return jnp.maximum(jnp.ceil(jnp.log(u) / jnp.log1p(-p)), 1).astype(x.dtype)  # (u == 1: one trial)


def _random_ints(shape, dtype, low, high):
    """Uniform integers in [low, high) (as int64, then cast)."""
    span = jnp.asarray(high, jnp.int64) - jnp.asarray(low, jnp.int64)
    bits = jax.random.bits(_context.rng_key(), shape, jnp.uint64)
    r = (bits % span.astype(jnp.uint64)).astype(jnp.int64) + low
    return r.astype(dtype) if dtype != np.dtype(np.bool_) else r != 0


@lower(getattr(aten.random_, "from"), random=True)
def random_from(x, from_, to=None, generator=None):
    if to is None:
        to = _dtype_max(x.dtype) + 1
    return _random_ints(x.shape, x.dtype, from_, to)


@lower(aten.random_.to, random=True)
def random_to(x, to, generator=None):
    return _random_ints(x.shape, x.dtype, 0, to)


@lower(aten.random_.default, random=True)
def random_default(x, generator=None):
    return _random_ints(x.shape, x.dtype, 0, _dtype_max(x.dtype) + 1)


def _dtype_max(dtype) -> int:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return 1
    if np.issubdtype(dtype, np.integer):
        return int(np.iinfo(dtype).max)
    # floating: integers exactly representable in the mantissa
    return 2 ** (np.finfo(dtype).nmant + 1)


@lower(aten.randperm.generator, random=True)
def randperm_generator(n, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    return jax.random.permutation(_context.rng_key(), n).astype(_context.out_dtype())


@lower(aten.randperm.default, random=True)
def randperm(n, dtype=None, layout=None, device=None, pin_memory=None):
    return randperm_generator(n)


@lower(aten.multinomial.default, random=True)
def multinomial(probs, num_samples, replacement=False, generator=None):
    logits = jnp.log(probs.astype(jnp.float64 if probs.dtype == jnp.float64 else jnp.float32))
    key = _context.rng_key()
    if replacement:
        shape = probs.shape[:-1] + (num_samples,)
        return jax.random.categorical(key, logits[..., None, :], axis=-1, shape=shape).astype(jnp.int64)
    # without replacement: Gumbel top-k
    g = jax.random.gumbel(key, probs.shape, logits.dtype)
    scores = jnp.where(probs > 0, logits + g, -jnp.inf)
    return jax.lax.top_k(scores, num_samples)[1].astype(jnp.int64)
