"""Device-agnostic PyTorch code on jax: torch.accelerator, torch.Stream/torch.Event,
pinned memory and DataLoader(pin_memory=True), torch.Generator(device="jax")."""

from __future__ import annotations

import copy
import inspect
import pickle
import warnings

import jax
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import torch_jax
from torch_jax import _compat
from torch_jax.device import _state

A = torch.accelerator


@pytest.fixture(autouse=True)
def _restore_current_device():
    yield
    torch.jax.set_device(0)


# ---- torch.accelerator ----


@pytest.mark.two_devices
def test_the_accelerator_is_jax_with_two_devices():
    assert A.current_accelerator().type == "jax"
    assert A.current_accelerator(check_available=True).type == "jax"
    assert A.is_available()
    assert A.device_count() == 2
    assert A.current_device_index() == 0


@pytest.mark.two_devices
def test_set_device_index_changes_the_current_device():
    A.set_device_index(1)
    assert A.current_device_index() == 1 == torch.jax.current_device()
    assert torch.ones(1, device="jax").device == torch.device("jax:1")
    A.set_device_index("jax:0")
    assert A.current_device_index() == 0 == torch.jax.current_device()
    torch.jax.set_device(1)
    assert A.current_device_index() == 1


@pytest.mark.two_devices
def test_device_index_context_manager_switches_and_restores():
    with A.device_index(1):
        assert A.current_device_index() == 1
        assert torch.zeros(2, device="jax").device.index == 1
        with A.device_index(0):
            assert A.current_device_index() == 0
        with A.device_index(None):
            assert A.current_device_index() == 1
        assert A.current_device_index() == 1
    assert A.current_device_index() == 0


def test_deprecated_aliases_warn_and_route():
    with pytest.warns(FutureWarning):
        A.set_device_idx(1)
    with pytest.warns(FutureWarning):
        assert A.current_device_idx() == 1


_TAKES_ARGUMENTS = {"Graph", "device_index", "set_device_index", "set_device_idx", "set_stream"}


@pytest.mark.two_devices
@pytest.mark.parametrize("name", sorted(set(A.__all__) - _TAKES_ARGUMENTS))
def test_every_accelerator_function_runs(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        fn = getattr(A, name)
        fn()
        if inspect.signature(fn).parameters:  # a device argument
            fn("jax:1")
            fn(1)


def test_memory_functions_are_torch_jax_s(monkeypatch):
    from torch_jax.device import _module

    # (XLA:CPU reports the host's free memory, which other processes change between two
    # calls: CI's strict run saw 23256936448 then 23257096192 bytes; the routing is the test)
    monkeypatch.setattr(_module, "_host_memory", lambda: (123 << 20, 456 << 20))
    x = torch.ones(1 << 16, device="jax")
    A.synchronize()
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
        assert getattr(A, name)() == getattr(torch.jax, name)() >= 0, name
        assert getattr(A.memory, name)(1) == getattr(torch.jax, name)(1), name
    assert A.memory_stats() == torch.jax.memory_stats()
    assert A.get_memory_info(0) == torch.jax.mem_get_info(0)
    before = A.memory_allocated()
    del x
    A.empty_cache()
    A.reset_peak_memory_stats()
    assert A.memory_allocated() <= before - (1 << 18)  # (tests/test_memory.py checks the figures)
    assert A.max_memory_allocated() >= A.memory_allocated()


def test_supported_dtypes():
    dtypes = A.get_device_capability("jax:0")["supported_dtypes"]
    assert {torch.float32, torch.bfloat16, torch.int64, torch.bool} <= dtypes


def test_other_devices_keep_pytorch_s_errors():
    with pytest.raises(ValueError, match="cpu doesn't match the current accelerator jax"):
        A.synchronize("cpu")
    with pytest.raises(ValueError, match="Expected a torch.device with a specified index"):
        A.set_device_index("jax")
    with pytest.raises(RuntimeError, match=r"jax:5 does not exist"):
        A.synchronize(5)


# ---- torch.Stream and torch.Event ----


def _busy(index=0):
    """Queue some work on jax:index; returns its result (a jax tensor)."""
    x = torch.randn(256, 256, device=f"jax:{index}")
    for _ in range(3):
        x = x @ x / 16
    return x


@pytest.mark.two_devices
def test_current_stream_and_streams_of_a_device_are_its_one_stream():
    s = A.current_stream()
    assert isinstance(s, torch.Stream) and s.device == torch.device("jax:0")
    assert A.current_stream(1).device_index == 1
    assert torch.Stream(device="jax:1") == A.current_stream("jax:1")
    torch.jax.set_device(1)
    assert torch.Stream().device_index == 1 == A.current_stream().device_index
    assert not s.is_capturing()


@pytest.mark.two_devices
@pytest.mark.usefixtures("strict_mode")
def test_stream_synchronize_waits_for_the_device():
    _busy(1)
    pending = _state.last[1]
    s = torch.Stream(device="jax:1")
    s.synchronize()
    assert all(a.is_ready() for a in jax.tree_util.tree_leaves(pending))
    assert s.query()


@pytest.mark.two_devices
def test_stream_context_and_set_stream_make_its_device_current():
    s = torch.Stream(device="jax:1")
    with s:
        assert A.current_device_index() == 1
        assert torch.ones(1, device="jax").device.index == 1
        assert A.current_stream() == s
    assert A.current_device_index() == 0
    A.set_stream(s)
    assert A.current_device_index() == 1
    A.set_stream(A.current_stream(0))
    assert A.current_device_index() == 0


@pytest.mark.two_devices
def test_stream_waits_and_record_event():
    s0, s1 = A.current_stream(0), torch.Stream(device="jax:1")
    _busy(0)
    e = s0.record_event()
    assert isinstance(e, torch.Event) and e.device == torch.device("jax:0")
    s1.wait_event(e)
    s1.wait_stream(s0)
    e.wait(s1)
    e.synchronize()
    assert e.query()


@pytest.mark.usefixtures("strict_mode")
def test_event_synchronize_waits_for_the_work_recorded():
    _busy(0)
    pending = _state.last[0]
    e = torch.Event(device="jax")
    e.record()
    assert e.device == torch.device("jax:0")
    e.synchronize()
    assert all(a.is_ready() for a in jax.tree_util.tree_leaves(pending))
    assert e.query()
    assert "device_index=0" in repr(e)


def test_event_elapsed_time():
    start, end = torch.Event(enable_timing=True), torch.Event(enable_timing=True)
    with pytest.raises(ValueError, match="must be recorded"):
        start.elapsed_time(end)
    start.record()
    _busy(0)
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) > 0
    with pytest.raises(ValueError, match="enable_timing=True"):
        start.elapsed_time(torch.Event())


@pytest.mark.two_devices
def test_event_on_another_device_and_mismatch():
    e = torch.Event(device="jax:1")
    e.record(torch.Stream(device="jax:1"))
    assert e.device == torch.device("jax:1")
    with pytest.raises(RuntimeError, match="does not match recording stream's device"):
        e.record(A.current_stream(0))
    with pytest.raises(RuntimeError, match="interprocess events are not supported"):
        torch.Event(device="jax", interprocess=True)


def test_isinstance_holds_for_pytorch_s_own_streams_and_events():
    c_stream = torch._C._accelerator_getStream(0)  # made by PyTorch, not by torch_jax
    assert isinstance(c_stream, torch.Stream)
    assert isinstance(c_stream.record_event(), torch.Event)
    assert issubclass(type(c_stream), torch.Stream)

    class MyEvent(torch.Event):
        pass

    assert isinstance(MyEvent(), torch.Event)
    assert not isinstance(torch.Event(), MyEvent)


# ---- pinned memory ----


def test_pin_memory_is_a_pinned_copy():
    x = torch.arange(12.0).reshape(3, 4).t()
    assert not x.is_pinned()
    p = x.pin_memory()
    assert p.is_pinned() and p.device.type == "cpu"
    assert p.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    assert p.stride() == x.stride() and torch.equal(p, x)
    assert p[1:].is_pinned()
    assert p.pin_memory() is p
    assert p.is_pinned("jax") and x.pin_memory(device="jax").is_pinned()
    assert torch.equal(p.to("jax", non_blocking=True).cpu(), x)


def test_pin_memory_of_a_device_tensor_is_pytorch_s_error():
    with pytest.raises(RuntimeError, match="only dense CPU tensors can be pinned"):
        torch.ones(2, device="jax").pin_memory()


@pytest.mark.parametrize("num_workers", [0, 1])
def test_dataloader_with_pin_memory(num_workers):
    ds = TensorDataset(torch.randn(10, 3), torch.arange(10))
    kwargs = {"num_workers": num_workers, "multiprocessing_context": "spawn"} if num_workers else {}
    got = []
    for xb, yb in DataLoader(ds, batch_size=4, pin_memory=True, **kwargs):
        assert xb.is_pinned() and yb.is_pinned()
        got.append((xb.to("jax", non_blocking=True), yb.to("jax", non_blocking=True)))
    expected = list(DataLoader(ds, batch_size=4))
    assert len(got) == len(expected) == 3
    for (gx, gy), (ex, ey) in zip(got, expected):
        assert gx.device.type == "jax"
        assert torch.equal(gx.cpu(), ex) and torch.equal(gy.cpu(), ey)


# ---- torch.Generator(device="jax") ----


def _draw(g, device="jax"):
    return torch.randn(4, generator=g, device=device).cpu()


def test_generator_is_reproducible_and_independent_of_the_global_rng():
    g = torch.Generator(device="jax")
    assert isinstance(g, torch.Generator) and g.device == torch.device("jax:0")
    g.manual_seed(0)
    a = _draw(g)
    torch.manual_seed(123)
    b = _draw(g)
    assert not torch.equal(a, b)
    g.manual_seed(0)
    torch.manual_seed(7)
    assert torch.equal(_draw(g), a)
    global_state = torch.jax.get_rng_state()
    _draw(g)
    assert torch.equal(torch.jax.get_rng_state(), global_state)  # g does not advance the device RNG


def test_generator_draws_what_the_device_rng_draws_from_the_same_seed():
    torch.manual_seed(3)
    expected = torch.randn(4, device="jax").cpu()
    g = torch.Generator(device="jax").manual_seed(3)
    assert torch.equal(_draw(g), expected)


@pytest.mark.two_devices
def test_generator_state():
    g = torch.Generator(device="jax:1").manual_seed(5)
    assert g.device == torch.device("jax:1") and g.initial_seed() == 5
    state = g.get_state()
    a = _draw(g, "jax:1")
    assert g.get_offset() == 4  # (as CUDA's Philox offset: 4 a draw, NOTE [Device RNG])
    b = _draw(g, "jax:1")
    g.set_offset(g.get_offset() - 4)  # (a discarded draw drawn again, as vLLM does on CUDA)
    assert torch.equal(_draw(g, "jax:1"), b) and not torch.equal(a, b)
    g.set_state(state)
    assert torch.equal(_draw(g, "jax:1"), a)
    g.set_state(state)
    for clone in (g.clone_state(), copy.deepcopy(g), pickle.loads(pickle.dumps(g))):
        assert torch.equal(_draw(clone, "jax:1"), a)
    s = g.seed()
    assert g.initial_seed() == s and g.get_offset() == 0
    with pytest.raises(RuntimeError, match="16-byte uint8"):
        g.set_state(torch.zeros(3))


def test_other_generators_are_pytorch_s():
    assert type(torch.Generator()) is torch._C.Generator
    assert torch.Generator("cpu").device == torch.device("cpu")
    assert isinstance(torch.default_generator, torch.Generator)
    assert isinstance(torch.Generator(device="jax"), torch._C.Generator)
    assert issubclass(torch._C.Generator, torch.Generator)
    # NOTE [torch.Generator's metaclass]: PyTorch's class itself where its metaclass can be hooked
    assert (torch.Generator is torch._C.Generator) == _compat.generator_metaclass_hookable()

    class Mine(torch.Generator):
        pass

    assert type(Mine()) is Mine and isinstance(Mine(), torch.Generator)


def test_a_cpu_generator_on_a_jax_op_raises_as_on_cuda():
    with pytest.raises(RuntimeError, match="Expected a 'jax' device type for generator but found 'cpu'"):
        torch.randn(3, generator=torch.Generator(), device="jax")


_WITH_GENERATOR = {
    "rand": lambda g: torch.rand(5, generator=g, device="jax"),
    "randint": lambda g: torch.randint(0, 100, (5,), generator=g, device="jax"),
    "randperm": lambda g: torch.randperm(6, generator=g, device="jax"),
    "rand_like": lambda g: torch.rand_like(torch.empty(5, device="jax"), generator=g),
    "normal_": lambda g: torch.empty(5, device="jax").normal_(generator=g),
    "normal": lambda g: torch.normal(torch.zeros(5, device="jax"), torch.ones(5, device="jax"), generator=g),
    "uniform_": lambda g: torch.empty(5, device="jax").uniform_(generator=g),
    "exponential_": lambda g: torch.empty(5, device="jax").exponential_(generator=g),
    "bernoulli": lambda g: torch.bernoulli(torch.full((8,), 0.5, device="jax"), generator=g),
    "multinomial": lambda g: torch.multinomial(torch.ones(6, device="jax"), 3, generator=g),
}


@pytest.mark.parametrize("name", sorted(_WITH_GENERATOR))
def test_random_ops_draw_from_the_generator(name):
    op = _WITH_GENERATOR[name]
    g = torch.Generator(device="jax").manual_seed(11)
    a = op(g).cpu()
    assert not torch.equal(op(g).cpu(), a) or name == "bernoulli"  # fresh numbers each call
    g.manual_seed(11)
    torch.manual_seed(0)
    assert torch.equal(op(g).cpu(), a)


def test_generators_share_compiled_computations():
    g1 = torch.Generator(device="jax").manual_seed(1)
    torch.rand(7, generator=g1, device="jax")
    before = torch_jax.stats()["compiles"]
    g2 = torch.Generator(device="jax").manual_seed(2)
    torch.rand(7, generator=g2, device="jax")
    torch.rand(7, device="jax")
    assert torch_jax.stats()["compiles"] == before
