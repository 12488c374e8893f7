"""Factories (arange, full, eye, linspace, ...) and random number ops.

Random ops draw from the device generator (NOTE [Device RNG] in device/_state):
``torch.manual_seed`` fixes their numbers, every call gets a fresh key.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from torch_jax.ops import _context
from torch_jax.ops._promote import cast
from torch_jax.ops._registry import aten, lower


@lower(aten.arange.start_step, static=("start", "end", "step"))
def arange(start, end=None, step=1, dtype=None, layout=None, device=None, pin_memory=None):
    out = _context.out_dtype()
    n = max(0, math.ceil((end - start) / step))
    if np.issubdtype(out, np.integer):
        return (start + jnp.arange(n, dtype=jnp.int64) * step).astype(out)
    # PyTorch computes start + i * step in double for floating outputs
    return (start + jnp.arange(n, dtype=jnp.float64) * step).astype(out)


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
    if steps == 1:
        return jnp.full((1,), start, out)
    # PyTorch fills the first half from start and the second half from end
    step = (end - start) / (steps - 1)
    i = jnp.arange(steps, dtype=jnp.float64)
    half = steps // 2
    vals = jnp.where(i < half, start + step * i, end - step * (steps - 1 - i))
    if np.issubdtype(out, np.integer):
        return jnp.trunc(vals).astype(out)
    return vals.astype(out)


# ---------------------------------------------------------------- random


def _uniform(shape, dtype, low, high):
    key = _context.rng_key()
    if dtype in (np.dtype(jnp.float16), np.dtype(jnp.bfloat16)):
        u = jax.random.uniform(key, shape, jnp.float32)
    else:
        u = jax.random.uniform(key, shape, dtype)
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
    acc = jnp.float32 if x.dtype in (jnp.float16, jnp.bfloat16) else x.dtype
    return (jax.random.exponential(_context.rng_key(), x.shape, acc) / lambd).astype(x.dtype)


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
