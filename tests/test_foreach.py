"""The foreach ops (NOTE [Foreach ops]): PyTorch's foreach OpInfo samples give the CPU's
results, one computation over the whole list where that is exact, the per-tensor loop
(and its errors) where it is not."""

from __future__ import annotations

import pytest
import torch
from torch.testing._internal.common_methods_invocations import (
    foreach_binary_op_db,
    foreach_other_op_db,
    foreach_pointwise_op_db,
    foreach_reduce_op_db,
    foreach_unary_op_db,
)

import torch_jax
from conftest import assert_same, to_cpu
from torch_jax.ops._foreach import PER_TENSOR
from torch_jax.runtime import _stats

_LOWERED = {op.name().split("::")[1].split(".")[0].rstrip("_") for op in PER_TENSOR}
OPINFOS = [
    o
    for db in (
        foreach_unary_op_db,
        foreach_binary_op_db,
        foreach_pointwise_op_db,
        foreach_reduce_op_db,
        foreach_other_op_db,
    )
    for o in db
    if o.name in _LOWERED
]


def _to(x, device):
    if isinstance(x, torch.Tensor):
        return x.detach().clone().to(device)
    if isinstance(x, (list, tuple)):
        return type(x)(_to(y, device) for y in x)
    return x


def _run(fn, sample, device):
    inputs, args = _to(sample.input, device), _to(sample.args, device)
    try:
        result = fn(inputs, *args, **sample.kwargs)
    except Exception as e:  # noqa: BLE001 (the error is compared)
        return e, inputs
    return result, inputs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=str)
@pytest.mark.parametrize("info", OPINFOS, ids=lambda o: o.name)
def test_foreach_matches_cpu(info, dtype):
    if dtype not in info.supported_dtypes("cpu"):
        pytest.skip(f"{info.name} does not support {dtype} on the CPU")
    for sample in info.sample_inputs("cpu", dtype, num_input_tensors=[3]):
        for fn in (info.op, info.inplace_variant):
            if fn is None:
                continue
            expected, expected_inputs = _run(fn, sample, "cpu")
            got, got_inputs = _run(fn, sample, "jax")
            if isinstance(expected, Exception):
                assert type(got) is type(expected) and str(got) == str(expected), (got, expected)
                continue
            if isinstance(got, Exception):
                raise got
            if expected is not None:
                assert_same(list(got), to_cpu(list(expected)), check_stride=False)
            assert_same(got_inputs, expected_inputs, check_stride=False)


def _ones(*shapes, dtype=torch.float32):
    return [torch.ones(s, dtype=dtype, device="jax") for s in shapes]


def test_an_optimizer_update_is_one_op():
    """``_foreach_add_`` over ten parameters runs one computation, not ten."""
    params, grads = _ones(*[(4, 3)] * 10), _ones(*[(4, 3)] * 10)
    before = _stats.counters["ops"]
    torch._foreach_add_(params, grads, alpha=-0.1)
    assert _stats.counters["ops"] - before == 1
    assert_same(params, [torch.full((4, 3), 0.9)] * 10)


def test_a_changing_scalar_list_does_not_recompile():
    """Adam's per-parameter step sizes change every step: run-time inputs."""
    params, avgs, denoms = _ones(3, 4), _ones(3, 4), _ones(3, 4)
    torch.jax.synchronize()  # (fused eager: the fills' graph apart from the steps')
    torch._foreach_addcdiv_(params, avgs, denoms, [-0.1, -0.2])
    torch.jax.synchronize()
    before = _stats.counters["compiles"] + _stats.counters["graphs_compiled"]
    for step in range(2, 5):
        torch._foreach_addcdiv_(params, avgs, denoms, [-0.1 / step, -0.2 / step])
        torch.jax.synchronize()
    assert _stats.counters["compiles"] + _stats.counters["graphs_compiled"] == before
    torch.testing.assert_close(params[0].cpu(), torch.full((3,), 1 - 0.1 * (1 + 1 / 2 + 1 / 3 + 1 / 4)))


def _aliased_lists(device):
    a = [torch.ones(2, device=device), torch.full((2,), 2.0, device=device)]
    torch._foreach_add_(a, [a[1], a[0]])  # the loop reads a[0] after writing it
    return a


def _one_tensor_twice(device):
    t = torch.zeros(2, device=device)
    torch._foreach_add_([t, t], [torch.ones(2, device=device)] * 2)
    return [t]


def _views_of_one_storage(device):
    base = torch.arange(4.0, device=device)
    torch._foreach_mul_([base[:2], base[1:]], 2.0)  # overlapping views
    return [base]


def _mixed_dtypes(device):
    a = [torch.ones(2, device=device)]
    torch._foreach_add_(a, [torch.ones(2, dtype=torch.float64, device=device)])
    return a


def _broadcast_other(device):
    a = [torch.ones(2, 3, device=device)]
    torch._foreach_add_(a, [torch.ones(3, device=device)])
    return a


def _cpu_scalar_tensor(device):
    a = [torch.ones(2, device=device)]
    torch._foreach_mul_(a, torch.tensor(3.0))
    return a


def _length_mismatch(device):
    torch._foreach_add_([torch.ones(2, device=device)], [torch.ones(2, device=device)] * 2)


def _scalar_list_mismatch(device):
    torch._foreach_div_([torch.ones(2, device=device)], [1.0, 2.0])


def _empty(device):
    torch._foreach_add_([], [])


def _float_into_long(device):
    torch._foreach_add_([torch.ones(2, dtype=torch.long, device=device)], 0.5)


def _complex_into_float(device):
    torch._foreach_mul_([torch.ones(2, device=device)], 1j)


def _broadcast_self(device):
    torch._foreach_add_([torch.ones(3, device=device)], [torch.ones(2, 3, device=device)])


@pytest.mark.parametrize(
    "case",
    [
        _aliased_lists,
        _one_tensor_twice,
        _views_of_one_storage,
        _mixed_dtypes,
        _broadcast_other,
        _cpu_scalar_tensor,
        _length_mismatch,
        _scalar_list_mismatch,
        _empty,
        _float_into_long,
        _complex_into_float,
        _broadcast_self,
    ],
    ids=lambda f: f.__name__.strip("_"),
)
def test_the_loop_where_one_computation_would_differ(case):
    """Aliasing, mixed dtypes, broadcasting and bad arguments: the per-tensor loop's
    results and PyTorch's errors, as on the CPU."""
    try:
        expected = case("cpu")
    except RuntimeError as e:
        with pytest.raises(RuntimeError) as got:
            case("jax")
        assert str(got.value) == str(e)
        return
    assert_same(case("jax"), expected, check_stride=False)


def test_fused_mode_records_one_node_per_foreach_op():
    params, grads = _ones(*[(5,)] * 6), _ones(*[(5,)] * 6)
    with torch_jax.fused():
        torch.jax.synchronize()
        before = _stats.counters["fused_ops"]
        torch._foreach_mul_(params, 0.5)
        torch._foreach_add_(params, grads, alpha=2.0)
        assert _stats.counters["fused_ops"] - before == 2
    assert_same(params, [torch.full((5,), 2.5)] * 6)
