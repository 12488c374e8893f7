"""grid_sampler_2d / grid_sampler_3d (``F.grid_sample``) and their backward ops.

The forward follows PyTorch's GridSampler kernels: grid coordinates in [-1, 1] are
unnormalized to pixel coordinates (``align_corners`` decides whether -1 and 1 are the
centers or the outer edges of the corner pixels), moved inside the image by the padding
mode (zeros: untouched, out-of-image taps read 0; border: clipped; reflection: mirrored,
then clipped), and sampled bilinearly (trilinearly in 3-D), at the nearest pixel (ties to
even, as ``std::nearbyint``), or bicubically (2-D only, A = -0.75, each of the 16 taps
moved by the padding mode on its own).

The backward ops are the vector-Jacobian product of this forward (``jax.vjp``). The
coordinate transforms are written with ``where`` rather than clip/abs so that their
derivatives at the boundaries are PyTorch's (0 where a coordinate is clipped, +1 at a
reflection point).
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp

from torch_jax.ops._promote import opmath_dtype
from torch_jax.ops._registry import aten, lower

BILINEAR, NEAREST, BICUBIC = 0, 1, 2
ZEROS, BORDER, REFLECTION = 0, 1, 2


def _unnormalize(coord, size: int, align_corners: bool):
    if align_corners:
        return (coord + 1) / 2 * (size - 1)
    return ((coord + 1) * size - 1) / 2


def _clip(coord, size: int):
    return jnp.where(coord <= 0, jnp.zeros_like(coord), jnp.where(coord >= size - 1, size - 1.0, coord))


def _reflect(coord, twice_low: int, twice_high: int):
    if twice_low == twice_high:
        return jnp.zeros_like(coord)
    low = twice_low / 2
    span = (twice_high - twice_low) / 2
    x = coord - low
    x = jnp.where(x < 0, -x, x)
    extra = jnp.fmod(x, span)
    flips = jnp.floor(x / span)
    return jnp.where(jnp.fmod(flips, 2) == 0, extra + low, span - extra + low)


def _pad(coord, size: int, padding_mode: int, align_corners: bool):
    """compute_coordinates: where a (pixel) coordinate reads from under the padding mode."""
    if padding_mode == BORDER:
        return _clip(coord, size)
    if padding_mode == REFLECTION:
        if align_corners:
            coord = _reflect(coord, 0, 2 * (size - 1))
        else:
            coord = _reflect(coord, -1, 2 * size - 1)
        return _clip(coord, size)
    return coord


def _gather(x, idx, spatial):
    """x (N, C, *spatial) at the integer coordinates ``idx`` (one (N, *out) array per
    spatial dim); taps outside the image read 0. Returns (N, C, *out)."""
    n, c = x.shape[:2]
    out_shape = idx[0].shape[1:]
    valid = jnp.ones(idx[0].shape, jnp.bool_)
    linear = jnp.zeros(idx[0].shape, jnp.int64)
    for i, size in zip(idx, spatial):
        valid = valid & (i >= 0) & (i < size)
        linear = linear * size + jnp.clip(i, 0, size - 1)
    flat = x.reshape(n, c, math.prod(spatial))
    picked = jnp.take_along_axis(flat, linear.reshape(n, 1, -1), axis=2)  # (N, C, prod(out))
    picked = jnp.where(valid.reshape(n, 1, -1), picked, jnp.zeros((), x.dtype))
    return picked.reshape(n, c, *out_shape)


def _cubic_weights(t):
    a = -0.75

    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _sample(x, grid, mode: int, padding_mode: int, align_corners: bool):
    spatial = x.shape[2:]
    dims = len(spatial)
    grid = grid.astype(x.dtype)
    # grid's last axis is (x, y[, z]): the spatial dims in reverse
    coords = [_unnormalize(grid[..., dims - 1 - k], spatial[k], align_corners) for k in range(dims)]
    if mode == BICUBIC:
        base = [jnp.floor(c) for c in coords]
        weights = [_cubic_weights(c - b) for c, b in zip(coords, base)]
        out = 0
        for taps in itertools.product(range(4), repeat=dims):
            idx, w = [], 1
            for k, t in enumerate(taps):
                tap = _pad(base[k] - 1 + t, spatial[k], padding_mode, align_corners)
                idx.append(tap.astype(jnp.int64))
                w = w * weights[k][t]
            out = out + _gather(x, idx, spatial) * w[:, None]
        return out
    coords = [_pad(c, size, padding_mode, align_corners) for c, size in zip(coords, spatial)]
    if mode == NEAREST:
        return _gather(x, [jnp.round(c).astype(jnp.int64) for c in coords], spatial)
    low = [jnp.floor(c) for c in coords]
    frac = [c - lo for c, lo in zip(coords, low)]
    out = 0
    for corner in itertools.product((0, 1), repeat=dims):
        idx = [(lo + b).astype(jnp.int64) for lo, b in zip(low, corner)]
        w = 1
        for f, b in zip(frac, corner):
            w = w * (f if b else 1 - f)
        out = out + _gather(x, idx, spatial) * w[:, None]
    return out


@lower(aten.grid_sampler_2d.default, aten.grid_sampler_3d.default)
def grid_sampler(x, grid, interpolation_mode, padding_mode, align_corners):
    acc = opmath_dtype(x.dtype)
    out = _sample(x.astype(acc), grid.astype(acc), interpolation_mode, padding_mode, align_corners)
    return out.astype(x.dtype)


@lower(aten.grid_sampler_2d_backward.default, aten.grid_sampler_3d_backward.default)
def grid_sampler_backward(g, x, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    acc = opmath_dtype(x.dtype)
    _, vjp = jax.vjp(
        lambda a, b: _sample(a, b, interpolation_mode, padding_mode, align_corners), x.astype(acc), grid.astype(acc)
    )
    grad_x, grad_grid = vjp(g.astype(acc))
    return (grad_x.astype(x.dtype) if output_mask[0] else None), grad_grid.astype(grid.dtype)
