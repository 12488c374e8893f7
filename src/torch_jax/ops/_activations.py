"""Activation functions and the backward ops autograd calls for them."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from torch_jax.ops import _context
from torch_jax.ops._promote import INT_TO_FLOAT, cast, promote
from torch_jax.ops._registry import aten, lower

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _compute(*xs):
    """float16/bfloat16 activations compute in float32, like PyTorch's opmath."""
    return promote(*xs, kind=INT_TO_FLOAT)


@lower(aten.gelu.default)
def gelu(x, approximate="none"):
    (x,), out = _compute(x)
    if approximate == "tanh":
        y = 0.5 * x * (1 + jnp.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x**3)))
    else:
        y = 0.5 * x * (1 + jax.scipy.special.erf(x / math.sqrt(2.0)))
    return cast(y, out)


@lower(aten.gelu_backward.default)
def gelu_backward(g, x, approximate="none"):
    (g, x), out = _compute(g, x)
    if approximate == "tanh":
        inner = _SQRT_2_OVER_PI * (x + 0.044715 * x**3)
        t = jnp.tanh(inner)
        d_inner = _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * x**2)
        dy = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * d_inner
    else:
        cdf = 0.5 * (1 + jax.scipy.special.erf(x / math.sqrt(2.0)))
        pdf = jnp.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
        dy = cdf + x * pdf
    return cast(g * dy, out)


@lower(aten.silu.default)
def silu(x):
    (x,), out = _compute(x)
    return cast(x * jax.nn.sigmoid(x), out)


@lower(aten.silu_backward.default)
def silu_backward(g, x):
    (g, x), out = _compute(g, x)
    s = jax.nn.sigmoid(x)
    return cast(g * s * (1 + x * (1 - s)), out)


@lower(aten.mish.default)
def mish(x):
    (x,), out = _compute(x)
    return cast(x * jnp.tanh(jax.nn.softplus(x)), out)


@lower(aten.mish_backward.default)
def mish_backward(g, x):
    (g, x), out = _compute(g, x)
    sp = jax.nn.softplus(x)
    t = jnp.tanh(sp)
    return cast(g * (t + x * jax.nn.sigmoid(x) * (1 - t * t)), out)


@lower(aten.threshold.default)
def threshold(x, threshold, value):
    (x, threshold, value), out = promote(x, threshold, value)
    return cast(jnp.where(x <= threshold, value, x), out)


@lower(aten.threshold_backward.default)
def threshold_backward(g, x, threshold):
    return jnp.where(x <= threshold, jnp.zeros((), g.dtype), g)


@lower(aten.tanh_backward.default)
def tanh_backward(g, y):
    (g, y), out = _compute(g, y)
    return cast(g * (1 - y * jnp.conj(y)), out)


@lower(aten.sigmoid_backward.default)
def sigmoid_backward(g, y):
    (g, y), out = _compute(g, y)
    return cast(g * (1 - y) * jnp.conj(y), out)


@lower(aten.leaky_relu.default)
def leaky_relu(x, negative_slope=0.01):
    (x,), out = _compute(x)
    return cast(jnp.where(x > 0, x, x * negative_slope), out)


@lower(aten.leaky_relu_backward.default)
def leaky_relu_backward(g, x, negative_slope, self_is_result):
    (g, x), out = _compute(g, x)
    return cast(jnp.where(x > 0, g, g * negative_slope), out)


@lower(aten.hardtanh.default)
def hardtanh(x, min_val=-1, max_val=1):
    (x, lo, hi), out = promote(x, min_val, max_val)
    return cast(jnp.minimum(jnp.maximum(x, lo), hi), out)


@lower(aten.hardtanh_backward.default)
def hardtanh_backward(g, x, min_val, max_val):
    return jnp.where((x <= min_val) | (x >= max_val), jnp.zeros((), g.dtype), g)


@lower(aten.elu.default)
def elu(x, alpha=1, scale=1, input_scale=1):
    (x,), out = _compute(x)
    return cast(jnp.where(x > 0, x * scale, alpha * scale * jnp.expm1(x * input_scale)), out)


@lower(aten.elu_backward.default)
def elu_backward(g, alpha, scale, input_scale, is_result, self_or_result):
    (g, y), out = _compute(g, self_or_result)
    if is_result:
        neg = g * input_scale * (y + alpha * scale)
    else:
        neg = g * input_scale * alpha * scale * jnp.exp(y * input_scale)
    return cast(jnp.where(y > 0, g * scale, neg), out)


@lower(aten.softplus.default)
def softplus(x, beta=1, threshold=20):
    (x,), out = _compute(x)
    bx = x * beta
    return cast(jnp.where(bx > threshold, x, jnp.log1p(jnp.exp(bx)) / beta), out)


@lower(aten.softplus_backward.default)
def softplus_backward(g, x, beta, threshold):
    (g, x), out = _compute(g, x)
    bx = x * beta
    z = jnp.exp(bx)
    return cast(jnp.where(bx > threshold, g, g * z / (z + 1)), out)


@lower(aten.hardsigmoid.default)
def hardsigmoid(x):
    (x,), out = _compute(x)
    return cast(jnp.clip(x / 6 + 0.5, 0, 1), out)


@lower(aten.hardsigmoid_backward.default)
def hardsigmoid_backward(g, x):
    (g, x), out = _compute(g, x)
    return cast(jnp.where((x > -3) & (x < 3), g / 6, 0), out)


@lower(aten.hardswish.default)
def hardswish(x):
    (x,), out = _compute(x)
    return cast(x * jnp.clip(x + 3, 0, 6) / 6, out)


@lower(aten.hardswish_backward.default)
def hardswish_backward(g, x):
    (g, x), out = _compute(g, x)
    return cast(jnp.where(x < -3, 0, jnp.where(x <= 3, g * (x / 3 + 0.5), g)), out)


@lower(aten.log_sigmoid_forward.default)
def log_sigmoid_forward(x):
    (x,), out = _compute(x)
    buffer = jnp.exp(-jnp.abs(x))
    return cast(jax.nn.log_sigmoid(x), out), cast(buffer, out)


@lower(aten.log_sigmoid_backward.default)
def log_sigmoid_backward(g, x, buffer):
    (g, x), out = _compute(g, x)
    return cast(g * jax.nn.sigmoid(-x), out)


@lower(aten.glu.default)
def glu(x, dim=-1):
    (x,), out = _compute(x)
    a, b = jnp.split(x, 2, axis=dim)
    return cast(a * jax.nn.sigmoid(b), out)


@lower(aten._prelu_kernel.default)
def prelu_kernel(x, w):
    (x, w), out = _compute(x, w)
    return cast(jnp.where(x > 0, x, _prelu_weight(x, w) * x), out)


@lower(aten.glu_backward.default)
def glu_backward(g, x, dim):
    (g, x), out = _compute(g, x)
    a, b = jnp.split(x, 2, axis=dim)
    s = jax.nn.sigmoid(b)
    return cast(jnp.concatenate([g * s, g * a * s * (1 - s)], axis=dim), out)


def _prelu_weight(x, w):
    """The weight broadcast against x as _prelu_kernel sees it: per channel (axis 1)."""
    return w.reshape((1, -1) + (1,) * (x.ndim - 2)) if w.ndim == 1 and x.ndim >= 2 else w


@lower(aten._prelu_kernel_backward.default)
def prelu_kernel_backward(g, x, w):
    """Both gradients have the broadcast shape: autograd sums the weight's down to its shape."""
    (g, x, w), out = _compute(g, x, w)
    wb = _prelu_weight(x, w)
    pos = x > 0
    gx = jnp.where(pos, g, wb * g)
    gw = jnp.where(pos, jnp.zeros((), g.dtype), x * g)
    return cast(gx, out), cast(gw, out)


@lower(aten.hardshrink.default)
def hardshrink(x, lambd=0.5):
    lambd = cast(lambd, x.dtype)  # the CPU kernel compares in the input's dtype
    return jnp.where((x >= -lambd) & (x <= lambd), jnp.zeros((), x.dtype), x)


@lower(aten.hardshrink_backward.default)
def hardshrink_backward(g, x, lambd):
    lambd = cast(lambd, x.dtype)
    return jnp.where((x >= -lambd) & (x <= lambd), jnp.zeros((), g.dtype), g)


@lower(aten.softshrink.default)
def softshrink(x, lambd=0.5):
    (x, lambd), out = _compute(x, lambd)
    # x * 0 in the middle band keeps NaN, as on CPU
    return cast(jnp.where(x > lambd, x - lambd, jnp.where(x < -lambd, x + lambd, x * 0)), out)


@lower(aten.softshrink_backward.default)
def softshrink_backward(g, x, lambd):
    (g, x, lambd), out = _compute(g, x, lambd)
    return cast(jnp.where((x >= -lambd) & (x <= lambd), jnp.zeros((), g.dtype), g), out)


@lower(aten.rrelu_with_noise.default, random=True)
def rrelu_with_noise(x, noise, lower=0.125, upper=1 / 3, training=False, generator=None):
    """Returns the output and the new noise (the mutated ``noise`` argument)."""
    (xc, lo, hi), out = _compute(x, lower, upper)
    if not training:  # a leaky ReLU with the mean slope; noise is left as it was
        return cast(jnp.where(xc >= 0, xc, xc * (lo + hi) / 2), out), noise
    r = jax.random.uniform(_context.rng_key(), x.shape, xc.dtype, lo, hi)
    slope = jnp.where(xc >= 0, jnp.ones((), xc.dtype), r)
    return cast(xc * slope, out), cast(slope, noise.dtype)


# The in-place overload writes two arguments (self and noise), which the executor's derived
# in-place variant does not handle: lowered on its own, its results are the two new values.
@lower(aten.rrelu_with_noise_.default, random=True)
def rrelu_with_noise_(x, noise, lower=0.125, upper=1 / 3, training=False, generator=None):
    return rrelu_with_noise(x, noise, lower, upper, training, generator)
