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
