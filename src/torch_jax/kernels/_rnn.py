"""Recurrent layers in one op: ``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` over a whole
sequence, a layer and direction an op (NOTE [Recurrent layers in one op]).

Importing the module (the device's start does) registers ``torch.ops.torch_jax.rnn_layer``
and the kernels of ``aten::lstm``, ``gru``, ``rnn_tanh`` and ``rnn_relu`` that call it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from torch_jax.kernels._jax_op import _library, jax_op
from torch_jax.ops._matmul import _dot, _plain_matmul, _transposed_lhs_on_cpu

# NOTE [Recurrent layers in one op]: ``aten::lstm``, ``gru`` and ``rnn_tanh``/``rnn_relu``
# are composite ops. On a device without a fused kernel of its own (cuDNN's, MIOpen's;
# PyTorch's CPU calls oneDNN's) their decomposition runs a cell at a time: on jax about
# 5 ops a step and layer forward and more backward, each paying an eager op's cost
# (docs/benchmarks/dispatch.md). Like cuDNN, the device runs each layer and direction as
# one op instead: the input's projection for every step in one product, then
# ``lax.scan`` over the steps, one XLA computation per shape. The math is the CPU's cell,
# operation for operation (gates = the hidden state's product plus the input's, each
# with its bias; LSTM's cell state forget * c + in * cell; GRU's n + z * (h - n) as
# (h - n) * z + n, the CPU's order), in the operands' dtype. The backward is its own op,
# ``jax.vjp`` of the same function (it computes the forward again inside the backward's
# computation); a backward that builds a graph (``create_graph``: double backward, which
# cuDNN's RNNs refuse and the CPU's composite allows) runs PyTorch's composite for the
# layer again and differentiates it. ``run`` does what the composite does around the
# layers: batch_first, the layers' and directions' order in ``params`` and the states,
# dropout between layers in training, the final states stacked.
# ``install`` registers it for the device's autograd key and its backend key (which
# inference mode reaches directly), for float32 and float64 operands on one jax
# device outside autocast and torch.func's transforms; half dtypes (where the CPU rounds each op's result), autocast
# (whose casts the composite's products get), packed sequences (``lstm.data``) and
# anything else keep the composite. A layer's computation compiles once per shape, the
# sequence's length included (about 0.35 s forward and 0.5-1 s backward a layer here),
# where the composite's cell ops compile once per batch and width; so a shape's first
# ``WARM`` calls run the composite and its later ones the one-op layers: a training loop
# over batches of one length pays its compiles once, and lengths seen once or twice (a
# ragged last batch, a test's samples: ModuleInfo's RNN tests took 53 s, 178 s with
# every call in one op) compile nothing more than before. Measured on the word language
# model's training step (pytorch/examples: a 2-layer LSTM 200 wide, 35 steps, batch 20,
# 33278 words; 2-core Xeon, runs of the two versions in turn, with NOTE [Column sums on
# XLA:CPU] in both): strict 529-754 -> 424-604 ms, fused 903-1516 -> 402-432 ms,
# PyTorch's CPU 233-320 ms in the same runs (most of the step is the decoder's products
# and log-softmax); the float32 error against a float64 reference 1.02-1.12x the CPU's
# on average over seeds, at most 1.45x (tests/test_rnn.py).

_MODES = {"rnn_tanh": 0, "rnn_relu": 1, "lstm": 2, "gru": 3}
_DTYPES = (torch.float32, torch.float64)


def _times_transposed(x, w):
    """``x @ w.T`` (XLA's product, which JAX differentiates; fused graphs' BLAS primitive has
    no derivative rule)."""
    return _dot(x, w, ((1,), (1,)))


def _layer(input, hx, cx, w_ih, w_hh, b_ih, b_hh, w_hr, mode, reverse):
    """One layer and direction over the sequence ``input`` (T, B, I): (its outputs (T, B,
    P), the last hidden state (B, P), LSTM's last cell state (B, H), else an empty array,
    and what the backward reads (NOTE [The backward of a recurrent layer]): the hidden
    state after each step (T, B, H) and LSTM's cell state after it (T, B, H), empty arrays
    where not read)."""
    steps, batch, width = input.shape
    gx = _times_transposed(input.reshape(steps * batch, width), w_ih)
    if b_ih is not None:
        gx = gx + b_ih
    gx = gx.reshape(steps, batch, -1)
    lstm = mode == _MODES["lstm"]

    def step(carry, gi):
        h, c = carry
        h, c = _cell(gi, _hidden_gates(h, w_hh, b_hh), h, c, mode)
        if w_hr is not None:
            h = _times_transposed(h, w_hr)
        return (h, c), (h, c) if lstm else h

    c0 = cx if cx is not None else jnp.zeros((0,), input.dtype)
    (h, c), ys = lax.scan(step, (hx, c0), gx, reverse=reverse)
    empty = jnp.zeros((0,), input.dtype)
    out, cs = ys if lstm else (ys, empty)
    if w_hr is not None:
        return out, h, c, empty, empty
    # (a copy of the outputs, not the outputs: the caller may write into those, as on the CPU)
    return out, h, c, jnp.copy(out), cs


def _hidden_gates(h, w_hh, b_hh):
    g = _times_transposed(h, w_hh)
    return g if b_hh is None else g + b_hh


def _cell(gi, gh, h, c, mode):
    """One step's new hidden (before LSTM's projection) and cell state from its input's
    gates ``gi`` and the hidden state's ``gh``: the CPU's cell, operation for operation."""
    if mode == _MODES["lstm"]:
        i, f, g, o = jnp.split(gh + gi, 4, axis=1)
        i, f, g, o = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(g), jax.nn.sigmoid(o)
        c = f * c + i * g
        return o * jnp.tanh(c), c
    if mode == _MODES["gru"]:
        ir, iz, in_ = jnp.split(gi, 3, axis=1)
        hr, hz, hn = jnp.split(gh, 3, axis=1)
        r = jax.nn.sigmoid(hr + ir)
        z = jax.nn.sigmoid(hz + iz)
        n = jnp.tanh(in_ + hn * r)
        return (h - n) * z + n, c
    pre = gh + gi
    return (jnp.tanh(pre) if mode == _MODES["rnn_tanh"] else jnp.maximum(pre, 0)), c


_SCHEMA = "Tensor input, Tensor hx, Tensor? cx, Tensor w_ih, Tensor w_hh, Tensor? b_ih, Tensor? b_hh, Tensor? w_hr"


# NOTE [The backward of a recurrent layer]: the backward reads the hidden state and
# (LSTM) the cell state after each step, outputs of the forward of their own (a copy:
# the layer's outputs are the user's to write into, as the CPU's are, where saving them
# would make such a write an error at the backward), so it never runs the forward's scan
# again. Every step's hidden gates are one product over the whole sequence of previous
# hidden states; the reverse scan then holds only what is sequential (a step's
# elementwise cell, differentiated, and the previous state's gradient, a product with
# w_hh), and the weights' and input's gradients are one product each after it.
# ``jax.vjp`` of the forward ran the forward's scan again inside the backward and summed
# w_hh's gradient a step at a time. Measured on one layer of the word language model's
# LSTM (35 steps, batch 20, 200 wide, float32, the 2-core EPYC, 2026-12-07, two hours of
# it, each pair in one process): the backward 13.3-21.9 against 20.0-32.5 ms, 0.53-0.82x
# in each pair (PyTorch's CPU 9.9-13.3, its forward 5.7-8.2 against this forward's
# 9.2-12.7); the input's and hidden state's gradients the same bits as jax.vjp's, the
# weights' within 1.3e-6 of them (one sum instead of one a step); the float32 error
# against a float64 reference as tests/test_rnn.py measures it, 3 seeds: 0.98-1.23x the
# CPU's, 0.94-1.22x before. The whole training step (2 layers, 2000 words, SGD): strict
# 83-106 against 105-127 ms, fused 65-71 against 70-84, the CPU 62-73, alternating runs
# with the CPU's losses. A projected LSTM (``proj_size``) keeps ``jax.vjp``.


def _layer_backward(input, hx, cx, w_ih, w_hh, b_ih, b_hh, w_hr, hs, cs, grad_out, grad_h, grad_c, mode, reverse):
    """The gradients of ``_layer``'s outputs' weighted sum: one for each operand given
    (not None), in order (NOTE [The backward of a recurrent layer])."""
    operands = [input, hx, cx, w_ih, w_hh, b_ih, b_hh, w_hr]
    if w_hr is not None:
        return _layer_vjp(operands, grad_out, grad_h, grad_c, mode, reverse)
    lstm = mode == _MODES["lstm"]
    time_order = (lambda a: jnp.flip(a, 0)) if reverse else (lambda a: a)
    x, hs, grad_out = time_order(input), time_order(hs), time_order(grad_out)
    steps, batch, width = x.shape
    h_prev = jnp.concatenate([hx[None], hs[:-1]])  # (T, B, H): each step's previous hidden state
    c_prev = jnp.concatenate([cx[None], time_order(cs)[:-1]]) if lstm else jnp.zeros((steps, 0), x.dtype)
    gx = _times_transposed(x.reshape(steps * batch, width), w_ih)
    gx = (gx if b_ih is None else gx + b_ih).reshape(steps, batch, -1)
    gh = _hidden_gates(h_prev.reshape(steps * batch, -1), w_hh, b_hh).reshape(steps, batch, -1)

    def back(carry, xs):
        dh, dc = carry
        gi_t, gh_t, h_t, c_t, g_t = xs
        _, pull = jax.vjp(lambda gi, gh, h, c: _cell(gi, gh, h, c, mode), gi_t, gh_t, h_t, c_t)
        dgi, dgh, dh_direct, dc = pull((dh + g_t, dc))
        return (dh_direct + _dot(dgh, w_hh, ((1,), (0,))), dc), (dgi, dgh)

    dc = grad_c if lstm else jnp.zeros((0,), x.dtype)
    (dh0, dc0), (dgi, dgh) = lax.scan(back, (grad_h, dc), (gx, gh, h_prev, c_prev, grad_out), reverse=True)
    dgi, dgh = dgi.reshape(steps * batch, -1), dgh.reshape(steps * batch, -1)
    grads = {
        0: time_order(_dot(dgi, w_ih, ((1,), (0,))).reshape(steps, batch, width)),
        1: dh0,
        2: dc0,
        3: _weight_gradient(dgi, x.reshape(steps * batch, width)),
        4: _weight_gradient(dgh, h_prev.reshape(steps * batch, -1)),
        5: dgi.sum(0),
        6: dgh.sum(0),
    }
    return [grads[i] for i, operand in enumerate(operands) if operand is not None]


def _weight_gradient(d, x):
    """``d.T @ x`` (NOTE [Weight gradients on XLA:CPU] in ops/_matmul)."""
    return lax.platform_dependent(d.T, x, cpu=_transposed_lhs_on_cpu, default=_plain_matmul)


def _layer_vjp(operands, grad_out, grad_h, grad_c, mode, reverse):
    """``_layer``'s gradients through ``jax.vjp`` (its forward again inside)."""
    given = [i for i, x in enumerate(operands) if x is not None]

    def f(*xs):
        filled = list(operands)
        for i, x in zip(given, xs):
            filled[i] = x
        return _layer(*filled, mode, reverse)[:3]

    _, pull = jax.vjp(f, *[operands[i] for i in given])
    return list(pull((grad_out, grad_h, grad_c)))


rnn_layer = jax_op(
    "torch_jax::rnn_layer",
    _layer,
    schema=f"({_SCHEMA}, int mode, bool reverse) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    static=("mode",),
    autograd=False,
)
rnn_layer_backward = jax_op(
    "torch_jax::rnn_layer_backward",
    _layer_backward,
    schema=f"({_SCHEMA}, Tensor hs, Tensor cs, Tensor grad_out, Tensor grad_h, Tensor grad_c, int mode, bool reverse) -> Tensor[]",
    static=("mode",),
    autograd=False,
)


def _setup_context(ctx, inputs, output):
    *operands, ctx.mode, ctx.reverse = inputs
    ctx.save_for_backward(*operands, output[3], output[4])


def _backward(ctx, grad_out, grad_h, grad_c, grad_hs, grad_cs):
    *operands, hs, cs = ctx.saved_tensors
    outs = [grad_out, grad_h, grad_c]
    if torch.is_grad_enabled():  # create_graph: gradients made of differentiable ops
        return (*_composite_grads(operands, outs, ctx.mode, ctx.reverse), None, None)
    shapes = _output_shapes(operands)
    outs = [
        torch.zeros(s, dtype=operands[0].dtype, device=operands[0].device) if g is None else g
        for g, s in zip(outs, shapes)
    ]
    grads = iter(rnn_layer_backward(*operands, hs, cs, *outs, ctx.mode, ctx.reverse))
    return (*(None if x is None else next(grads) for x in operands), None, None)


def _output_shapes(operands):
    input, hx, cx = operands[:3]
    return (*input.shape[:2], hx.shape[1]), tuple(hx.shape), (0,) if cx is None else tuple(cx.shape)


def _composite_grads(operands, outs, mode, reverse):
    """Double backward: the layer again through PyTorch's composite (cell ops, each
    differentiable), and its gradients with a graph."""
    input, hx, cx, *weights = operands
    params = [w for w in weights if w is not None]
    has_biases = weights[2] is not None
    x = input.flip(0) if reverse else input
    name = next(n for n, m in _MODES.items() if m == mode)
    op = getattr(torch.ops.aten, name).input
    states = [hx[None], cx[None]] if cx is not None else hx[None]
    out, h, *c = op._op_dk(_COMPOSITE, x, states, params, has_biases, 1, 0.0, False, False, False)
    results = [out.flip(0) if reverse else out, h[0], c[0][0] if c else None]
    pairs = [(r, g) for r, g in zip(results, outs) if r is not None and g is not None]
    wrt = [x for x in operands if x is not None and x.requires_grad]
    grads = iter(
        torch.autograd.grad([r for r, _ in pairs], wrt, [g for _, g in pairs], create_graph=True, allow_unused=True)
    )
    return [next(grads) if x is not None and x.requires_grad else None for x in operands]


torch.library.register_autograd(
    "torch_jax::rnn_layer", _backward, setup_context=_setup_context, lib=_library("torch_jax")
)


def fits(input: torch.Tensor, tensors) -> bool:
    """The one-op layers take these operands (else the composite runs)."""
    if input.device.type != "jax" or input.dtype not in _DTYPES or input.dim() != 3 or input.is_nested:
        return False
    return all(t.device == input.device and t.dtype == input.dtype and not t.is_nested for t in tensors)


def run(name, input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    """``aten::<name>.input`` (lstm, gru, rnn_tanh, rnn_relu) with a layer and direction
    an op: (output, the last hidden states[, LSTM's last cell states])."""
    mode = _MODES[name]
    dirs = 2 if bidirectional else 1
    h0, c0 = (hx[0], hx[1]) if mode == _MODES["lstm"] else (hx, None)
    per = len(params) // (num_layers * dirs)  # w_ih, w_hh[, b_ih, b_hh][, w_hr]
    projected = per == 2 + 2 * bool(has_biases) + 1
    x = input.transpose(0, 1) if batch_first else input
    hs, cs = [], []
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            k = layer * dirs + d
            w = params[k * per : (k + 1) * per]
            b_ih, b_hh = (w[2], w[3]) if has_biases else (None, None)
            w_hr = w[-1] if projected else None
            out, h, c, _, _ = rnn_layer(
                x, h0[k], None if c0 is None else c0[k], w[0], w[1], b_ih, b_hh, w_hr, mode, d == 1
            )
            outs.append(out)
            hs.append(h)
            cs.append(c)
        x = outs[0] if dirs == 1 else torch.cat(outs, 2)
        if dropout != 0 and train and layer < num_layers - 1:
            x = torch.dropout(x, dropout, train)
    out = x.transpose(0, 1) if batch_first else x
    if mode == _MODES["lstm"]:
        return out, torch.stack(hs), torch.stack(cs)
    return out, torch.stack(hs)


_COMPOSITE = torch._C.DispatchKey.CompositeImplicitAutograd
WARM = 2  # a shape's calls through the composite before its layers run as one op each
_calls: dict = {}  # shapes of recurrent calls -> how many so far (up to WARM)


def _repeated(key) -> bool:
    """Whether ``key``'s shapes were called ``WARM`` times before (this call counts)."""
    n = _calls.get(key, 0)
    if n >= WARM:
        return True
    if len(_calls) >= 4096:  # (bounded: many lengths seen once start again)
        _calls.clear()
    _calls[key] = n + 1
    return False


def _kernel(name: str):
    """``aten::<name>.input``'s kernel: the layers as one op each where they fit, else
    PyTorch's composite. Under autocast the composite runs, so that its products are cast
    as on any device, and under torch.func's transforms (``grad``, ``vmap``), which take
    it as they take it on the CPU."""
    op = getattr(torch.ops.aten, name).input

    def kernel(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
        states = hx if isinstance(hx, (list, tuple)) else [hx]
        args = (input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
        if (
            torch.is_autocast_enabled(input.device.type)
            or torch._C._are_functorch_transforms_active()
            or not fits(input, [*states, *params])
            or not _repeated((name, input.shape, input.dtype, input.device, *(t.shape for t in (*states, *params))))
        ):
            return op._op_dk(_COMPOSITE, *args)  # (the C++ composite; ``decompose`` runs torch._decomp's)
        return run(name, *args)

    kernel.__name__ = name
    return op, kernel


def install(lib: torch.library.Library, registered: dict) -> None:
    """Register the recurrent ops' kernels for the device's autograd and backend keys."""
    for name in _MODES:
        op, kernel = _kernel(name)
        lib.impl(op, kernel, "AutogradPrivateUse1")
        lib.impl(op, kernel, "PrivateUse1")
        registered[op] = "one op a layer"
