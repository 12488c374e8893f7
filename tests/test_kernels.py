"""Custom kernels and JAX interop: JAX functions as operators (strict and fused eager,
torch.compile, autograd), lowerings overridden, tensors and JAX arrays shared, and the
two kernel examples against PyTorch on the CPU."""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
import torch
from tests.conftest import config_as

import torch_jax

ROOT = Path(__file__).resolve().parents[1]
aten = torch.ops.aten


def _example(name: str):
    """An example as a module, once a process (its ops are defined once; benchmarks/workloads
    loads them under the same name)."""
    module = sys.modules.get(f"examples_{name}")
    if module is None:
        spec = importlib.util.spec_from_file_location(f"examples_{name}", ROOT / "examples" / f"{name}.py")
        module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # (Dynamo looks modules up)
        spec.loader.exec_module(module)
    return module


def _gelu_scale(x: jax.Array, bias: jax.Array | None = None, *, scale: float = 1.0) -> jax.Array:
    y = jax.nn.gelu(x * scale, approximate=False)
    return y if bias is None else y + bias


gelu_scale = torch_jax.jax_op("tj_test::gelu_scale", _gelu_scale)


def _split_max(x: jax.Array, ys: list[jax.Array]) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Three outputs: a float, a list's sum and an integer one (no gradient)."""
    total = x
    for y in ys:
        total = total + y * y
    return jnp.sin(total), jnp.cumsum(x, axis=0), jnp.argmax(x, axis=-1)


split_max = torch_jax.jax_op("tj_test::split_max", _split_max)


@jax.custom_vjp
def _round_ste(x):
    return jnp.round(x)


_round_ste.defvjp(lambda x: (jnp.round(x), None), lambda _, g: (g,))  # straight-through: identity gradient


def _round_ste_op(x: jax.Array) -> jax.Array:
    return _round_ste(x) * 1.0


round_ste = torch_jax.jax_op("tj_test::round_ste", _round_ste_op)


def _axpy_(y: jax.Array, x: jax.Array, alpha: float) -> None:
    return y + alpha * x  # (the new value of the mutated y)


axpy_ = torch_jax.jax_op("tj_test::axpy_", _axpy_, mutates_args=("y",), traced=("alpha",))
on_cpu_too = torch_jax.jax_op(
    "tj_test::on_cpu_too", lambda x: x * 2, schema="(Tensor x) -> Tensor", cpu=lambda x: x * 2
)


def _modes():
    """Eager in the run's mode (CI runs the file strict and fused), and compiled."""
    return ["eager", "compiled"]


def _maybe_compile(fn, mode):
    return torch.compile(fn, backend="jax", fullgraph=True) if mode == "compiled" else fn


# ---------------------------------------------------------------- jax_op


def test_schemas_come_from_the_annotations():
    assert str(gelu_scale._schema) == "tj_test::gelu_scale(Tensor x, Tensor? bias=None, *, float scale=1.) -> Tensor"
    assert str(split_max._schema) == "tj_test::split_max(Tensor x, Tensor[] ys) -> (Tensor, Tensor, Tensor)"
    assert str(axpy_._schema) == "tj_test::axpy_(Tensor(a0!) y, Tensor x, float alpha) -> ()"
    with pytest.raises(ValueError, match="annotate"):
        torch_jax.jax_op("tj_test::unannotated", lambda x: x)
    with pytest.raises(ValueError, match="namespace::op"):
        torch_jax.jax_op("no_namespace", _round_ste_op)


@pytest.mark.parametrize("mode", _modes())
def test_a_jax_op_matches_pytorch_in_values_and_gradients(mode):
    torch.manual_seed(0)
    x, bias, w = torch.randn(4, 6), torch.randn(6), torch.randn(4, 6)
    expected_x, expected_b = x.clone().requires_grad_(), bias.clone().requires_grad_()
    expected = torch.nn.functional.gelu(expected_x * 1.5) + expected_b
    (expected * w).sum().backward()
    xj, bj = x.to("jax").requires_grad_(), bias.to("jax").requires_grad_()
    fn = _maybe_compile(lambda a, b, c: (gelu_scale(a, b, scale=1.5) * c).sum(), mode)
    fn(xj, bj, w.to("jax")).backward()
    torch.testing.assert_close(xj.grad.cpu(), expected_x.grad)
    torch.testing.assert_close(bj.grad.cpu(), expected_b.grad)
    torch.testing.assert_close(gelu_scale(xj, bj, scale=1.5).detach().cpu(), expected.detach())


@pytest.mark.parametrize("mode", _modes())
def test_several_outputs_lists_and_integer_outputs(mode):
    torch.manual_seed(0)
    x, ys = torch.randn(3, 5), [torch.randn(3, 5), torch.randn(3, 5)]
    cx, cys = x.clone().requires_grad_(), [y.clone().requires_grad_() for y in ys]
    total = cx + sum(y * y for y in cys)
    expected = (torch.sin(total), torch.cumsum(cx, 0), torch.argmax(cx, -1))
    (expected[0].sum() + (expected[1] * 2).sum()).backward()
    jx, jys = x.to("jax").requires_grad_(), [y.to("jax").requires_grad_() for y in ys]

    got = _maybe_compile(split_max, mode)(jx, jys)
    (got[0].sum() + (got[1] * 2).sum()).backward()
    assert got[2].dtype == torch.int64 and not got[2].requires_grad
    for g, e in zip(got, expected):
        torch.testing.assert_close(g.detach().cpu(), e.detach())
    torch.testing.assert_close(jx.grad.cpu(), cx.grad)
    for jy, cy in zip(jys, cys):
        torch.testing.assert_close(jy.grad.cpu(), cy.grad)


def test_a_custom_vjp_brings_its_own_gradient():
    x = torch.tensor([0.2, 1.7, -2.4], device="jax", requires_grad=True)
    y = round_ste(x)
    y.sum().backward()
    assert y.cpu().tolist() == [0.0, 2.0, -2.0]
    assert x.grad.cpu().tolist() == [1.0, 1.0, 1.0]  # (the true derivative of round is 0)


@pytest.mark.parametrize("mode", _modes())
def test_a_mutating_op_writes_through_views(mode):
    base = torch.zeros(3, 4)
    x = torch.arange(4.0)
    expected = base.clone()
    expected[1] += 0.5 * x
    jbase = base.to("jax")

    def write(b, a):
        axpy_(b[1], a, 0.5)

    _maybe_compile(write, mode)(jbase, x.to("jax"))
    torch.testing.assert_close(jbase.cpu(), expected)


def test_traced_scalars_do_not_compile_again():
    y, x = torch.zeros(5, device="jax"), torch.ones(5, device="jax")
    axpy_(y, x, 0.1)
    torch_jax.mark_step()
    before = torch_jax.stats()["compiles"]
    for alpha in (0.2, 0.3, 0.4):
        axpy_(y, x, alpha)
    torch.testing.assert_close(y.cpu(), torch.full((5,), 1.0))
    assert torch_jax.stats()["compiles"] == before


def test_cpu_tensors_raise_or_run_the_declared_implementation():
    with pytest.raises(RuntimeError, match=r'tj_test::round_ste is a JAX op: .* \.to\("jax"\)'):
        round_ste(torch.ones(2))
    assert on_cpu_too(torch.ones(2)).tolist() == [2.0, 2.0]
    assert on_cpu_too(torch.ones(2, device="jax")).cpu().tolist() == [2.0, 2.0]


def test_a_failing_jax_function_raises_its_own_error():
    bad = torch_jax.jax_op("tj_test::bad", lambda x: x @ x, schema="(Tensor x) -> Tensor")
    with pytest.raises(TypeError, match="dot_general requires contracting dimensions to have the same shape"):
        bad(torch.ones(2, 3, device="jax"))


# ---------------------------------------------------------------- override


def _doubled_relu(x):
    return jnp.maximum(x, 0) * 2


def test_an_override_runs_in_eager_and_compiled_code_and_goes_away():
    x = torch.tensor([-1.0, 2.0, 3.0], device="jax")
    compiled = torch.compile(lambda a: torch.relu(a) + 1, backend="jax")
    assert compiled(x).cpu().tolist() == [1.0, 3.0, 4.0]
    with torch_jax.override(aten.relu.default, _doubled_relu):
        assert torch.relu(x).cpu().tolist() == [0.0, 4.0, 6.0]
        assert x.clone().relu_().cpu().tolist() == [0.0, 4.0, 6.0]  # (the in-place op is derived from it)
        assert compiled(x).cpu().tolist() == [1.0, 5.0, 7.0]
    assert torch.relu(x).cpu().tolist() == [0.0, 2.0, 3.0]
    assert x.clone().relu_().cpu().tolist() == [0.0, 2.0, 3.0]
    assert compiled(x).cpu().tolist() == [1.0, 3.0, 4.0]
    handle = torch_jax.override(aten.relu.default, _doubled_relu)  # (global, until removed)
    try:
        assert torch.relu(x).cpu().tolist() == [0.0, 4.0, 6.0]
    finally:
        handle.remove()
    assert torch.relu(x).cpu().tolist() == [0.0, 2.0, 3.0]
    from torch_jax.ops._registry import DECLARED_FALLBACKS

    with pytest.raises(ValueError, match="no lowering"):
        torch_jax.override(next(iter(DECLARED_FALLBACKS)), _doubled_relu)
    with pytest.raises(TypeError, match="op overload"):
        torch_jax.override("relu", _doubled_relu)


def test_check_override_compares_values_and_gradients():
    x = torch.randn(4, 5, device="jax")
    report = torch_jax.check_override(aten.gelu.default, lambda a, approximate: jax.nn.gelu(a, False), x)
    assert set(report) == {"output 0", "gradient 0"} and report["output 0"] < 1e-6
    with pytest.raises(AssertionError, match="aten.relu.default output 0"):
        torch_jax.check_override(aten.relu.default, _doubled_relu, x)


# ---------------------------------------------------------------- interop


def test_to_jax_and_from_jax_share_the_array():
    t = torch.arange(6.0).reshape(2, 3).to("jax")
    a = torch_jax.to_jax(t)
    assert isinstance(a, jax.Array) and a.shape == (2, 3) and a.dtype == jnp.float32
    assert torch_jax.to_jax(t) is a  # (the storage's own array, no copy)
    back = torch_jax.from_jax(a)
    assert back.device == torch.device("jax:0") and torch_jax.to_jax(back) is a
    t.add_(1)  # a new array in t's storage: the old one keeps its values (JAX arrays are immutable)
    assert a.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert back.cpu().tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert torch_jax.to_jax(t[:, 1]).tolist() == [2.0, 5.0]  # a view: its values
    assert torch_jax.to_jax(t.t()).shape == (3, 2)
    pending = t * 2  # (pending in fused mode: computed first)
    assert torch_jax.to_jax(pending).tolist() == [[2.0, 4.0, 6.0], [8.0, 10.0, 12.0]]
    with pytest.raises(TypeError, match="jax tensor"):
        torch_jax.to_jax(torch.ones(2))


@pytest.mark.two_devices
def test_from_jax_keeps_or_moves_the_device():
    a = jax.device_put(jnp.ones(3, jnp.int32), jax.local_devices()[1])
    t = torch_jax.from_jax(a)
    assert t.device == torch.device("jax:1") and t.dtype == torch.int32
    moved = torch_jax.from_jax(a, device="jax:0")
    assert moved.device == torch.device("jax:0") and moved.cpu().tolist() == [1, 1, 1]


def test_call_jax_runs_a_jax_function_with_autograd():
    torch.manual_seed(0)
    w, b, x = torch.randn(3, 4), torch.randn(3), torch.randn(4)
    cw, cb = w.clone().requires_grad_(), b.clone().requires_grad_()
    expected = torch.tanh(cw @ x + cb)
    (expected * torch.arange(3.0)).sum().backward()
    params = {"w": w.to("jax").requires_grad_(), "b": b.to("jax").requires_grad_()}

    def apply(p, z):
        h = jnp.tanh(p["w"] @ z + p["b"])
        return {"out": h, "argmax": jnp.argmax(h)}

    out = torch_jax.call_jax(apply, params, x.to("jax"))
    assert out["argmax"].dtype == torch.int64 and not out["argmax"].requires_grad
    (out["out"] * torch.arange(3.0, device="jax")).sum().backward()
    torch.testing.assert_close(out["out"].detach().cpu(), expected.detach())
    torch.testing.assert_close(params["w"].grad.cpu(), cw.grad)
    torch.testing.assert_close(params["b"].grad.cpu(), cb.grad)
    with torch.no_grad():
        plain = torch_jax.call_jax(apply, params, x.to("jax"))
    assert not plain["out"].requires_grad


# ---------------------------------------------------------------- the examples


@pytest.mark.parametrize("mode", _modes())
def test_pallas_softmax_example_matches_pytorch(mode):
    example = _example("pallas_softmax")
    torch.manual_seed(0)
    x, w = torch.randn(2, 20, 7), torch.randn(2, 20, 7)  # (20 rows: a partial last block of 8)
    x64 = x.double().requires_grad_()
    reference = torch.softmax(x64, -1)
    (reference * w.double()).sum().backward()
    cpu_x = x.clone().requires_grad_()
    cpu = torch.softmax(cpu_x, -1)
    (cpu * w).sum().backward()
    xj = x.to("jax").requires_grad_()
    fn = _maybe_compile(lambda a, b: (torch.ops.examples.softmax(a, -1) * b).sum(), mode)
    fn(xj, w.to("jax")).backward()
    y = torch.ops.examples.softmax(xj.detach(), -1)
    # NOTE [Compiled graphs against float64] (tests/test_compile): float32 results held to
    # the CPU's own distance from float64
    for got, ours, exact in ((y, cpu, reference), (xj.grad, cpu_x.grad, x64.grad)):
        distance = (got.cpu().double() - exact).abs().max().item()
        assert distance <= 4 * (ours.detach().double() - exact).abs().max().item() + 1e-7
    report = torch_jax.check_override(aten._softmax.default, example.softmax_lowering, x.to("jax"), 1, False)
    assert max(report.values()) < 1e-6


def test_jax_adamw_example_trains_as_torch_adamw_and_compiles_once():
    example = _example("jax_adamw")
    ours, params = example.train("jax", 8, jax_optimizer=True)
    theirs, cpu_params = example.train("cpu", 8, jax_optimizer=False)
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(theirs), rtol=1e-5, atol=1e-6)
    for p, c in zip(params, cpu_params):
        torch.testing.assert_close(p, c, rtol=1e-5, atol=1e-6)
    model = torch.nn.Linear(4, 2).to("jax")
    opt = example.JaxAdamW(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no fallback, no recompile warning)
        compiles = []
        for lr in (0.1, 0.05, 0.02, 0.01):
            opt.param_groups[0]["lr"] = lr
            model(torch.ones(3, 4, device="jax")).sum().backward()
            opt.step()
            torch_jax.mark_step()
            compiles.append(torch_jax.stats()["compiles"])
    assert compiles[1] == compiles[-1], compiles


def test_a_compiled_training_step_runs_the_jax_optimizer_in_its_graph():
    example = _example("jax_adamw")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).to("jax")
    reference = torch.nn.Linear(4, 2)
    reference.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    opt = example.JaxAdamW(model.parameters(), lr=0.1)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=0.1, foreach=False)
    x = torch.randn(3, 4)

    @torch.compile(backend="jax")
    def optimizer_step():
        opt.step()

    with config_as(fallback="error"):
        for _ in range(3):
            model(x.to("jax")).pow(2).sum().backward()
            optimizer_step()
            opt.zero_grad()
            reference(x).pow(2).sum().backward()
            ref_opt.step()
            ref_opt.zero_grad()
    for p, r in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.detach().cpu(), r.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", _modes())
def test_an_array_held_by_jax_code_is_never_donated(mode):
    """In-place updates in fused graphs and compiled graphs donate the old buffer when
    nothing else holds it (NOTE [Donation]); an array from to_jax keeps its values."""
    t = torch.ones(1024, device="jax")
    held = torch_jax.to_jax(t)
    update = _maybe_compile(lambda x: x.mul_(2), mode)
    for _ in range(3):
        update(t)
        torch_jax.mark_step()
    assert not held.is_deleted() and float(held.sum()) == 1024.0
    assert t.cpu().sum().item() == 8 * 1024
