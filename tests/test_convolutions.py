"""Convolutions against the CPU: grouped and depthwise ones, which XLA:CPU runs
written out (NOTE [Grouped convolutions on XLA:CPU] in ops/_conv), and which library
XLA:CPU runs them on (NOTE [Convolutions on XLA:CPU] in runtime/_xla_options)."""

from __future__ import annotations

import contextlib
import re
import shutil

import jax
import pytest
import torch
import torch.nn.functional as F

import torch_jax

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_TRANSPOSED = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
_KERNEL = (3, 2, 3)
_SIZE = (9, 7, 6)


def _cpu_only():
    if jax.devices()[0].platform != "cpu":
        pytest.skip("XLA:CPU's programs")


def _forward_and_grads(fn, x, w, **kwargs):
    """fn's output and its gradients for x and w (one random output gradient, seeded)."""
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    y = fn(x, w, **kwargs)
    gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(1), dtype=y.dtype).to(y.device)
    return (y, *torch.autograd.grad(y, (x, w), gy))


def _compare(fn, x, w, **kwargs):
    want = _forward_and_grads(fn, x, w, **kwargs)
    got = _forward_and_grads(fn, x.to("jax"), w.to("jax"), **kwargs)
    tol = {"rtol": 1e-4, "atol": 1e-4} if x.dtype == torch.float32 else {}  # (as the sweep allows float32 convolutions)
    for name, g, e in zip(("output", "grad_input", "grad_weight"), got, want):
        torch.testing.assert_close(g.cpu(), e.detach(), msg=lambda m, name=name: f"{name}: {m}", **tol)


# (channels in, out, groups): depthwise, depthwise with a channel multiplier, grouped
_GROUPINGS = [(6, 6, 6), (4, 8, 4), (8, 8, 4), (6, 12, 3)]


def _fused_share(configs, turn: int):
    """Fused eager records the same lowerings into graphs: there each case runs one of the
    configurations, the cases taking turns (CI's budget: these two tests took 144 s of
    the fused run's worker time with all of them); strict runs every one."""
    if torch_jax.config.mode != "fused":
        return configs
    return [configs[turn % len(configs)]]


@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("channels", _GROUPINGS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_grouped_convolution(nd, channels, dtype):
    c, o, groups = channels
    g = torch.Generator().manual_seed(0)
    x = torch.randn((2, c) + _SIZE[:nd], generator=g, dtype=dtype)
    w = torch.randn((o, c // groups) + _KERNEL[:nd], generator=g, dtype=dtype)
    configs = [(1, 0, 1), (2, 1, 1), (1, 2, 2), (1, "same", 1), (3, 1, 2)]
    turn = nd + 3 * _GROUPINGS.index(channels) + 12 * (dtype == torch.float32)
    for stride, padding, dilation in _fused_share(configs, turn):
        _compare(_CONV[nd], x, w, stride=stride, padding=padding, dilation=dilation, groups=groups)


@pytest.mark.parametrize("nd", [1, 2])
@pytest.mark.parametrize("channels", _GROUPINGS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_grouped_transposed_convolution(nd, channels, dtype):
    c, o, groups = channels
    g = torch.Generator().manual_seed(0)
    x = torch.randn((2, c) + (5, 6)[:nd], generator=g, dtype=dtype)
    w = torch.randn((c, o // groups) + _KERNEL[:nd], generator=g, dtype=dtype)
    configs = [(1, 0, 0, 1), (2, 1, 1, 1), (3, 2, 0, 2), (2, 3, 1, 1)]
    turn = nd + 2 * _GROUPINGS.index(channels) + 8 * (dtype == torch.float32)
    for stride, padding, output_padding, dilation in _fused_share(configs, turn):
        kwargs = dict(stride=stride, padding=padding, output_padding=output_padding, dilation=dilation)
        _compare(_TRANSPOSED[nd], x, w, groups=groups, **kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_depthwise_convolution_in_low_precision(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 11, 10, generator=g).to(dtype)
    w = torch.randn(16, 1, 3, 3, generator=g).to(dtype)
    want = F.conv2d(x, w, padding=1, groups=8)
    torch.testing.assert_close(F.conv2d(x.to("jax"), w.to("jax"), padding=1, groups=8).cpu(), want)


def test_grouped_convolutions_are_written_out_on_the_cpu():
    """No grouped convolution reaches XLA:CPU (its expansion costs groups times the
    work), forward or backward; a depthwise one becomes sums over its taps, other
    groupings one dense convolution a group."""
    from torch_jax.ops import _conv

    _cpu_only()
    for c, o, groups, dense in [(8, 8, 8, 0), (8, 8, 4, 4)]:
        x = jax.numpy.ones((2, c, 10, 9))
        w = jax.numpy.ones((o, c // groups, 3, 3))

        def fwd(x, w, groups=groups):
            return _conv.conv(x, w, [1], [1], [1], False, [0], groups)

        def grads(x, w):
            y, vjp = jax.vjp(fwd, x, w)
            return vjp(y)

        for fn in (fwd, grads):
            text = jax.jit(fn).lower(x, w).compile().as_text()
            convolutions = re.findall(r"\bconvolution\((.*)$", text, re.M)
            assert not [cv for cv in convolutions if re.search(r"(feature|batch)_group_count=", cv)], text
            if fn is fwd:
                assert len(convolutions) == dense, convolutions


def _fusions_with_tap_sums(fn, *args, taps):
    """How many fusions of fn's XLA:CPU program hold a sum over `taps` kernel taps (at
    least that many strided slices and products)."""
    text = jax.jit(fn).lower(*args).compile().as_text()
    bodies = re.findall(r"^%fused_computation\S* .*?^}", text, re.M | re.S)
    return sum(1 for b in bodies if min(b.count(" slice("), b.count(" multiply(")) >= taps)


def test_depthwise_sums_are_computed_once_in_a_graph():
    """NOTE [Fusion barriers on XLA:CPU]: where a depthwise convolution's output, or its
    input gradient, has several readers in one computation (as in a fused graph), its
    sum over taps runs in one fusion, not inside each reader's."""
    from jax import lax

    from torch_jax.ffi import _fusion_barrier
    from torch_jax.ops import _conv

    _cpu_only()
    if not (shutil.which("c++") or shutil.which("g++")):
        pytest.skip("no C++ compiler: no fusion barriers")
    assert _fusion_barrier.status() == "ok"
    x, w = jax.numpy.ones((2, 8, 12, 12)), jax.numpy.ones((8, 1, 5, 5))

    def readers(y):  # (ConvNeXt's: to channels-last, then LayerNorm)
        z = jax.numpy.transpose(y, (0, 2, 3, 1))
        m = z.mean(-1, keepdims=True)
        return (z - m) * lax.rsqrt(((z - m) ** 2).mean(-1, keepdims=True) + 1e-6), z * 2

    def fwd(x, w):
        return readers(_conv.conv(x, w, [1], [2], [1], False, [0], 8))

    def input_grad(x, w):
        y, vjp = jax.vjp(lambda x: _conv.conv(x, w, [1], [2], [1], False, [0], 8), x)
        (gx,) = vjp(y)
        return readers(gx)

    assert _fusions_with_tap_sums(fwd, x, w, taps=25) == 1
    assert _fusions_with_tap_sums(input_grad, x, w, taps=25) == 2  # (the forward's sum, then gx's)


# (size, kernel, padding, stride, dilation, groups): an output longer than the input
# (wav2vec2's even kernel padded by half), a kernel longer than input and output, a small
# kernel over a smaller input (ResNet's last stage), strided and dilated
_SWAPPED = [
    ((12,), (16,), 8, 1, 1, 1),
    ((12,), (16,), 8, 1, 1, 4),
    ((12, 9), (8, 4), [4, 2], 1, 1, 1),
    ((6,), (20,), 10, 1, 1, 1),
    ((5, 6), (7, 7), 3, 1, 1, 2),
    ((2, 2), (3, 3), 1, 1, 1, 1),
    ((9,), (5,), 4, 2, 2, 1),
]


@pytest.mark.parametrize("size, k, padding, stride, dilation, groups", _SWAPPED, ids=str)
def test_convolutions_xla_would_swap(size, k, padding, stride, dilation, groups):
    """NOTE [Convolutions XLA would swap] in ops/_conv: convolutions whose kernel (or whose
    gradients' kernels) outsize their input give the CPU's results and gradients, and
    XLA:CPU's programs for the forward and the weight gradient have no reversed window
    (its slow loop nest), nor has the input gradient's for kernels of 16 taps or more."""
    import math

    from torch_jax.ops import _conv

    nd = len(size)
    g = torch.Generator().manual_seed(0)
    x = torch.randn((2, 8) + size, generator=g, dtype=torch.float64)
    w = torch.randn((8, 8 // groups) + k, generator=g, dtype=torch.float64)
    kwargs = dict(padding=padding, stride=stride, dilation=dilation, groups=groups)
    _compare(_CONV[nd], x, w, **kwargs)

    _cpu_only()
    xj, wj = jax.numpy.asarray(x.numpy()), jax.numpy.asarray(w.numpy())
    args = ([stride], [padding] if isinstance(padding, int) else padding, [dilation], False, [0], groups)
    y = _conv.conv(xj, wj, *args)

    def program(fn, *operands):
        return jax.jit(fn).lower(*operands).compile().as_text()

    def grad(i):
        mask = [i == 0, i == 1, False]
        return lambda gy, x, w: _conv.convolution_backward_overrideable(gy, x, w, *args, mask)[i]

    assert "rhs_reversal=1" not in program(lambda x, w: _conv.conv(x, w, *args), xj, wj)
    assert "rhs_reversal=1" not in program(grad(1), y, xj, wj)
    if math.prod(k) >= _conv._SWAPPED_TAPS:
        assert "rhs_reversal=1" not in program(grad(0), y, xj, wj)


def test_convolution_backward_computes_what_is_asked():
    """The gradients not in output_mask come back undefined, as on the CPU."""
    aten = torch.ops.aten
    x, w, gy = torch.randn(2, 3, 5, 5), torch.randn(4, 3, 3, 3), torch.randn(2, 4, 3, 3)
    for mask in ([True, False, False], [False, True, False], [True, True, True]):
        args = ([4], [1], [0], [1], False, [0], 1, mask)
        want = aten.convolution_backward(gy, x, w, *args)
        got = aten.convolution_backward(gy.to("jax"), x.to("jax"), w.to("jax"), *args)
        assert [g is None for g in got] == [e is None for e in want], mask
        for g, e in zip(got, want):
            if e is not None:
                torch.testing.assert_close(g.cpu(), e)


def test_float32_convolutions_leave_ynnpack(monkeypatch, strict_mode):
    """NOTE [Convolutions on XLA:CPU]: a computation with float32 (or float16/bfloat16)
    convolutions runs them on XLA's own convolution, its products still on YNNPACK; a
    float64 convolution keeps XLA's defaults (YNNPACK), as does a computation without
    convolutions."""
    from torch_jax.runtime import _recompiles, _xla_options

    _cpu_only()
    seen = []
    compile_ = jax.stages.Lowered.compile

    def spy(self, compiler_options=None, **kwargs):
        exe = compile_(self, compiler_options, **kwargs)
        seen.append((compiler_options, exe.as_text()))
        return exe

    monkeypatch.setattr(jax.stages.Lowered, "compile", spy)
    # (graphs of one structure with new shapes may run op by op: NOTE [One-off graphs run op by op])
    monkeypatch.setattr(_recompiles, "_shapes", {})
    conv = _xla_options.CONV_OPTIONS
    x = torch.randn(2, 64, 21, 19)  # (shapes no other test uses: these compile)
    w = torch.randn(64, 64, 3, 3) / 24
    for dtype, want in [(torch.float32, conv), (torch.bfloat16, conv), (torch.float64, None)]:
        xd, wd = x.to(dtype), w.to(dtype)
        for fused in (False, True):
            seen.clear()
            _recompiles._shapes.clear()
            with torch_jax.fused() if fused else contextlib.nullcontext():
                got = torch.nn.functional.conv2d(xd.to("jax"), wd.to("jax"), padding=1).cpu()
            torch.testing.assert_close(got, torch.nn.functional.conv2d(xd, wd, padding=1))
            [(options, text)] = [s for s in seen if re.search(r" convolution\(", s[1])]
            assert options == want, (dtype, fused)
            on_ynn = [n for n in re.findall(r"^  %(\S+) = .*? fusion\(", text, re.M) if n.startswith("ynn")]
            assert bool(on_ynn) == (want is None), (dtype, fused, on_ynn)
    seen.clear()
    a = torch.randn(131, 129, device="jax")
    (a @ a.t()).cpu()
    assert seen and all(o is None for o, _ in seen)
