"""The strict executor: one cached computation per (op, static args, shapes, dtypes),
asynchronous dispatch, debug-blocking mode. Behaviour is asserted as counts."""

from __future__ import annotations

import warnings

import torch

import torch_jax
from torch_jax.tensor import _storage


def test_repeated_op_hits_the_cache():
    a, b = torch.randn(8, 8, device="jax"), torch.randn(8, 8, device="jax")
    a * b + 1  # warm up
    torch_jax.reset_stats()
    for _ in range(10):
        c = a * b + 1
    s = torch_jax.stats()
    assert s["compiles"] == 0
    assert s["cache_hits"] == s["ops"] == 20
    assert c.shape == (8, 8)


def test_new_shape_or_dtype_compiles_once():
    torch_jax.reset_stats()
    x = torch.randn(3, 5, device="jax")
    torch.sin(x)
    torch.sin(x)
    torch.sin(torch.randn(4, 5, device="jax"))
    torch.sin(x.double())
    compiles = torch_jax.stats()["compiles"]
    torch.sin(x), torch.sin(torch.randn(4, 5, device="jax")), torch.sin(x.double())
    assert torch_jax.stats()["compiles"] - compiles <= 2  # randn/to of the new tensors, not sin


def test_changing_python_scalars_do_not_recompile():
    x = torch.randn(16, device="jax")
    x.mul_(0.5).add_(x, alpha=0.1)
    torch_jax.reset_stats()
    for i in range(20):
        x.mul_(1.0 + i / 100).add_(x, alpha=0.01 * i)
    assert torch_jax.stats()["compiles"] == 0


def test_dispatch_is_asynchronous(strict_mode):
    """Ops return before their results are computed: a chain of ops on a large matrix
    is queued while the host goes on (the last result is not ready yet)."""
    x = torch.randn(1024, 1024, device="jax")
    torch.jax.synchronize()
    y = x
    for _ in range(8):
        y = y @ x
    arr = _storage.box_of(y).arr
    ready_at_return = arr.is_ready()
    torch.jax.synchronize()
    assert arr.is_ready()
    assert not ready_at_return


def test_launch_blocking_waits_for_every_op(strict_mode):
    torch_jax.config.launch_blocking = True
    try:
        x = torch.randn(1024, 1024, device="jax")
        y = x @ x
        assert _storage.box_of(y).arr.is_ready()
    finally:
        torch_jax.config.launch_blocking = False


def test_view_inputs_are_read_inside_the_computation():
    """An op on a view is one computation (the view read is fused into it)."""
    x = torch.randn(8, 8, device="jax")
    torch.exp(x.t()[2:5])
    torch_jax.reset_stats()
    torch.exp(x.t()[2:5])
    s = torch_jax.stats()
    assert s["ops"] == 1 and s["compiles"] == 0


def test_loop_over_rows_compiles_once():
    """Views at different (non-zero) storage offsets share one computation: the offset
    is an input (offset 0 is compiled in)."""
    x = torch.randn(16, 8, device="jax")
    y = torch.empty(16, 8, device="jax")
    for i in (0, 1):
        y[i].copy_(x[i] * 2)
    torch_jax.reset_stats()
    for i in range(2, 16):
        y[i].copy_(x[i] * 2)
    assert torch_jax.stats()["compiles"] == 0
    assert torch.equal(y.cpu(), x.cpu() * 2)


def test_compile_cache_is_bounded():
    """NOTE [Bounded compile cache]: past config.cache_size computations, those not used
    since the last sweep are dropped (and compiled again if they come back)."""
    from torch_jax.runtime import _compile_cache

    before = torch_jax.config.cache_size
    torch_jax.config.cache_size = 8
    try:
        torch_jax.reset_stats()
        for n in range(1, 41):
            torch.ones(n, device="jax").exp()
        assert torch_jax.stats()["cache_evictions"] > 0
        assert _compile_cache.entries() <= 8
    finally:
        torch_jax.config.cache_size = before


def test_a_sweep_keeps_the_computations_just_compiled():
    """An entry compiled by the last call was used by it: a sweep right after keeps it
    (an entry counted as used only on cache hits was dropped, and the next step of a
    training loop compiled it again)."""
    from torch_jax.runtime import _compile_cache

    x = torch.randn(5, 7, device="jax")
    torch.special.erfcx(x)  # (an op and shape no other test compiles)
    _compile_cache.sweep()
    compiles = torch_jax.stats()["compiles"]
    torch.special.erfcx(x)
    assert torch_jax.stats()["compiles"] == compiles


def test_small_computations_compile_cheaply(monkeypatch, strict_mode):
    """NOTE [Cheap compilation of small computations]: on the CPU a strict op's
    computation or a fused graph over small arrays is compiled with XLA's fusion emitters
    off and LLVM at level 1 (its compile time is mostly their fixed cost); larger ones
    keep XLA's defaults."""
    import jax
    import pytest

    from torch_jax.runtime import _xla_options

    if jax.devices()[0].platform != "cpu":
        pytest.skip("the options are XLA:CPU's")
    assert _xla_options.SMALL_OPTIONS == {"xla_cpu_use_fusion_emitters": False, "xla_backend_optimization_level": 1}
    seen = []
    compile_ = jax.stages.Lowered.compile

    def spy(self, compiler_options=None, **kwargs):
        seen.append(compiler_options)
        return compile_(self, compiler_options, **kwargs)

    def compiled(fn):
        seen.clear()
        fn()
        assert seen
        return seen

    monkeypatch.setattr(jax.stages.Lowered, "compile", spy)
    small = _xla_options._known(_xla_options.SMALL_OPTIONS)  # (those this jaxlib takes: all of them on 0.10)
    x = torch.randn(3, 13, device="jax")  # (shapes no other test uses: these compile)
    big = torch.randn(131, 127, device="jax")  # 16637 elements: above the bound
    assert all(o == small for o in compiled(lambda: torch.special.erfcx(x * 3 + 1)))
    assert all(o is None for o in compiled(lambda: torch.special.erfcx(big * 3 + 1)))
    with torch_jax.fused():
        assert compiled(lambda: torch.special.erfcx(x * 5 - 2).cpu()) == [small]
        # a graph of small inputs and outputs whose ops make a large array
        assert compiled(lambda: (x.sum() + torch.ones(131, 127, device="jax")).sum().cpu()) == [None]
        assert compiled(lambda: torch.special.erfcx(big * 5 - 2).cpu()) == [None]


def test_the_devices_lowerings_share_an_mlir_context(monkeypatch, strict_mode):
    """NOTE [One MLIR context for many lowerings]: on a thread, strict ops' and fused
    graphs' lowerings share one MLIR context, a new one every IR_CONTEXT_USES; a user's own
    jax.jit lowers into a context of its own."""
    import threading

    import jax
    import jax.numpy as jnp

    from torch_jax.runtime import _xla_options

    _xla_options._known(_xla_options.SMALL_OPTIONS)  # (its probe compiles a computation of its own)
    contexts = []
    compile_ = jax.stages.Lowered.compile

    def spy(self, *args, **kwargs):
        contexts.append(self.compiler_ir().context)
        return compile_(self, *args, **kwargs)

    def device_work():  # (a new thread: its lowerings start a context of their own)
        x = torch.randn(3, 19, device="jax")  # (shapes no other test uses: these compile)
        torch.special.erfcx(x * 7 + 1).cpu()
        with torch_jax.fused():
            (torch.special.erfcx(x * 9 - 2) + 1).sum().cpu()

    monkeypatch.setattr(jax.stages.Lowered, "compile", spy)
    monkeypatch.setattr(_xla_options, "IR_CONTEXT_USES", 3)
    worker = threading.Thread(target=device_work)
    worker.start()
    worker.join()
    assert len(contexts) >= 5, len(contexts)
    for i, context in enumerate(contexts):
        assert context is contexts[i - i % 3], i
    assert contexts[3] is not contexts[0]
    users = [jax.jit(lambda v, k=k: v * k).lower(jnp.ones(5)).compiler_ir().context for k in (2, 3)]
    assert users[0] is not users[1] and not any(u is c for u in users for c in contexts)


def test_arange_goes_straight_to_its_lowering():
    # NOTE [arange without its out= form] in ops/_factories
    from torch_jax.runtime._install import REGISTERED

    aten = torch.ops.aten
    for args in [(5,), (2.5,), (0,), (1, 7), (1, 7.5), (-3, 4.0), (2, 2)]:
        for dtype in [None, torch.float32, torch.float16, torch.int32, torch.int64]:
            want = torch.arange(*args, dtype=dtype)
            got = torch.arange(*args, dtype=dtype, device="jax")
            assert got.dtype == want.dtype and torch.equal(got.cpu(), want), (args, dtype)
    # (not through an empty tensor, arange.start_out, a resize and a copy)
    assert REGISTERED[aten.arange.default] == REGISTERED[aten.arange.start] == "lowered"


def test_deprecated_range_is_lowered():
    from torch_jax.runtime._install import REGISTERED

    aten = torch.ops.aten
    cases = [(0, 4), (0, 4.5), (1, 7, 2), (1, 8, 2), (4, 0, -1), (4, 0, -1.5), (-3, 4.0), (2, 2), (0, 1, 0.1)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch.range is deprecated)
        for args in cases:
            for dtype in [None, torch.float32, torch.float64, torch.int32, torch.int64]:
                if dtype in (torch.int32, torch.int64) and len(args) == 3 and abs(args[2]) < 1:
                    continue  # (PyTorch's CPU kernel divides by the truncated step: SIGFPE)
                want = torch.range(*args, dtype=dtype)
                got = torch.range(*args, dtype=dtype, device="jax")
                assert got.dtype == want.dtype and torch.equal(got.cpu(), want), (args, dtype)
    assert REGISTERED[aten.range.step] == REGISTERED[aten.range.default] == "lowered"
