"""Bad input gets PyTorch's error (the same type and message as on CPU), never a crash,
a hang or a silently wrong value."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
import torch.nn.functional as F


def _error(fn, device):
    try:
        fn(device)
        if device == "jax":  # fused eager raises value errors at the next wait (strict: at the op)
            torch.jax.synchronize()
    except Exception as e:  # noqa: BLE001
        if device == "jax":  # device-specific names in messages
            return type(e), str(e).replace("jax:0", "DEV")
        return type(e), str(e).replace("cpu", "DEV")
    return None, None


SAME_AS_CPU = {
    "select_out_of_range": lambda d: torch.zeros(4, device=d)[10],
    "index_tensor_out_of_range": lambda d: torch.zeros(4, device=d)[torch.tensor([1, 10]).to(d)],
    "index_tensor_negative_out_of_range": lambda d: torch.zeros(4, device=d)[torch.tensor([-5]).to(d)],
    "setitem_out_of_range": lambda d: torch.zeros(4, device=d).__setitem__(torch.tensor([7]).to(d), 1.0),
    "embedding_out_of_range": lambda d: F.embedding(torch.tensor([0, 9]).to(d), torch.zeros(5, 3, device=d)),
    "index_select_out_of_range": lambda d: torch.zeros(4, 2, device=d).index_select(0, torch.tensor([4]).to(d)),
    "nll_loss_target_out_of_range": lambda d: F.nll_loss(torch.zeros(2, 3, device=d), torch.tensor([0, 3]).to(d)),
    "broadcast_mismatch": lambda d: torch.zeros(3, device=d) + torch.zeros(4, device=d),
    "inplace_broadcast_mismatch": lambda d: torch.zeros(3, device=d).add_(torch.zeros(2, 3, device=d)),
    "mm_shapes": lambda d: torch.zeros(2, 3, device=d) @ torch.zeros(4, 5, device=d),
    "bmm_batch": lambda d: torch.bmm(torch.zeros(2, 3, 4, device=d), torch.zeros(3, 4, 5, device=d)),
    "view_incompatible": lambda d: torch.zeros(4, 6, device=d).t().view(24),
    "view_wrong_numel": lambda d: torch.zeros(4, 6, device=d).view(5, 5),
    "cat_shapes": lambda d: torch.cat([torch.zeros(2, 3, device=d), torch.zeros(2, 4, device=d)]),
    "int_inplace_float_result": lambda d: torch.zeros(3, dtype=torch.int64, device=d).add_(1.5),
    "int_inplace_true_divide": lambda d: torch.ones(3, dtype=torch.int64, device=d).div_(2),
    "expand_wrong": lambda d: torch.zeros(3, device=d).expand(2, 4),
    "write_to_expanded": lambda d: torch.zeros(3, device=d).expand(2, 3).add_(1),
    "negative_size": lambda d: torch.empty(-1, device=d),
    "linear_shapes": lambda d: F.linear(torch.zeros(2, 3, device=d), torch.zeros(4, 5, device=d)),
    "conv_channels": lambda d: F.conv2d(torch.zeros(1, 3, 5, 5, device=d), torch.zeros(2, 4, 3, 3, device=d)),
    "softmax_dim": lambda d: torch.softmax(torch.zeros(2, 3, device=d), dim=5),
    "sum_dim": lambda d: torch.zeros(2, 3, device=d).sum(4),
    "as_strided_out_of_storage": lambda d: torch.zeros(4, device=d).as_strided((10,), (1,)),
    "item_of_many": lambda d: torch.zeros(3, device=d).item(),
    "bool_of_many": lambda d: bool(torch.zeros(3, device=d)),
    "gather_out_of_range": lambda d: torch.zeros(2, 3, device=d).gather(1, torch.tensor([[0], [3]]).to(d)),
    "mask_shape": lambda d: torch.zeros(4, 2, device=d)[torch.tensor([True, False]).to(d)],
    "clamp_no_bounds": lambda d: torch.clamp(torch.zeros(3, device=d)),
    "fill_with_a_1d_value": lambda d: torch.ones(3, device=d).fill_(torch.tensor([1.0]).to(d)),
    "int_division_by_zero": lambda d: torch.remainder(torch.tensor([3, 4]).to(d), 0),
    "native_dropout_p_above_1": lambda d: torch.native_dropout(torch.ones(3, device=d), 1.5, True),
    "native_dropout_p_below_0": lambda d: torch.native_dropout(torch.ones(3, device=d), -0.5, None),
    "alpha_float_for_int": lambda d: torch.add(
        torch.ones(2, dtype=torch.int64, device=d), torch.ones(2, dtype=torch.int64, device=d), alpha=0.5
    ),
}


@pytest.mark.parametrize("name", sorted(SAME_AS_CPU))
def test_error_matches_cpu(name):
    cpu_type, cpu_msg = _error(SAME_AS_CPU[name], "cpu")
    jax_type, jax_msg = _error(SAME_AS_CPU[name], "jax")
    assert cpu_type is not None, "the CPU oracle raises"
    assert jax_type is cpu_type, f"{jax_type} != {cpu_type}: {jax_msg}"
    assert jax_msg == cpu_msg or _same_gist(jax_msg, cpu_msg), f"\njax: {jax_msg}\ncpu: {cpu_msg}"


def test_integer_division_by_zero_of_no_elements_is_no_error():
    # (the CPU checks the divisors it divides by: none, for an empty result)
    for op in (torch.remainder, torch.fmod, lambda a, b: torch.div(a, b, rounding_mode="floor")):
        got = op(torch.tensor([], dtype=torch.int64, device="jax"), 0)
        torch.jax.synchronize()  # (fused eager: a value error would surface here)
        assert got.shape == (0,) and got.dtype == torch.int64


def _same_gist(a: str, b: str) -> bool:
    """Messages equal up to the CPU's reference to its own kernel names."""
    strip = lambda s: re.sub(r"\s+", " ", s.split("\n")[0]).strip()  # noqa: E731
    return strip(a) == strip(b)


def test_device_mismatch_names_both_devices():
    with pytest.raises(RuntimeError, match=r"found at least two devices, jax:0 and cpu!"):
        torch.zeros(3, device="jax") * torch.zeros(3)


@pytest.mark.two_devices
def test_mismatch_of_two_jax_devices_names_both():
    with pytest.raises(RuntimeError, match=r"found at least two devices, jax:1 and jax:0!"):
        torch.zeros(3, device="jax:1").copy_(torch.zeros(3, device="jax:1")).add_(torch.zeros(3, device="jax:0"))


def test_unsupported_dtype_names_the_dtype():
    with pytest.raises(TypeError, match=r"dtype torch.complex32 is not supported on the jax device"):
        torch.zeros(2, dtype=torch.complex32, device="jax")


def test_freed_storage_is_a_clear_error():
    from torch_jax.tensor import _storage

    x = torch.ones(3, device="jax")
    _storage.array(_storage.box_of(x)).delete()  # e.g. a buffer donated to another computation
    with pytest.raises(RuntimeError, match=r"aten.mul.Tensor read a tensor whose device buffer was freed"):
        x * 2


def test_resizing_a_storage_is_a_clear_error():
    x = torch.ones(3, device="jax")
    with pytest.raises(NotImplementedError, match="resizePrivateUse1Bytes"):
        x.untyped_storage().resize_(0)
    assert (x + 1).tolist() == [2.0, 2.0, 2.0]


def test_resize_then_use_old_and_new_views():
    x = torch.arange(4.0, device="jax")
    v = x[1:3]
    x.resize_(8)  # grows onto a new storage
    x[4:].fill_(0)
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0, 0.0, 0.0, 0.0, 0.0]
    assert v.tolist() == [1.0, 2.0]
    x.resize_(2)  # shrinking keeps the storage
    assert x.tolist() == [0.0, 1.0] and x.untyped_storage().nbytes() == 32


def test_errors_inside_debug_launch_blocking_mode():
    import torch_jax

    torch_jax.config.launch_blocking = True
    try:
        with pytest.raises(IndexError, match="index 9 is out of bounds for dimension 0 with size 4"):
            torch.zeros(4, device="jax")[torch.tensor([9]).to("jax")]
        assert (torch.ones(2, device="jax") * 3).tolist() == [3.0, 3.0]
    finally:
        torch_jax.config.launch_blocking = False


def test_deferred_checks_surface_at_the_next_wait_not_at_the_op(monkeypatch):
    # NOTE [Deferred value checks]: strict ops under config.deferred_checks (vLLM's worker)
    import torch_jax
    from torch_jax.runtime import _fused

    monkeypatch.setattr(torch_jax.config, "mode", "strict")
    monkeypatch.setattr(torch_jax.config, "deferred_checks", True)
    x = torch.arange(4.0, device="jax")
    torch.jax.synchronize()  # (the checks an earlier test's graphs left)
    bad = x[torch.tensor([9]).to("jax")]  # (returns: its check waits with the computation)
    assert bad.shape == (1,) and len(_fused._deferred) == 1
    event = torch.Event(device="jax")
    event.record()  # (an event's record waits for nothing, checks included)
    assert len(_fused._deferred) == 1
    with pytest.raises(IndexError, match="index 9 is out of bounds for dimension 0 with size 4"):
        (x + 1).cpu()  # the next wait: a copy to the host
    assert _fused._deferred == [] and (x * 2).tolist() == [0.0, 2.0, 4.0, 6.0]  # (raised once)
    x[torch.tensor([-7]).to("jax")]
    with pytest.raises(IndexError, match="index -7 is out of bounds for dimension 0 with size 4"):
        torch.jax.synchronize()
    monkeypatch.setattr(torch_jax.config, "deferred_checks", False)
    with pytest.raises(IndexError, match="index 5 is out of bounds"):  # (the default: at the op)
        x[torch.tensor([5]).to("jax")]


# NOTE [Factories' out= tensors] in runtime/_install: how each factory resizes a wrong-sized
# out= tensor, and what it warns
FACTORY_OUTS = {
    "arange": lambda t: torch.arange(5, out=t),
    "arange_start": lambda t: torch.arange(1, 6, out=t),
    "arange_step": lambda t: torch.arange(1, 6, 1, out=t),
    "arange_same_numel": lambda t: torch.arange(6, out=t),
    "linspace": lambda t: torch.linspace(0, 1, 5, out=t),
    "linspace_same_numel": lambda t: torch.linspace(0, 1, 6, out=t),
    "logspace": lambda t: torch.logspace(0, 1, 5, out=t),
    "eye": lambda t: torch.eye(5, out=t),
    "eye_m": lambda t: torch.eye(2, 3, out=t),
    "full": lambda t: torch.full((3, 2), 2.0, out=t),
    "range": lambda t: torch.range(0, 4, out=t),
    "range_step": lambda t: torch.range(0, 5, 1, out=t),
    "add": lambda t: torch.add(torch.ones(5, device=t.device), 1, out=t),  # (not a factory)
}


@pytest.mark.parametrize("shape", [(3,), (0,), (2, 3)])
@pytest.mark.parametrize("name", sorted(FACTORY_OUTS))
def test_factory_out_resizes_as_on_cpu(name, shape):
    seen = []
    for device in ("cpu", "jax"):
        out = torch.empty(shape, device=device)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            FACTORY_OUTS[name](out)
        messages = [str(w.message).split(" (Triggered internally")[0] for w in caught]
        seen.append((tuple(out.shape), messages, out.cpu().tolist()))
    assert seen[1] == seen[0]


def test_randperm_out_resizes_silently():
    for device in ("cpu", "jax"):
        out = torch.empty(3, dtype=torch.int64, device=device)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            torch.randperm(5, out=out)
        assert out.shape == (5,) and sorted(out.cpu().tolist()) == list(range(5))


def test_a_failing_lowering_of_an_op_for_privateuse1_only_is_reported_as_ours(monkeypatch):
    """An op that exists for PrivateUse1 backends only has no CPU kernel to replay: when
    its lowering fails, the error says torch_jax failed (with JAX's reason), not the
    CPU's "not implemented" (which hid a wrong mask-gradient shape in attention)."""
    import dataclasses

    from torch_jax.runtime import _executor

    q = torch.randn(1, 2, 3, 4, device="jax", requires_grad=True)  # (the device installs its ops)
    spec = _executor.SPECS[torch.ops.aten._scaled_dot_product_fused_attention_overrideable_backward.default]

    def broken(*args, **kwargs):
        raise ValueError("broken on purpose")

    monkeypatch.setattr(spec, "lowering", dataclasses.replace(spec.lowering, fn=broken))
    monkeypatch.setattr(spec, "cache", {})
    with pytest.raises(RuntimeError, match="torch_jax bug"):
        F.scaled_dot_product_attention(q, q, q).sum().backward()


# NOTE [Asserts are value checks] in ops/_asserts: torch._assert_async and the aten ops
# under it raise the CPU's error (strict eager at the op, fused eager and compiled graphs
# at the next wait) and never take the CPU fallback (an error in these tests).
aten = torch.ops.aten
ASSERTS = {
    "zero": lambda d: aten._assert_async(torch.tensor(0, device=d)),
    "one": lambda d: aten._assert_async(torch.tensor(1, device=d)),
    "false_with_message": lambda d: torch._assert_async(torch.tensor(False, device=d), "not {positive}"),
    "true_with_message": lambda d: torch._assert_async(torch.tensor(True, device=d), "unused"),
    "empty_message": lambda d: aten._assert_async.msg(torch.tensor(0.0, device=d), ""),
    "nan_is_nonzero": lambda d: aten._assert_async.msg(torch.tensor(float("nan"), device=d), "nan"),
    "complex_imaginary_part": lambda d: aten._assert_async.msg(torch.tensor(1j, device=d), "imag"),
    "complex_zero": lambda d: aten._assert_async.msg(torch.tensor(0j, device=d), "zero"),
    "one_element_2d": lambda d: aten._assert_async.msg(torch.tensor([[0]], device=d), "2d"),
    "element_of_a_view": lambda d: torch._assert_async(torch.tensor([1, 0, 2], device=d)[1], "view"),
    "computed": lambda d: torch._assert_async((torch.arange(3, device=d) < 2).all(), "all below 2"),
    "several_elements": lambda d: torch._assert_async(torch.tensor([1, 2], device=d), "many"),
    "no_elements": lambda d: aten._assert_async(torch.tensor([], device=d)),
    "functional_passes": lambda d: aten._functional_assert_async.msg(
        torch.tensor(2, device=d), "f", torch.ones(2, device=d)
    ).add(1),
    "functional_fails": lambda d: aten._functional_assert_async.msg(
        torch.tensor(0, device=d), "functional", torch.ones(2, device=d)
    ),
}


def _outcome(fn, device):
    try:
        out = fn(device)
        if device == "jax":
            torch.jax.synchronize()
    except RuntimeError as e:
        return "raised", str(e)
    return "returned", None if out is None else out.cpu().tolist()


@pytest.mark.parametrize("name", sorted(ASSERTS))
def test_assert_async_matches_cpu(name, mode):
    assert _outcome(ASSERTS[name], "jax") == _outcome(ASSERTS[name], "cpu")


def test_a_failing_assert_async_raises_at_the_op_in_strict_mode_and_at_the_next_wait_in_fused(mode):
    import torch_jax

    x = torch.arange(4.0, device="jax")
    graphs = torch_jax.stats().get("graphs_run", 0)
    if mode == "strict":
        with pytest.raises(RuntimeError, match="^values below 3$"):
            torch._assert_async((x < 3).all(), "values below 3")
        return
    y = x * 2
    torch._assert_async((x < 3).all(), "values below 3")  # (recorded: no wait, no graph run)
    z = y + 1
    assert torch_jax.stats().get("graphs_run", 0) == graphs
    with pytest.raises(RuntimeError, match="^values below 3$"):
        torch.jax.synchronize()
    assert torch_jax.stats()["graphs_run"] == graphs + 1  # (the assert ran inside the step's graph)
    assert z.tolist() == [1.0, 3.0, 5.0, 7.0]  # (raised once; the results are there)


def test_assert_async_in_a_compiled_function_runs_in_the_graph():
    import torch_jax

    def f(x):
        y = x * 2
        torch._assert_async((y > 0).all(), "all positive")
        return y + 1

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="jax")
    x = torch.tensor([1.0, 2.0])
    eager_graphs = torch_jax.stats().get("compiled_graphs_eager", 0)
    assert compiled(x.to("jax")).tolist() == f(x).tolist()
    with pytest.raises(RuntimeError, match="^all positive$") as cpu_error:
        f(-x)
    bad = compiled(-x.to("jax"))  # (as on CUDA, the graph's check surfaces at the next wait)
    with pytest.raises(RuntimeError) as jax_error:
        torch.jax.synchronize()
    assert str(jax_error.value) == str(cpu_error.value)
    assert bad.shape == (2,)
    assert torch_jax.stats().get("compiled_graphs_eager", 0) == eager_graphs  # (one XLA computation, not op by op)
    torch._dynamo.reset()


def test_checks_on_dynamic_sizes_keep_a_compiled_graph_whole():
    # torch._check on a size leaves aten._assert_scalar in the graph (dynamic shapes)
    import torch_jax

    def f(x):
        torch._check(x.shape[0] % 2 == 0, lambda: "an even length")
        return x.view(2, -1) * 2

    outcomes = []
    for backend, device in (("aot_eager", "cpu"), ("jax", "jax")):
        torch._dynamo.reset()
        compiled = torch.compile(f, backend=backend, dynamic=True)
        eager_graphs = torch_jax.stats().get("compiled_graphs_eager", 0)
        got = [compiled(torch.arange(float(n), device=device)).cpu().tolist() for n in (4, 6)]
        assert torch_jax.stats().get("compiled_graphs_eager", 0) == eager_graphs
        try:
            compiled(torch.arange(5.0, device=device))
            raised = None
        except Exception as e:  # noqa: BLE001 (Dynamo's own error type, whatever the backend)
            raised = (type(e).__name__, "an even length" in str(e))
        outcomes.append((got, raised))
    torch._dynamo.reset()
    assert outcomes[1] == outcomes[0]
    assert outcomes[0][1] is not None


def test_a_failing_check_on_sizes_in_a_compiled_graph_raises_the_cpus_error():
    # (Dynamo guards on such a check, so a failing call compiles anew and fails before any
    # backend sees it, as above; a graph made by make_fx reaches the rule itself)
    from torch.fx.experimental.proxy_tensor import make_fx

    from torch_jax.compile._graph import Program

    def f(x):
        aten._assert_scalar.default(x.shape[0] % 2 == 0, "an even length")
        return (x * 2,)

    graph = make_fx(f, tracing_mode="symbolic")(torch.ones(4, device="jax"))
    program = Program(graph, None, "checks")
    assert program.eager is None  # (one XLA computation)
    assert program([torch.arange(4.0, device="jax")])[0].tolist() == [0.0, 2.0, 4.0, 6.0]
    with pytest.raises(RuntimeError) as cpu_error:
        graph(torch.ones(5))
    with pytest.raises(RuntimeError) as jax_error:
        program([torch.ones(5, device="jax")])
    assert str(jax_error.value) == str(cpu_error.value) == "an even length"
