"""nn.LSTM/GRU and their cells: on an accelerator PyTorch runs the fused cell ops
(_thnn_fused_lstm_cell, _thnn_fused_gru_cell), which the CPU never uses; outputs and
gradients must still match the CPU's unfused cells."""

from __future__ import annotations

import copy

import pytest
import torch


def _flat(o):
    out = []
    for t in o if isinstance(o, tuple) else (o,):
        out.extend(t if isinstance(t, tuple) else (t,))
    return out


@pytest.mark.parametrize(
    "cls, kw",
    [
        (torch.nn.LSTM, dict(num_layers=2, bidirectional=True)),
        (torch.nn.LSTM, dict(bias=False, proj_size=3, batch_first=True)),
        (torch.nn.GRU, dict(num_layers=2)),
        (torch.nn.GRU, dict(bias=False, bidirectional=True)),
        (torch.nn.LSTMCell, {}),
        (torch.nn.GRUCell, dict(bias=False)),
    ],
    ids=["lstm-bi", "lstm-proj-nobias", "gru", "gru-bi-nobias", "lstm-cell", "gru-cell-nobias"],
)
def test_rnn_forward_and_backward_match_cpu(cls, kw):
    torch.manual_seed(0)
    cpu = cls(5, 6, **kw).double()
    dev = copy.deepcopy(cpu).to("jax")
    shape = (4, 5) if cls.__name__.endswith("Cell") else (7, 4, 5)
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    xj = x.detach().to("jax").requires_grad_()
    outs, outs_j = _flat(cpu(x)), _flat(dev(xj))
    sum((o * o).sum() for o in outs).backward()
    sum((o * o).sum() for o in outs_j).backward()
    for a, b in zip(outs, outs_j):
        torch.testing.assert_close(b.detach().cpu(), a.detach())
    for a, b in zip([x, *cpu.parameters()], [xj, *dev.parameters()]):
        torch.testing.assert_close(b.grad.cpu(), a.grad)


def test_lstm_double_backward():
    torch.manual_seed(0)
    cpu = torch.nn.LSTMCell(3, 4).double()
    dev = copy.deepcopy(cpu).to("jax")
    results = []
    for m, x in ((cpu, torch.randn(2, 3, dtype=torch.float64)), (dev, None)):
        x = results[0][0].to("jax") if x is None else x
        x = x.detach().requires_grad_()
        g = torch.autograd.grad(m(x)[0].tanh().sum(), x, create_graph=True)[0]
        results.append((x.detach(), torch.autograd.grad(g.square().sum(), x)[0]))
    torch.testing.assert_close(results[1][1].cpu(), results[0][1])


# NOTE [Recurrent layers in one op]: nn.LSTM/GRU/RNN run a layer and direction as one op
_LAYERS = [
    (torch.nn.LSTM, dict(num_layers=2)),
    (torch.nn.LSTM, dict(bidirectional=True, batch_first=True)),
    (torch.nn.LSTM, dict(proj_size=3, bias=False)),
    (torch.nn.GRU, dict(num_layers=2, bidirectional=True)),
    (torch.nn.RNN, dict(nonlinearity="tanh", batch_first=True)),
    (torch.nn.RNN, dict(nonlinearity="relu", num_layers=2, bias=False)),
]
_IDS = ["lstm", "lstm-bi-batch-first", "lstm-proj-nobias", "gru-bi", "rnn-tanh", "rnn-relu-nobias"]


def _warm() -> int:
    """Calls that bring a shape to the one-op layers (its first take the composite)."""
    from torch_jax.kernels import _rnn

    return _rnn.WARM + 1


def _run(module, x, calls=1):
    """Outputs and gradients of the last of ``calls`` calls (a shape's first calls take
    PyTorch's composite: ``_warm``)."""
    for _ in range(calls - 1):
        with torch.no_grad():
            module(x)
    module.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_()
    out, h = module(x)
    h = h[0] if isinstance(h, tuple) else h
    (out.square().sum() + h.sum()).backward()
    grads = [x.grad, *(p.grad for p in module.parameters())]
    return [t.detach().cpu().double() for t in (out, *grads)]


# (each layer and direction compiles a scan and its backward for each length: two
# configurations here, every one in the accuracy test below)
@pytest.mark.parametrize(
    "cls, kw",
    [(torch.nn.LSTM, dict(num_layers=2)), (torch.nn.GRU, dict(bidirectional=True, batch_first=True))],
    ids=["lstm", "gru-bi-batch-first"],
)
def test_recurrent_layers_run_in_one_op_a_layer_whatever_the_length(cls, kw):
    import torch_jax

    torch.manual_seed(0)
    dev = cls(5, 6, **kw).to("jax")
    counts = []
    for steps in (3, 11):
        x = torch.randn(4, steps, 5) if kw.get("batch_first") else torch.randn(steps, 4, 5)
        _run(dev, x.to("jax"), calls=_warm())  # (compiles)
        torch_jax.reset_stats()
        _run(dev, x.to("jax"))
        counts.append(torch_jax.stats()["ops"])
    assert counts[0] == counts[1], counts  # (the composite's ops grow with the steps)
    assert counts[0] < 60, counts
    torch_jax.reset_stats()
    _run(dev, torch.randn(4, 7, 5).to("jax"))  # (a new shape: the composite, a cell a step)
    assert torch_jax.stats()["ops"] > counts[0], (torch_jax.stats()["ops"], counts)


def test_the_count_of_each_shapes_calls_is_bounded(monkeypatch):
    # (a program of ever new lengths, each seen once: the counter starts again past 4096
    # shapes instead of growing; a shape seen WARM times runs as one op a layer)
    from torch_jax.kernels import _rnn

    monkeypatch.setattr(_rnn, "_calls", {})
    for n in range(10_000):
        assert not _rnn._repeated(("lstm", n))
        assert len(_rnn._calls) <= 4096
    for _ in range(_rnn.WARM):
        assert not _rnn._repeated(("lstm", -1))
    assert _rnn._repeated(("lstm", -1))


@pytest.mark.parametrize("cls, kw", _LAYERS, ids=_IDS)
def test_recurrent_layers_float32_error_is_the_cpus(cls, kw):
    """Outputs and gradients in float32 against a float64 reference: the one-op layers'
    error against the CPU's float32 composite's, over seeds (measured: 1.02-1.12x on
    average, at most 1.45x)."""
    ours_total = cpu_total = 0.0
    for seed in range(3):
        torch.manual_seed(seed)
        ref = cls(16, 24, **kw).double()
        x = torch.randn(4, 12, 16, dtype=torch.float64) if kw.get("batch_first") else torch.randn(12, 4, 16).double()
        exact = _run(ref, x)
        cpu = _run(copy.deepcopy(ref).float(), x.float())
        ours = _run(copy.deepcopy(ref).float().to("jax"), x.float().to("jax"), calls=_warm())
        rel = [max(((a - e).abs().max() / e.abs().max()).item() for a, e in zip(r, exact)) for r in (ours, cpu)]
        assert rel[0] <= 2 * rel[1], (seed, rel)
        ours_total, cpu_total = ours_total + rel[0], cpu_total + rel[1]
    assert ours_total <= 1.5 * cpu_total, (ours_total, cpu_total)


def _on_the_cpu_and_jax(cls, **kw):
    """A float64 layer of ``cls`` (3 features, 4 hidden, seed 0) and a (5, 2, 3) input: the
    pair on the CPU, and a copy of the pair on jax."""
    torch.manual_seed(0)
    cpu = cls(3, 4, **kw).double()
    x = torch.randn(5, 2, 3, dtype=torch.float64)
    return [(cpu, x), (copy.deepcopy(cpu).to("jax"), x.to("jax"))]


def test_recurrent_layers_double_backward_and_inference_mode_match_cpu():
    results = []
    for m, xx in _on_the_cpu_and_jax(torch.nn.GRU):
        _run(m, xx, calls=_warm())  # (the one-op layers from here)
        xx = xx.detach().requires_grad_()
        g = torch.autograd.grad(m(xx)[0].tanh().sum(), xx, create_graph=True)[0]
        results.append(torch.autograd.grad(g.square().sum(), xx)[0].cpu())
        with torch.inference_mode():
            results.append(m(xx.detach())[1].cpu())
    torch.testing.assert_close(results[2], results[0])
    torch.testing.assert_close(results[3], results[1])


def test_recurrent_layers_under_autocast_and_in_half_take_the_composite():
    """Under autocast the composite's products are cast (bfloat16 results, as on the CPU);
    a half dtype keeps the composite (the CPU rounds each op's result)."""
    torch.manual_seed(0)
    cpu = torch.nn.LSTM(4, 8)
    dev = copy.deepcopy(cpu).to("jax")
    x = torch.randn(6, 2, 4)
    try:
        with torch.autocast("cpu", torch.bfloat16):
            want = cpu(x)[0]
    except RuntimeError as e:
        # (PyTorch's CPU runs an autocast LSTM through oneDNN's bfloat16 layer, which CPUs
        # without AVX-512 lack: "could not create a primitive descriptor" on a 2-core AMD
        # EPYC. There the reference is the layer in bfloat16, what autocast's casts give.)
        assert "primitive descriptor" in str(e), e
        want = copy.deepcopy(cpu).bfloat16()(x.bfloat16())[0]
    with torch.autocast("jax", torch.bfloat16):
        got = dev(x.to("jax"))[0]
    assert got.dtype == want.dtype == torch.bfloat16
    # (the composite's fused cells on jax compute each cell in float32, the CPU's cells round
    # each op to bfloat16: a bfloat16 step apart)
    torch.testing.assert_close(got.cpu(), want, atol=4e-3, rtol=0)
    half = copy.deepcopy(cpu).to(torch.bfloat16)
    got = half.to("jax")(x.bfloat16().to("jax"))[0]
    torch.testing.assert_close(got.cpu(), copy.deepcopy(half).cpu()(x.bfloat16())[0], atol=4e-3, rtol=0)


def test_recurrent_layers_under_torch_func_grad_match_cpu():
    """torch.func's transforms take the composite, on jax as on the CPU."""
    from torch.func import functional_call, grad

    grads = []
    for m, xx in _on_the_cpu_and_jax(torch.nn.LSTM, num_layers=2):
        g = grad(lambda p, m=m, xx=xx: functional_call(m, p, (xx,))[0].square().sum())(dict(m.named_parameters()))
        grads.append({k: v.cpu() for k, v in g.items()})
    torch.testing.assert_close(grads[1], grads[0])


@pytest.mark.parametrize("mode, projected", [("lstm", False), ("gru", False), ("rnn_tanh", False), ("lstm", True)])
def test_the_backward_of_a_layer_runs_one_scan(mode, projected):
    """NOTE [The backward of a recurrent layer]: the backward's computation reads the
    forward's saved states and runs the reverse scan alone, not the forward's scan again
    (a projected LSTM keeps jax.vjp's two)."""
    import jax
    import jax.numpy as jnp

    from torch_jax.kernels import _rnn

    steps, batch, width, hidden = 5, 2, 3, 4
    gates = {"lstm": 4, "gru": 3, "rnn_tanh": 1}[mode] * hidden
    out_width = 2 if projected else hidden
    f = jnp.float32
    s = jax.ShapeDtypeStruct
    operands = [
        s((steps, batch, width), f),
        s((batch, out_width), f),
        s((batch, hidden), f) if mode == "lstm" else None,
        s((gates, width), f),
        s((gates, out_width), f),
        s((gates,), f),
        s((gates,), f),
        s((out_width, hidden), f) if projected else None,
    ]
    hs = s((0,), f) if projected else s((steps, batch, hidden), f)
    cs = s((steps, batch, hidden), f) if mode == "lstm" and not projected else s((0,), f)
    grads = [
        s((steps, batch, out_width), f),
        s((batch, out_width), f),
        s((batch, hidden) if mode == "lstm" else (0,), f),
    ]
    given = [i for i, x in enumerate(operands) if x is not None]

    def backward(*xs):
        filled = list(operands)
        for i, x in zip(given, xs[: len(given)]):
            filled[i] = x
        return _rnn._layer_backward(*filled, *xs[len(given) :], _rnn._MODES[mode], False)

    args = [operands[i] for i in given] + [hs, cs, *grads]
    text = jax.jit(backward).lower(*args).as_text()
    assert text.count("stablehlo.while") == (2 if projected else 1), text.count("stablehlo.while")


def test_a_layers_outputs_written_in_place_before_the_backward_as_on_the_cpu():
    """The backward reads saved states of its own, not the outputs, which the caller may
    write into (the CPU allows it)."""
    grads = []
    for m, xx in _on_the_cpu_and_jax(torch.nn.LSTM, num_layers=2):
        _run(m, xx, calls=_warm())  # (the one-op layers from here)
        m.zero_grad(set_to_none=True)
        out, _ = m(xx)
        out.mul_(2)
        out.square().sum().backward()
        grads.append([p.grad.cpu() for p in m.parameters()])
    torch.testing.assert_close(grads[1], grads[0])
