"""Ops that read their context in compiled graphs (NOTE [Ops that read their context] in
compile/_graph): an op that finds a tensor by name in state of its library (as vLLM's
attention finds a layer's KV cache in its forward context) runs inside the graph's one XLA
computation, the tensor gathered at each call as an input; one it writes is updated in
place (donated) and seen by a later read in the same graph; a call whose context cannot
be gathered runs op by op, through the op's eager kernel."""

from __future__ import annotations

import pytest
import torch

import torch_jax
from torch_jax.compile._graph import CONTEXT_OPS, ContextLowering

STATE: dict = {}  # the ops' context: a name -> a tensor
GATHER = {"on": True}  # (off: the library cannot gather, as vLLM's profiling run has no metadata)

_lib = torch.library.Library("tjcontext", "FRAGMENT")
_lib.define("add_state(Tensor x, str name) -> Tensor")
_lib.define("accumulate(Tensor x, str name) -> Tensor")
_lib.define("scale_into(Tensor(a!) out, Tensor x, str name) -> ()")


def _add_state(x, name):
    return x + STATE[name]


def _accumulate(x, name):  # (writes its context; returns an empty tensor, an ordering token)
    STATE[name].add_(x.sum(0))
    return x.new_empty(0)


def _scale_into(out, x, name):
    out.copy_(x * STATE[name])


for _name, _fn in (("add_state", _add_state), ("accumulate", _accumulate), ("scale_into", _scale_into)):
    _lib.impl(_name, _fn, "CompositeExplicitAutograd")
_lib.impl("add_state", lambda x, name: torch.empty_like(x), "Meta")
_lib.impl("accumulate", lambda x, name: x.new_empty(0), "Meta")
_lib.impl("scale_into", lambda out, x, name: None, "Meta")
ops = torch.ops.tjcontext


def _gather(arguments):
    return [STATE[arguments["name"]]] if GATHER["on"] else None


CONTEXT_OPS[ops.add_state.default] = ContextLowering(_gather, lambda a, g: (a["x"] + g[0], {}))
CONTEXT_OPS[ops.accumulate.default] = ContextLowering(
    _gather, lambda a, g: (a["x"].reshape(-1)[:0], {0: g[0] + a["x"].sum(0)}), writes=(0,)
)
CONTEXT_OPS[ops.scale_into.default] = ContextLowering(_gather, lambda a, g: ({"out": a["x"] * g[0]}, {}))


def step(x):
    token = ops.accumulate(x * 2, "acc")  # (the state's new value: read by add_state after it)
    y = ops.add_state(x, "acc") + token.sum()
    out = torch.empty_like(y)
    ops.scale_into(out, y, "scale")
    return out.relu()


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    STATE.clear()
    yield
    STATE.clear()
    GATHER["on"] = True


def _run(device, compiled, xs):
    STATE["acc"] = torch.zeros(4, device=device)
    STATE["scale"] = torch.tensor([1.0, -2.0, 0.5, 3.0], device=device)
    fn = torch.compile(step, backend="jax", fullgraph=True) if compiled else step
    outs = []
    for x in xs:
        outs.append(fn(x.to(device)).cpu())
        STATE["scale"] = STATE["scale"] * 1.5  # (a new tensor in the context: the next call gathers it)
    return outs, STATE["acc"].cpu()


def test_context_ops_run_in_the_graph_and_write_their_context_in_place():
    xs = [torch.randn(3, 4, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    want, want_acc = _run("cpu", False, xs)
    torch_jax.reset_stats()
    STATE.clear()
    got, got_acc = _run("jax", True, xs)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    torch.testing.assert_close(got_acc, want_acc)
    stats = torch_jax.stats()
    assert stats.get("compiled_graph_eager_calls", 0) == 0
    # (one computation for the four calls: compiled, or loaded from CI's shared persistent cache)
    assert stats.get("compiled_graph_compiles", 0) + stats.get("compiled_graph_loads", 0) == 1
    assert stats["compiled_graph_calls"] == 4


def test_the_written_context_is_donated():
    STATE["acc"] = torch.zeros(4, device="jax")
    STATE["scale"] = torch.ones(4, device="jax")
    fn = torch.compile(step, backend="jax", fullgraph=True)
    fn(torch.ones(3, 4, device="jax"))
    box = STATE["acc"].untyped_storage()._box
    before = box.arr.unsafe_buffer_pointer()  # (no reference kept: one would stop the donation)
    fn(torch.ones(3, 4, device="jax"))
    assert box.arr.unsafe_buffer_pointer() == before  # (the new value written over the old one's buffer)
    torch.testing.assert_close(STATE["acc"].cpu(), torch.full((4,), 12.0))


def test_a_context_that_cannot_be_gathered_runs_op_by_op():
    xs = [torch.randn(3, 4, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    want, want_acc = _run("cpu", False, xs)
    GATHER["on"] = False
    torch_jax.reset_stats()
    got, got_acc = _run("jax", True, xs)
    assert torch_jax.stats()["compiled_graph_eager_calls"] == 2
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    torch.testing.assert_close(got_acc, want_acc)
