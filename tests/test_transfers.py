"""Host <-> device transfers, factories on the device, every supported dtype."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torch_jax
from conftest import assert_same

DTYPES = [
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.complex128,
]


def sample(dtype, shape=(3, 5)):
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_complex:
        return torch.complex(torch.randn(shape, generator=g), torch.randn(shape, generator=g)).to(dtype)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 10).to(dtype)
    return torch.randint(-100 if dtype != torch.uint8 else 0, 100, shape, generator=g).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_roundtrip_every_dtype(dtype):
    c = sample(dtype)
    j = c.to("jax")
    assert j.device == torch.device("jax:0") and j.dtype == dtype
    assert torch.equal(j.cpu(), c)
    assert j.tolist() == c.tolist()
    assert j[1, 2].item() == c[1, 2].item()
    assert j.untyped_storage().nbytes() == c.untyped_storage().nbytes()


@pytest.mark.filterwarnings("ignore:Casting complex values to real discards the imaginary part")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_ops_in_every_dtype(dtype):
    c = sample(dtype)
    j = c.to("jax")
    assert_same(j.t().contiguous(), c.t().contiguous())
    assert_same(j[::2] == j[::2], c[::2] == c[::2])
    if dtype != torch.bool:
        assert_same(j + j, c + c)
        assert_same(j * 2, c * 2)
    assert_same(torch.cat([j, j], 1), torch.cat([c, c], 1))
    assert_same(j.to(torch.float64), c.to(torch.float64))
    assert_same(j.to(torch.int32), c.to(torch.int32))


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_unsupported_dtype_is_a_clear_error():
    with pytest.raises(TypeError, match="complex32 is not supported on the jax device"):
        torch.empty(3, dtype=torch.complex32, device="jax")
    with pytest.raises(TypeError, match="not supported on the jax device"):
        torch.zeros(3, dtype=torch.complex32).to("jax")


def test_to_with_dtype_and_copy_between_dtypes():
    c = torch.randn(4, 3)
    assert_same(c.to("jax", torch.float16), c.to(torch.float16))
    assert_same(c.to("jax", torch.int64), c.to(torch.int64))
    j = torch.zeros(4, 3, dtype=torch.float64, device="jax")
    j.copy_(c)  # host -> device with a cast
    assert_same(j, c.double())
    out = torch.zeros(4, 3, dtype=torch.bfloat16)
    out.copy_(j)  # device -> host with a cast
    assert torch.equal(out, c.double().bfloat16())


def test_transfer_of_noncontiguous_keeps_layout_like_cuda():
    c = torch.randn(4, 6).t()
    j = c.to("jax")
    assert j.stride() == c.stride()
    assert_same(j, c)
    back = j.cpu()
    assert back.stride() == c.stride() and torch.equal(back, c)
    sliced = torch.randn(8, 8)[::2, 1::3]
    assert_same(sliced.to("jax"), sliced.contiguous(), check_stride=False)


def test_host_to_device_copies_once_and_does_not_alias():
    c = torch.randn(1000)
    c0 = c.clone()
    torch_jax.reset_stats()
    j = c.to("jax")
    assert torch_jax.stats()["host_transfers"] == 1
    assert torch_jax.stats().get("extra_host_copies", 0) == 0  # JAX took our one copy as its buffer
    c.add_(1)  # the device copy is independent of the host tensor
    assert torch.equal(j.cpu(), c0)
    torch_jax.reset_stats()
    back = j.cpu()
    assert torch_jax.stats()["host_transfers"] == 1
    back.mul_(0)  # the host copy is independent of the device tensor
    assert torch.equal(j.cpu(), c0)


def test_non_blocking_transfers():
    c = torch.randn(16, 16)
    j = c.to("jax", non_blocking=True)
    k = torch.empty(16, 16, device="jax")
    k.copy_(c, non_blocking=True)
    torch.jax.synchronize()
    assert torch.equal(j.cpu(), c) and torch.equal(k.cpu(), c)
    back = j.to("cpu", non_blocking=True)
    torch.jax.synchronize()
    assert torch.equal(back, c)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_uploads_into_part_of_a_buffer_write_that_part_alone(dtype, strict_mode):
    """NOTE [Uploads into part of a storage]: ``buffer[a:b].copy_(host, non_blocking=True)``
    into contiguous parts of 1-d and 2-d buffers writes those elements and no other, as on
    the CPU; the host tensor written after the copy leaves the device's values as they were;
    one computation a power of two of lengths, an op and a host transfer each."""
    from torch_jax.runtime import _copy

    for shape, parts in (
        ((300,), [(0, 1), (0, 16), (5, 22), (0, 64), (250, 300), (7, 107)]),
        ((9, 5), [(0, 3), (2, 5), (8, 9)]),
    ):
        want = sample(dtype, shape)
        got = want.to("jax")
        for a, b in parts:
            host = sample(dtype, (b - a,) + shape[1:]) if len(shape) > 1 else sample(dtype, (1, b - a))[0]
            host = host.add(1) if dtype not in (torch.bool, torch.uint8) else host
            torch_jax.reset_stats()
            got[a:b].copy_(host, non_blocking=True)
            want[a:b].copy_(host)
            stats = torch_jax.stats()
            assert stats["ops"] == stats["host_transfers"] == 1, (shape, a, b)
            host.zero_()  # (after the copy returned: the device keeps what it was given)
            assert_same(got, want)
    torch_jax.reset_stats()
    buffer = torch.zeros(4096, dtype=dtype, device="jax")
    for n in range(1, 65):  # (lengths 1..64: the widths 16, 32 and 64)
        buffer[:n].copy_(sample(dtype, (1, n))[0])
    assert torch_jax.stats()["compiles"] <= 4  # (the zeros, the three widths)
    assert any(key[2] == 64 for key in _copy._parts)


def test_uploads_into_part_of_a_buffer_elsewhere_go_the_general_way(strict_mode):
    """Not a contiguous part of a written storage of the same dtype: a column, another dtype,
    a storage never written, one inside fused eager's graph: values as on the CPU."""
    want = torch.arange(40.0).reshape(8, 5)
    got = want.to("jax")
    host = torch.tensor([-1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0, -8.0])
    got[:, 1].copy_(host)
    want[:, 1].copy_(host)
    got[2:4].copy_(torch.ones(2, 5, dtype=torch.int64))
    want[2:4].copy_(torch.ones(2, 5, dtype=torch.int64))
    assert_same(got, want)
    fresh = torch.empty(10, device="jax")
    fresh[:3].copy_(torch.tensor([1.0, 2.0, 3.0]))
    assert torch.equal(fresh.cpu()[:3], torch.tensor([1.0, 2.0, 3.0]))
    with torch_jax.fused():
        got[5:7].copy_(torch.full((2, 5), 9.0))
        want[5:7].copy_(torch.full((2, 5), 9.0))
        assert_same(got, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_copies_to_the_host_without_blocking_wait_for_an_event(dtype):
    # NOTE [Copies to the host without blocking]: queued on the device, written by the
    # synchronize of an event recorded after them
    from torch_jax.device import _state

    c = sample(dtype, (4, 6))
    j = c.to("jax")
    back = j.t().to("cpu", non_blocking=True)
    assert back.stride() == (1, 6) and back.shape == (6, 4)  # (the transposed layout kept, as on CUDA)
    assert any(copy.dst is back for copy in _state.host_copies[0])
    event = torch.Event(device="jax")
    event.record()
    event.synchronize()
    assert torch.equal(back, c.t()) and 0 not in _state.host_copies


def test_copy_into_a_host_tensor_without_blocking_converts_and_broadcasts():
    j = torch.arange(6.0, device="jax").reshape(2, 3)
    out = torch.full((4, 2, 3), -1, dtype=torch.int64)
    assert out.copy_(j * 2, non_blocking=True) is out
    as_half = (j + 0.5).to("cpu", torch.float16, non_blocking=True, memory_format=torch.contiguous_format)
    torch.jax.synchronize()
    assert torch.equal(out, (torch.arange(6.0).reshape(2, 3) * 2).long().expand(4, 2, 3))
    assert as_half.dtype == torch.float16 and torch.equal(as_half, (torch.arange(6.0).reshape(2, 3) + 0.5).half())


def test_a_copy_to_the_host_without_blocking_raises_and_counts_versions_at_the_call():
    j = torch.arange(3.0, device="jax")
    with pytest.raises(RuntimeError, match="must match the size"):  # (PyTorch's error, at the call)
        torch.empty(4).copy_(j, non_blocking=True)
    p = torch.zeros(3, requires_grad=True)
    with torch.no_grad():
        p.copy_(j + 1, non_blocking=True)
    version = p._version
    while not torch.jax.current_stream().query():  # (a stream's query, once true, has written it)
        pass
    assert torch.equal(p.detach(), torch.arange(3.0) + 1) and p._version == version  # (written once, as one write)


def test_a_blocking_transfer_finds_the_earlier_copies_written():
    c = torch.randn(5)
    j = c.to("jax")
    with torch.inference_mode():  # (written after the inference mode it was made in: vLLM's case)
        early = (j * 3).to("cpu", non_blocking=True)
    total = j.sum().item()  # a stream's later copy to the host: the earlier ones are done
    assert torch.equal(early, c * 3) and total == pytest.approx(c.sum().item(), rel=1e-6)
    stream = torch.jax.current_stream()
    late = (j - 1).to("cpu", non_blocking=True)
    event = stream.record_event()
    while not event.query():  # (query, once true, has written what the event follows)
        pass
    assert torch.equal(late, c - 1)


def test_copies_to_the_host_are_written_once_from_any_thread():
    # (vLLM's output thread waits on the step's event while the engine queues the next step's copies)
    import threading

    j = torch.randn(64, 64, device="jax")
    outs, events = [], []
    for k in range(20):
        outs.append((j @ j + k).to("cpu", non_blocking=True))
        events.append(torch.Event(device="jax"))
        events[-1].record()
    waiters = [threading.Thread(target=e.synchronize) for e in events[::2]]
    for w in waiters:
        w.start()
    for e in events[1::2]:
        e.synchronize()
    for w in waiters:
        w.join()
    want = j.cpu().double() @ j.cpu().double()
    for k, out in enumerate(outs):
        torch.testing.assert_close(out.double(), want + k, rtol=1e-4, atol=1e-3)


def test_numpy_raises_the_cuda_error():
    j = torch.ones(3, device="jax")
    with pytest.raises(TypeError, match=r"can't convert jax:0 device type tensor to numpy\. Use Tensor\.cpu\(\)"):
        j.numpy()
    assert np.array_equal(j.cpu().numpy(), np.ones(3, np.float32))


def test_copy_across_devices():
    a = torch.arange(6.0, device="jax:0")
    b = torch.zeros(6, device="jax:1")
    b.copy_(a)
    assert b.device == torch.device("jax:1")
    assert torch.equal(b.cpu(), torch.arange(6.0))
    c = a.to("jax:1")
    assert c.device == torch.device("jax:1") and torch.equal(c.cpu(), a.cpu())
    assert torch.equal(c.to("jax:0").cpu(), a.cpu())


def test_tensor_constructor_on_device():
    j = torch.tensor([[1.5, 2.0], [3.0, 4.0]], device="jax")
    assert j.device.type == "jax" and j.dtype == torch.float32
    assert j.tolist() == [[1.5, 2.0], [3.0, 4.0]]
    assert torch.tensor(7, device="jax").item() == 7
    assert torch.tensor([True, False], device="jax").tolist() == [True, False]


FACTORIES = {
    "empty_shape": lambda d: torch.empty(3, 4, device=d).shape,
    "zeros": lambda d: torch.zeros(3, 4, device=d),
    "ones_int": lambda d: torch.ones(2, 3, dtype=torch.int32, device=d),
    "full": lambda d: torch.full((2, 2), 3.5, device=d),
    "full_bool": lambda d: torch.full((2,), True, device=d),
    "arange": lambda d: torch.arange(10, device=d),
    "arange_float_step": lambda d: torch.arange(0.5, 3.0, 0.25, device=d),
    "arange_negative_step": lambda d: torch.arange(5, -5, -3, device=d),
    "linspace": lambda d: torch.linspace(-1, 1, 7, device=d),
    "linspace_int": lambda d: torch.linspace(0, 10, 4, dtype=torch.int64, device=d),
    "eye": lambda d: torch.eye(3, device=d),
    "eye_rect": lambda d: torch.eye(2, 4, dtype=torch.int64, device=d),
    "zeros_like": lambda d: torch.zeros_like(torch.ones(2, 3).to(d)),
    "ones_like_dtype": lambda d: torch.ones_like(torch.ones(2, 3).to(d), dtype=torch.float64),
    "full_like": lambda d: torch.full_like(torch.ones(2, 3).to(d), 7),
    "empty_like_shape": lambda d: torch.empty_like(torch.ones(2, 3).to(d)).shape,
    "new_zeros": lambda d: torch.ones(2).to(d).new_zeros(3, 2),
    "new_full": lambda d: torch.ones(2).to(d).new_full((2,), 4.0),
    "scalar_tensor": lambda d: torch.scalar_tensor(3.0, device=d),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_factory(name):
    expected, got = FACTORIES[name]("cpu"), FACTORIES[name]("jax")
    if isinstance(expected, torch.Size):
        assert got == expected
    else:
        assert_same(got, expected)


RANDOM = {
    "rand": lambda: torch.rand(4000, device="jax"),
    "randn": lambda: torch.randn(4000, device="jax"),
    "randint": lambda: torch.randint(3, 10, (4000,), device="jax"),
    "randperm": lambda: torch.randperm(50, device="jax"),
    "rand_like": lambda: torch.rand_like(torch.zeros(4000, device="jax")),
    "randn_like": lambda: torch.randn_like(torch.zeros(4000, device="jax", dtype=torch.float64)),
    "randint_like": lambda: torch.randint_like(torch.zeros(4000, device="jax"), 5),
}


@pytest.mark.parametrize("name", sorted(RANDOM))
def test_random_factories(name):
    torch.manual_seed(123)
    a = RANDOM[name]()
    b = RANDOM[name]()
    torch.manual_seed(123)
    a2 = RANDOM[name]()
    assert a.device.type == "jax"
    assert torch.equal(a.cpu(), a2.cpu()), "the same seed gives the same numbers"
    assert not torch.equal(a.cpu(), b.cpu()), "consecutive calls differ"
    v = a.cpu().double()
    if name in ("rand", "rand_like"):
        assert 0 <= v.min() and v.max() < 1 and abs(v.mean() - 0.5) < 0.03
    if name in ("randn", "randn_like"):
        assert abs(v.mean()) < 0.06 and abs(v.std() - 1) < 0.05
    if name == "randint":
        assert set(v.long().tolist()) == set(range(3, 10))
    if name == "randint_like":
        assert set(v.long().tolist()) == set(range(5))
    if name == "randperm":
        assert sorted(v.long().tolist()) == list(range(50))


# ---- copies with other torch devices (NOTE [Copies with CUDA]) ----


def test_which_copies_go_through_dlpack():
    from torch_jax.runtime._copy import dlpack_route

    assert dlpack_route("cuda", "gpu") and dlpack_route("cuda", "cuda") and dlpack_route("cuda", "rocm")
    assert not dlpack_route("cuda", "cpu") and not dlpack_route("cpu", "gpu") and not dlpack_route("xpu", "gpu")
    assert not dlpack_route("meta", "cpu")


@pytest.mark.parametrize("dlpack", [True, False], ids=["dlpack", "host"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.bool, torch.int64, torch.complex64], ids=str)
def test_copies_from_and_to_another_torch_device_own_their_memory(dtype, dlpack):
    # both routes of a cuda <-> jax copy, with CPU tensors standing in for the other device
    from torch_jax.runtime._copy import from_torch_device, to_torch_device

    src = sample(dtype, (4, 6))
    expected = src.clone()
    before = torch_jax.stats().get("device_transfers", 0)
    got = from_torch_device(src.t(), 1, dlpack=dlpack)  # (a transposed view: read in its logical order)
    assert got.device == torch.device("jax:1") and got.dtype == dtype
    src.zero_()  # the jax tensor is a copy, whoever writes the source afterwards
    assert torch.equal(got.cpu(), expected.t())
    back = to_torch_device(got, torch.device("cpu"), dlpack=dlpack)
    assert back.device.type == "cpu" and torch.equal(back, expected.t())
    back.zero_()  # and the other device's tensor owns its memory too
    assert torch.equal(got.cpu(), expected.t())
    assert torch_jax.stats().get("device_transfers", 0) - before == (2 if dlpack else 0)  # (no silent detour)
    if dtype.is_complex:
        conj = from_torch_device(expected.conj(), 0, dlpack=dlpack)
        assert torch.equal(conj.cpu(), expected.conj().resolve_conj())


def test_jax_memory_is_allocated_on_demand_unless_the_user_chose():
    # NOTE [GPU memory beside PyTorch]: set before the device starts JAX, never over the user's choice
    import os
    import subprocess
    import sys

    code = "import os, torch; torch.ones(1, device='jax'); print(os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE'))"
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLA_PYTHON_CLIENT_")}
    for extra, expected in (({}, "false"), ({"XLA_PYTHON_CLIENT_PREALLOCATE": "true"}, "true"),
                            ({"XLA_PYTHON_CLIENT_MEM_FRACTION": ".4"}, "None")):  # fmt: skip
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**env, **extra})
        assert out.returncode == 0 and out.stdout.strip() == expected, out.stderr
