"""What a lowering may ask of the executor while it is being traced.

- :func:`out_dtype`: the dtype PyTorch computes for output ``i`` (from the op's meta
  kernel), for lowerings that build values from nothing (factories) or must compute
  in the output dtype.
- :func:`check`: a value-dependent error (an index out of range). The executor returns
  the flag from the computation and raises the PyTorch error on the host.
- :func:`rng_key`: the JAX PRNG key of this op (from the device generator).
"""

from __future__ import annotations

import functools
import math
import threading

import numpy as np

_tls = threading.local()


class TraceContext:
    """What one op's lowering may ask while it is traced. (A plain class, not a dataclass:
    the methods ``dataclasses`` generates have no file, and Dynamo traces them when they
    run under a compiled function, NOTE [Dynamo skips the runtime] in compile/_route.)"""

    __slots__ = ("op", "out_dtypes", "index", "checks", "rng", "contiguous", "bucket")

    def __init__(self, op, out_dtypes, index: int, checks=None, rng=None, contiguous=None, bucket=None):
        self.op = op
        self.out_dtypes = out_dtypes  # numpy dtypes, one per tensor output
        self.index = index  # jax device index the op runs on
        self.checks = [] if checks is None else checks  # (flag, value, exc_type, message)
        self.rng = rng  # traced uint32[4]: the key's words (device/_state.key_words), random ops only
        self.contiguous = {} if contiguous is None else contiguous  # schema position -> is_contiguous()
        self.bucket = bucket  # NOTE [Buckets] (runtime/_buckets): this call's plan, for the ops that know buckets


class PaddedValue:
    """A tensor argument or result in a bucket (NOTE [Buckets] in runtime/_buckets):
    ``arr`` is larger than the tensor along ``dim``, whose logical size is ``length``
    (a traced integer; None for a result, whose length the executor knows). Along
    ``dim``, blocks of ``period`` positions repeat (a batch of padded rows merged into
    one dim by a view), each step ``inner`` elements wide, and the first ``length``
    steps of each block are the tensor's; ``period`` None: the whole dim is one block."""

    __slots__ = ("arr", "dim", "length", "period", "inner")

    def __init__(self, arr, dim: int, length=None, period=None, inner=1):
        self.arr, self.dim, self.length, self.period, self.inner = arr, dim, length, period, inner

    def mask(self):
        """Which positions along ``dim`` are the tensor's, shaped to broadcast against ``arr``."""
        import jax.numpy as jnp

        n = self.arr.shape[self.dim]
        steps = jnp.arange(n) // self.inner
        if self.period is not None:
            steps = steps % self.period
        return (steps < self.length).reshape((n,) + (1,) * (self.arr.ndim - self.dim - 1))

    def repeated(self):
        """``arr`` with each position past the length holding its block's first position:
        values the tensor has, so a value check (an integer division by zero) that
        would fail there fails at that first position too."""
        import jax.numpy as jnp

        arr, d = self.arr, self.dim
        n = arr.shape[d]
        period = n if self.period is None else self.period
        blocks = arr.shape[:d] + (n // (period * self.inner), period, self.inner) + arr.shape[d + 1 :]
        a = arr.reshape(blocks)
        first = a[(slice(None),) * (d + 1) + (slice(0, 1),)]
        valid = (jnp.arange(period) < self.length).reshape((period, 1) + (1,) * (arr.ndim - d - 1))
        return jnp.where(valid, a, first).reshape(arr.shape)

    def filled(self, value):
        """``arr`` with ``value`` past the length (a value that leaves a reduction exact)."""
        import jax.numpy as jnp

        return jnp.where(self.mask(), self.arr, jnp.asarray(value, self.arr.dtype))


class PyTorchError(Exception):
    """Carries the error PyTorch raises for a call out of the compilation step (a lowering
    raises it for arguments PyTorch refuses where no CPU kernel can be asked)."""

    def __init__(self, error: Exception):
        self.error = error


def pad_fill(dtype):
    """What fills a bucket past a tensor's length: NaN, or the largest value of an
    integer or bool dtype, so that a rule that read it would show."""
    import jax.numpy as jnp

    if jnp.issubdtype(dtype, jnp.inexact):
        return np.nan
    if jnp.issubdtype(dtype, jnp.bool_):
        return True
    return jnp.iinfo(dtype).max


def current() -> TraceContext:
    ctx = getattr(_tls, "ctx", None)
    if ctx is None:
        raise RuntimeError("torch_jax: lowering called outside of the executor")
    return ctx


class tracing:
    def __init__(self, ctx: TraceContext):
        self.ctx = ctx

    def __enter__(self):
        self.prev = getattr(_tls, "ctx", None)
        _tls.ctx = self.ctx
        return self.ctx

    def __exit__(self, *exc):
        _tls.ctx = self.prev
        return False


def out_dtype(i: int = 0) -> np.dtype:
    ctx = current()
    if ctx.out_dtypes is None:
        # the executor only knows output dtypes from the op's Meta kernel
        raise RuntimeError(f"torch_jax: {ctx.op} has no Meta kernel, so its lowering cannot ask for out_dtype()")
    return ctx.out_dtypes[i]


def is_contiguous(i: int) -> bool:
    """Whether tensor argument ``i`` (schema position) is contiguous, for the few kernels
    whose results depend on the layout (PyTorch's det factors A^T for contiguous A). It is
    part of the cache key, so it is a static Python bool."""
    return current().contiguous.get(i, True)


def check(bad, exc_type, message: str, value=None) -> None:
    """Raise ``exc_type(message.format(value=...))`` on the host if ``bad`` is true.

    ``bad`` is a traced boolean scalar; ``value`` an optional traced integer that the
    message can show (the offending index).
    """
    import jax.numpy as jnp

    ctx = current()
    v = jnp.asarray(0 if value is None else value, jnp.int64)
    ctx.checks.append((jnp.asarray(bad, jnp.bool_), v, exc_type, message))


def rng_key():
    """The PRNG key of the random op being traced (a fresh one per call)."""
    ctx = current()
    if ctx.rng is None:
        raise RuntimeError(f"torch_jax: {ctx.op} asked for a random key but is not declared random")
    return key_from_words(ctx.rng)


def dropout_keep(key, keep: float, shape):
    """Dropout's mask: each element kept with probability ``keep`` (a Python float), from
    32-bit random words compared with ``floor(keep * 2**32)``.

    NOTE [Dropout's mask from 32-bit words]: ``jax.random.bernoulli`` with a Python float
    draws float64 uniforms when 64-bit types are on (as torch_jax has them), 64 random
    bits per element; a 32-bit threshold needs half the Threefry work (the generator
    yields 64-bit words that ``_xla_threefry_impl`` splits) and keeps each element with
    probability within 2**-32 of ``keep``, finer than a float32 uniform's 2**-23 as
    CUDA's dropout draws it."""
    import jax
    import jax.numpy as jnp

    if keep >= 1 or keep <= 0:
        return jnp.full(shape, keep >= 1, jnp.bool_)
    return jax.random.bits(key, shape, jnp.uint32) < np.uint32(math.floor(keep * 2**32))


def key_from_words(rng):
    """The PRNG key of a random op from its key words (uint32[4], hashed from its
    generator's seed and offset: NOTE [Keys hashed on the host] in device/_state).

    NOTE [Random bits from XLA's Threefry]: the key is JAX's, as JAX derives keys; the
    random bits themselves come from XLA's RngBitGenerator with its Threefry algorithm
    (``_xla_threefry_impl``), one XLA op that runs 3-4x faster on CPU than JAX's own
    threefry lowering (measured: dropout's mask of 524k elements 2.5 -> 0.7 ms, uniform
    floats 2.6 -> 0.9 ms). The numbers are a fixed function of the seed and offset on a
    backend, so strict and fused eager draw the same ones; like PyTorch's, they differ
    between backends."""
    import jax

    return jax.random.wrap_key_data(rng, impl=_xla_threefry_impl())


@functools.cache
def _xla_threefry_impl():
    """JAX's "rbg" key (uint32[4]; seed, split and fold_in as JAX has them) whose bits come
    from RngBitGenerator with the Threefry algorithm named (rbg's default algorithm is the
    backend's choice: Philox on this CPU, slower than Threefry)."""
    import jax
    import jax.extend.random as jex
    from jax import lax

    rbg = jex.rbg_prng_impl
    widths = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}

    def random_bits(key, bit_width, shape):
        # NOTE [Narrow random bits from 64-bit words]: XLA:CPU's RngBitGenerator costs
        # about the same per element for 32-bit as for 64-bit outputs (each Threefry block
        # yields two 32-bit words), so narrower bits are drawn as 64-bit words and split.
        # Measured alternating in one process (2-core AMD EPYC): 4M 32-bit words 6.5 ->
        # 3.6 ms, `rand` of 1M float32 1.73 -> 0.97 ms; dropout (its mask fused with the
        # multiply) and `randn` (bound by erfinv) unchanged.
        count = math.prod(shape)
        per_word = 64 // bit_width if jax.config.jax_enable_x64 else 1
        if per_word == 1:  # (64-bit draws, or no 64-bit types: torch_jax turns them on)
            _, bits = lax.rng_bit_generator(
                key, shape, dtype=widths[bit_width], algorithm=lax.RandomAlgorithm.RNG_THREE_FRY
            )
            return bits
        _, words = lax.rng_bit_generator(
            key, (-(-count // per_word),), dtype=np.uint64, algorithm=lax.RandomAlgorithm.RNG_THREE_FRY
        )
        bits = lax.bitcast_convert_type(words, widths[bit_width]).reshape(-1)
        return (bits if bits.shape[0] == count else bits[:count]).reshape(shape)

    return jex.define_prng_impl(
        key_shape=rbg.key_shape,
        seed=rbg.seed,
        split=rbg.split,
        random_bits=random_bits,
        fold_in=rbg.fold_in,
        name="torch_jax_xla_threefry",
        tag="tjt",
    )
