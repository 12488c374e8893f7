"""The fused LSTM and GRU cells that ``nn.LSTM``/``nn.GRU``/``nn.LSTMCell``/``nn.GRUCell``
call on accelerators (PyTorch's CPU runs the unfused composite instead), and their
backward. The workspace is what our backward reads: the activated gates (LSTM), or the
gates, the hidden part of the new gate and the previous state (GRU), as CUDA keeps them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from torch_jax.ops._promote import opmath
from torch_jax.ops._registry import aten, lower


def _add(*xs):
    """The sum of the tensors that are given (a missing bias is None), in opmath."""
    out = None
    for x in xs:
        if x is not None:
            out = opmath(x) if out is None else out + opmath(x)
    return out


# (their Meta kernels fail on a missing bias: ``x.device`` of None)
@lower(aten._thnn_fused_lstm_cell.default, meta=False)
def lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    gates = _add(input_gates, hidden_gates, input_bias, hidden_bias)
    i, f, g, o = jnp.split(gates, 4, axis=1)
    i, f, g, o = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(g), jax.nn.sigmoid(o)
    cy = f * opmath(cx) + i * g
    hy = o * jnp.tanh(cy)
    dt = input_gates.dtype
    return hy.astype(dt), cy.astype(dt), jnp.concatenate([i, f, g, o], axis=1).astype(dt)


@lower(aten._thnn_fused_lstm_cell_backward_impl.default, static=("has_bias",))
def lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    i, f, g, o = jnp.split(opmath(workspace), 4, axis=1)
    tanh_cy = jnp.tanh(opmath(cy))
    gcx = jnp.zeros_like(tanh_cy)
    if grad_hy is not None:
        gcx = gcx + opmath(grad_hy) * o * (1 - tanh_cy * tanh_cy)
    if grad_cy is not None:
        gcx = gcx + opmath(grad_cy)
    go = jnp.zeros_like(o) if grad_hy is None else opmath(grad_hy) * tanh_cy * o * (1 - o)
    gi = gcx * g * i * (1 - i)
    gf = gcx * opmath(cx) * f * (1 - f)
    gg = gcx * i * (1 - g * g)
    grad_gates = jnp.concatenate([gi, gf, gg, go], axis=1)
    dt = workspace.dtype
    grad_bias = grad_gates.sum(0).astype(dt) if has_bias else None
    return grad_gates.astype(dt), (gcx * f).astype(dt), grad_bias


@lower(aten._thnn_fused_gru_cell.default, meta=False)
def gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    ir, ii, in_ = jnp.split(_add(input_gates, input_bias), 3, axis=1)
    hr, hi, hn = jnp.split(_add(hidden_gates, hidden_bias), 3, axis=1)
    r = jax.nn.sigmoid(ir + hr)
    z = jax.nn.sigmoid(ii + hi)
    n = jnp.tanh(in_ + r * hn)
    h = opmath(hx)
    hy = n + z * (h - n)
    dt = input_gates.dtype
    return hy.astype(dt), jnp.concatenate([r, z, n, hn, h], axis=1).astype(dt)


@lower(aten._thnn_fused_gru_cell_backward.default, static=("has_bias",))
def gru_cell_backward(grad_hy, workspace, has_bias):
    r, z, n, hn, h = jnp.split(opmath(workspace), 5, axis=1)
    g = opmath(grad_hy)
    gz = g * (h - n) * z * (1 - z)
    ghx = g * z
    gn = g * (1 - z) * (1 - n * n)
    ghn = gn * r
    gr = gn * hn * r * (1 - r)
    grad_input = jnp.concatenate([gr, gz, gn], axis=1)
    grad_hidden = jnp.concatenate([gr, gz, ghn], axis=1)
    dt = workspace.dtype
    if has_bias:
        return (
            grad_input.astype(dt),
            grad_hidden.astype(dt),
            ghx.astype(dt),
            grad_input.sum(0).astype(dt),
            grad_hidden.sum(0).astype(dt),
        )
    return grad_input.astype(dt), grad_hidden.astype(dt), ghx.astype(dt), None, None
