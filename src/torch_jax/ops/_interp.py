"""Interpolation (upsample_*) with its backward ops.

NOTE [Separable taps]: every upsampling mode is separable: along each spatial dim,
output position ``i`` is a weighted sum of ``K`` input positions (nearest: 1 tap,
linear: 2, cubic: 4, antialiased: a window that grows with the downscale factor). The
taps (index and weight per output position) are computed with numpy at trace time with
the CPU kernel's own formulas, in its arithmetic (float32 for every dtype but float64). The forward
gathers and sums the taps dim by dim, last dim first as the CPU does; the backward is
the exact transpose, a scatter-add of the weighted gradient.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from torch_jax.ops import _context
from torch_jax.ops._promote import LOW_PRECISION as _LOW
from torch_jax.ops._registry import aten, lower


def _opmath(dtype):
    return np.float64 if np.dtype(dtype) == np.float64 else np.float32


def _scales_value(scale, n_in: int, n_out: int, ft):
    """compute_scales_value: 1/scale when given, else in/out."""
    if scale is not None and scale > 0:
        return ft(1.0 / scale)
    return ft(n_in) / ft(n_out)


def _area_scale(n_in: int, n_out: int, align_corners: bool, scale, ft):
    if align_corners:
        return ft(n_in - 1) / ft(n_out - 1) if n_out > 1 else ft(0)
    return _scales_value(scale, n_in, n_out, ft)


def _source_index(scale, n_out: int, align_corners: bool, cubic: bool, ft):
    i = np.arange(n_out).astype(ft)
    if align_corners:
        return scale * i
    src = scale * (i + ft(0.5)) - ft(0.5)
    return src if cubic else np.maximum(src, ft(0))


def _guard(real, n_in: int, ft):
    """guard_index_and_lambda: the floor index (at most n_in - 1) and the fraction."""
    idx = np.minimum(np.floor(real).astype(np.int64), n_in - 1)
    lam = np.clip(real - idx.astype(ft), ft(0), ft(1)).astype(ft)
    return idx, lam


# ---------------------------------------------------------------- taps per mode


def _nearest_taps(n_in, n_out, scale, dtype):
    i = np.arange(n_out)
    if n_out == n_in:
        idx = i
    elif n_out == 2 * n_in:
        idx = i >> 1
    else:
        s = _scales_value(scale, n_in, n_out, np.float32)  # float32 whatever the dtype
        idx = np.minimum(np.floor(i.astype(np.float32) * s).astype(np.int64), n_in - 1)
    return idx[:, None], None


def _nearest_exact_taps(n_in, n_out, scale, dtype):
    s = _scales_value(scale, n_in, n_out, np.float32)
    # (i + 0.5) is a double in C++; floorf rounds the product to float first
    src = ((np.arange(n_out) + 0.5) * np.float64(s)).astype(np.float32)
    return np.minimum(np.floor(src).astype(np.int64), n_in - 1)[:, None], None


def _linear_taps(n_in, n_out, align_corners, scale, dtype):
    ft = _opmath(dtype)
    if n_out == n_in:
        i = np.arange(n_out)
        return np.stack([i, i], 1), np.stack([np.ones(n_out, ft), np.zeros(n_out, ft)], 1)
    s = _area_scale(n_in, n_out, align_corners, scale, ft)
    idx0, lam1 = _guard(_source_index(s, n_out, align_corners, False, ft), n_in, ft)
    idx1 = idx0 + (idx0 < n_in - 1)
    return np.stack([idx0, idx1], 1), np.stack([ft(1) - lam1, lam1], 1)


def _cubic_conv1(x, a):
    return ((a + 2) * x - (a + 3)) * x * x + 1


def _cubic_conv2(x, a):
    return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a


def _cubic_taps(n_in, n_out, align_corners, scale, dtype):
    ft = _opmath(dtype)
    a = ft(-0.75)
    s = _area_scale(n_in, n_out, align_corners, scale, ft)
    idx, t = _guard(_source_index(s, n_out, align_corners, True, ft), n_in, ft)
    one = ft(1)
    w = [_cubic_conv2(t + one, a), _cubic_conv1(t, a), _cubic_conv1(one - t, a), _cubic_conv2(one - t + one, a)]
    taps = np.stack([np.clip(idx - 1 + j, 0, n_in - 1) for j in range(4)], 1)
    return taps, np.stack(w, 1).astype(ft)


def _bilinear_filter(x):
    x = np.abs(x)
    return np.where(x < 1, 1 - x, 0)


def _bicubic_filter(a):
    """Keys' cubic kernel; antialiased bicubic uses a = -0.5 (PIL's), plain bicubic -0.75."""

    def f(x):
        x = np.abs(x)
        return np.where(x < 1, _cubic_conv1(x, a), np.where(x < 2, _cubic_conv2(x, a), 0))

    return f


def _window_taps(n_in, n_out, align_corners, scale, ft, interp_size, filter_fn, antialias):
    """The CPU's windowed weights (``_compute_indices_min_size_weights_aa``): a filter
    centred on each output position, clipped to the input and normalized to sum 1.
    Antialiased modes use them for every dtype, the uint8 kernels for all modes."""
    s = _area_scale(n_in, n_out, align_corners, scale, ft)
    delta = ft(0.5) if align_corners and not antialias else ft(0)
    if antialias:
        support = ft(interp_size * 0.5) * s if s >= 1 else ft(interp_size * 0.5)
        k = int(math.ceil(support)) * 2 + 1
    else:
        support, k = ft(interp_size * 0.5), interp_size
    invscale = ft(1) / s if s >= 1 and antialias else ft(1)
    center = s * (np.arange(n_out).astype(ft) + ft(0.5) - delta)
    xmin = np.maximum((center - support + ft(0.5) + delta).astype(np.int64), 0)  # C++ casts truncate
    xsize = np.clip(np.minimum((center + support + ft(0.5) + delta).astype(np.int64), n_in) - xmin, 0, k)
    j = np.arange(k)
    w = filter_fn((j[None, :] + xmin[:, None] - center[:, None] + ft(0.5) - delta) * invscale).astype(ft)
    w = np.where(j[None, :] < xsize[:, None], w, ft(0))
    total = w.sum(1, keepdims=True)
    w = np.where(total != 0, w / np.where(total != 0, total, 1), w).astype(ft)
    taps = np.minimum(xmin[:, None] + j[None, :], n_in - 1)  # taps past xsize have weight 0
    return taps, w


def _int16_weights(w):
    """The uint8 kernels' fixed-point weights: int16 with as many fraction bits as the
    largest weight allows (``_compute_index_ranges_int16_weights``)."""
    wt_max = float(w.max()) if w.size else 0.0
    precision = 0
    while precision < 22 and int(0.5 + wt_max * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    v = w * (1 << precision)
    return np.where(v < 0, np.trunc(v - 0.5), np.trunc(v + 0.5)).astype(np.int32), precision


def _window(interp_size, filter_fn, antialias):
    def make(n_in, n_out, align_corners, scale, dtype):
        ft = np.float64 if np.dtype(dtype) in (np.float64, np.uint8) else np.float32
        return _window_taps(n_in, n_out, align_corners, scale, ft, interp_size, filter_fn, antialias)

    return make


_BILINEAR_U8 = _window(2, _bilinear_filter, False)
# plain bicubic in uint8: the clamped 4-tap weights, computed in double
_BICUBIC_U8 = lambda n_in, n_out, align_corners, scale, dtype: _cubic_taps(  # noqa: E731
    n_in, n_out, align_corners, scale, np.float64
)


# ---------------------------------------------------------------- forward and backward


def _forward_u8(x, taps_per_dim):
    """The uint8 kernels: one fixed-point pass per resized dim (last dim first), each
    rounded and clamped to uint8; a dim whose size does not change is not touched."""
    nd = len(taps_per_dim)
    y = x
    for k in reversed(range(nd)):
        idx, w = taps_per_dim[k]
        d = x.ndim - nd + k
        if idx.shape[0] == x.shape[d]:
            continue
        wi, precision = _int16_weights(w)
        shape = (-1,) + (1,) * (x.ndim - 1 - d)
        acc = jnp.full((), 1 << (precision - 1) if precision else 0, jnp.int32)
        for t in range(idx.shape[1]):
            acc = acc + jnp.take(y, idx[:, t], axis=d).astype(jnp.int32) * jnp.asarray(wi[:, t]).reshape(shape)
        y = jnp.clip(acc >> precision, 0, 255).astype(jnp.uint8)
    return y


def _forward(x, taps_per_dim):
    """Apply the taps of the last ``len(taps_per_dim)`` dims, last dim first."""
    out = _context.out_dtype()
    nd = len(taps_per_dim)
    weighted = any(w is not None for _, w in taps_per_dim)
    y = x.astype(jnp.float32) if weighted and x.dtype != jnp.float64 else x
    for k in reversed(range(nd)):
        idx, w = taps_per_dim[k]
        d = x.ndim - nd + k
        if w is None:
            y = jnp.take(y, idx[:, 0], axis=d)
            continue
        shape = (-1,) + (1,) * (x.ndim - 1 - d)
        acc = None
        for t in range(idx.shape[1]):
            term = jnp.take(y, idx[:, t], axis=d) * jnp.asarray(w[:, t], y.dtype).reshape(shape)
            acc = term if acc is None else acc + term
        y = acc
    return y.astype(out)


def _backward(g, input_size, taps_per_dim):
    nd = len(taps_per_dim)
    y = g.astype(jnp.float32) if g.dtype in _LOW else g
    for k in range(nd):
        idx, w = taps_per_dim[k]
        d = g.ndim - nd + k
        shape = (-1,) + (1,) * (g.ndim - 1 - d)
        moved = y.shape[:d] + (input_size[d],) + y.shape[d + 1 :]
        acc = jnp.zeros(moved, y.dtype)
        for t in range(idx.shape[1]):
            term = y if w is None else y * jnp.asarray(w[:, t], y.dtype).reshape(shape)
            acc = acc.at[(slice(None),) * d + (idx[:, t],)].add(term)
        y = acc
    return y.astype(g.dtype)


def _taps(make, in_sizes, out_sizes, scales, dtype, *extra):
    return [make(i, o, *extra, s, dtype) for i, o, s in zip(in_sizes, out_sizes, scales)]


def _register(name: str, n: int, make, aligned: bool, make_u8=None):
    """upsample_<name> (forward and backward) for ``n`` spatial dims; ``make_u8`` gives
    the taps of the uint8 fixed-point kernel."""
    forward = getattr(aten, name).default
    backward = getattr(aten, name + "_backward").default

    if aligned:

        def fwd(x, output_size, align_corners, *scales):
            if x.dtype == jnp.uint8 and make_u8 is not None:
                return _forward_u8(x, _taps(make_u8, x.shape[-n:], output_size, scales, x.dtype, align_corners))
            return _forward(x, _taps(make, x.shape[-n:], output_size, scales, x.dtype, align_corners))

        def bwd(g, output_size, input_size, align_corners, *scales):
            taps = _taps(make, input_size[-n:], output_size, scales, g.dtype, align_corners)
            return _backward(g, input_size, taps)

    else:

        def fwd(x, output_size, *scales):
            return _forward(x, _taps(make, x.shape[-n:], output_size, scales, x.dtype))

        def bwd(g, output_size, input_size, *scales):
            return _backward(g, input_size, _taps(make, input_size[-n:], output_size, scales, g.dtype))

    lower(forward)(fwd)
    lower(backward)(bwd)


for _n, _d in ((1, "1d"), (2, "2d"), (3, "3d")):
    _register(f"upsample_nearest{_d}", _n, _nearest_taps, aligned=False)
    _register(f"_upsample_nearest_exact{_d}", _n, _nearest_exact_taps, aligned=False)
_register("upsample_linear1d", 1, _linear_taps, aligned=True)
_register("upsample_bilinear2d", 2, _linear_taps, aligned=True, make_u8=_BILINEAR_U8)
_register("upsample_trilinear3d", 3, _linear_taps, aligned=True)
_register("upsample_bicubic2d", 2, _cubic_taps, aligned=True, make_u8=_BICUBIC_U8)
for _name, _size, _filter in (("bilinear", 2, _bilinear_filter), ("bicubic", 4, _bicubic_filter(-0.5))):
    _aa = _window(_size, _filter, True)
    _register(f"_upsample_{_name}2d_aa", 2, _aa, aligned=True, make_u8=_aa)
