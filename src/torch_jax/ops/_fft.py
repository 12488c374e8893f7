"""Fourier transforms (_fft_c2c, _fft_r2c, _fft_c2r) and what builds on them.

Every torch.fft function (fft, rfft, hfft, their inverses and n-d forms, stft/istft)
decomposes into these three ops. Each computes an unnormalized transform and then
scales it by ``normalization``: 0 none, 1 ``1/sqrt(n)``, 2 ``1/n``, where ``n`` is the
number of points of the signal (the output's sizes along ``dim`` for c2r), whatever
the direction; the Python frontends pick the mode from ``norm=`` and the direction.
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from torch_jax.ops._registry import aten, lower


def _normalize(y, n: int, normalization: int):
    if normalization == 1:
        return y * (1 / math.sqrt(n)) if n else y
    if normalization == 2:
        return y * (1 / n) if n else y
    return y


def _points(shape, dim) -> int:
    return math.prod(shape[d] for d in dim)


def _empty(shape, dim, last, dtype):
    """The (all-empty) result of a transform of an empty tensor; jnp.fft rejects those."""
    shape = list(shape)
    if dim:
        shape[dim[-1]] = last
    return jnp.zeros(shape, dtype)


@lower(aten._fft_c2c.default)
def fft_c2c(x, dim, normalization, forward):
    if not dim or x.size == 0:
        return x
    # norm="forward" on the inverse transform is the unnormalized inverse
    y = jnp.fft.fftn(x, axes=dim) if forward else jnp.fft.ifftn(x, axes=dim, norm="forward")
    return _normalize(y, _points(x.shape, dim), normalization)


@lower(aten._fft_r2c.default)
def fft_r2c(x, dim, normalization, onesided):
    if not dim or x.size == 0:
        last = x.shape[dim[-1]] // 2 + 1 if dim and onesided else (x.shape[dim[-1]] if dim else 0)
        return _empty(x.shape, dim, last, jnp.result_type(x.dtype, jnp.complex64))
    # rfftn halves the last axis of ``dim``, as PyTorch's onesided output does
    y = jnp.fft.rfftn(x, axes=dim) if onesided else jnp.fft.fftn(x, axes=dim)
    return _normalize(y, _points(x.shape, dim), normalization)


@lower(aten._fft_c2r.default)
def fft_c2r(x, dim, normalization, last_dim_size):
    if not dim or x.size == 0:
        return _empty(x.shape, dim, last_dim_size, jnp.real(x).dtype)
    sizes = [x.shape[d] for d in dim[:-1]] + [last_dim_size]
    y = jnp.fft.irfftn(x, s=sizes, axes=dim, norm="forward")
    return _normalize(y, math.prod(sizes), normalization)
