"""Property tests: hypothesis builds random chains of ops (elementwise, broadcasting,
reductions, views, in-place writes through views, indexing) on random shapes and dtypes,
including empty and 0-d tensors, non-contiguous inputs and extreme values (inf, nan,
-0.0, integer extremes whose arithmetic wraps), and runs each chain on jax and on the
CPU side by side. After every step the two must agree: values (and the sign of zeros),
dtype, shape, strides, and the base tensor of every in-place write through a view. When
the CPU raises, jax must raise the same exception type.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from conftest import to_cpu

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8]
DTYPES = FLOATS + INTS + [torch.bool, torch.complex64]

SETTINGS = settings(
    max_examples=100,
    deadline=None,
    derandomize=True,  # the same examples on every run: CI is reproducible
    phases=(Phase.explicit, Phase.generate),  # no shrinking: a failing chain is printed as drawn
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _special_values(dtype):
    if dtype.is_floating_point:
        info = torch.finfo(dtype)
        return [0.0, -0.0, 1.0, -1.0, 0.5, math.inf, -math.inf, math.nan, info.max, info.min, info.tiny, 3.0]
    if dtype == torch.bool:
        return [False, True]
    if dtype.is_complex:
        return [0j, 1 + 1j, -2.5j, complex(math.inf, 0), complex(math.nan, 1.0), 3 - 4j]
    info = torch.iinfo(dtype)
    return [0, 1, -1 if info.min < 0 else 2, info.max, info.min, 7, info.max - 1]


@st.composite
def tensors(draw, dtype=None, shape=None, min_dims=0, max_dims=3):
    """A CPU tensor, possibly non-contiguous (a transposed or strided view)."""
    dtype = dtype or draw(st.sampled_from(DTYPES))
    if shape is None:
        shape = tuple(draw(st.lists(st.integers(0, 4), min_size=min_dims, max_size=max_dims)))
    values = _special_values(dtype)
    layout = draw(st.sampled_from(["contiguous", "transposed", "strided"])) if len(shape) >= 2 else "contiguous"
    full = list(shape)
    if layout == "transposed":
        full[-1], full[-2] = full[-2], full[-1]
    elif layout == "strided":
        full[-1] = full[-1] * 2
    n = math.prod(full)
    data = draw(st.lists(st.sampled_from(values), min_size=n, max_size=n))
    x = torch.tensor(data, dtype=dtype).reshape(full) if n else torch.empty(full, dtype=dtype)
    if layout == "transposed":
        x = x.transpose(-1, -2)
    elif layout == "strided":
        x = x[..., ::2]
    assert tuple(x.shape) == shape
    return x


def check_same(got, expected):
    """jax result ``got`` equals CPU result ``expected``, signs of zeros included."""
    if isinstance(expected, (tuple, list)):
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            check_same(g, e)
        return
    if not isinstance(expected, torch.Tensor):
        assert got == expected or (got != got and expected != expected)
        return
    assert got.device.type == "jax"
    assert got.dtype == expected.dtype, f"dtype {got.dtype} != {expected.dtype}"
    assert got.shape == expected.shape, f"shape {tuple(got.shape)} != {tuple(expected.shape)}"
    if expected.numel() > 1:
        # strides of size-1 dims carry no layout, and PyTorch's own Meta and CPU kernels
        # disagree on them (mul by a wrapped scalar keeps the input's, the Meta kernel does not)
        real = [i for i, s in enumerate(expected.shape) if s != 1]
        assert [got.stride(i) for i in real] == [expected.stride(i) for i in real], (
            f"stride {got.stride()} != {expected.stride()}"
        )
    g = got.cpu()
    torch.testing.assert_close(g, expected, equal_nan=True)
    if expected.dtype.is_floating_point:
        zeros = expected == 0
        assert torch.equal(torch.signbit(g[zeros]), torch.signbit(expected[zeros])), "sign of zero differs"


def both(fn, x_cpu, x_dev, *rest):
    """Run ``fn`` on the CPU tensors and on the jax tensors; compare; return both results."""
    rest_cpu = [r for r in rest]
    rest_dev = [r.to("jax") if isinstance(r, torch.Tensor) else r for r in rest]
    try:
        expected = fn(x_cpu, *rest_cpu)
    except Exception as e:  # noqa: BLE001
        with pytest.raises(type(e)):
            fn(x_dev, *rest_dev)
            torch.jax.synchronize()  # (fused eager raises value errors at the next wait)
        return None
    got = fn(x_dev, *rest_dev)
    check_same(got, expected)
    return expected, got


UNARY = {
    "neg": torch.neg,
    "abs": torch.abs,
    "sign": torch.sign,
    "square": torch.square,
    "exp": torch.exp,
    "log": torch.log,
    "sqrt": torch.sqrt,
    "sin": torch.sin,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "floor": torch.floor,
    "round": torch.round,
    "reciprocal": torch.reciprocal,
    "bitwise_not": torch.bitwise_not,
    "logical_not": torch.logical_not,
    "isnan": torch.isnan,
    "nan_to_num": torch.nan_to_num,
    "relu": torch.relu,
}

BINARY = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "floor_divide": torch.floor_divide,
    "remainder": torch.remainder,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "pow": torch.pow,
    "eq": torch.eq,
    "lt": torch.lt,
    "ge": torch.ge,
    "bitwise_and": torch.bitwise_and,
    "logical_or": torch.logical_or,
    "atan2": torch.atan2,
    "where": lambda a, b: torch.where(a > 0 if a.dtype != torch.bool else a, a, b),
    "add_alpha": lambda a, b: torch.add(a, b, alpha=2),
}

WITH_SCALAR = {  # a Python number as the second operand (a wrapped number in PyTorch's promotion)
    "add": lambda a, s: a + s,
    "mul": lambda a, s: a * s,
    "sub": lambda a, s: a - s,
    "div": lambda a, s: a / s,
    "pow": lambda a, s: a**s,
    "clamp": lambda a, s: a if isinstance(s, bool) else a.clamp(min=s),
}

REDUCTIONS = {
    "sum": lambda x, d: x.sum() if d is None else x.sum(d),
    "prod": lambda x, d: x.prod() if d is None else x.prod(d),
    "amax": lambda x, d: x.amax() if d is None else x.amax(d),
    "amin": lambda x, d: x.amin() if d is None else x.amin(d),
    "argmax": lambda x, d: x.argmax() if d is None else x.argmax(d),
    "mean": lambda x, d: x.mean() if d is None else x.mean(d),
    "any": lambda x, d: x.any() if d is None else x.any(d),
    "cumsum": lambda x, d: x.cumsum(0 if d is None else d),
}


def _broadcast_partner(draw, shape):
    """A shape that broadcasts with ``shape``: some dims dropped from the front or set to 1."""
    drop = draw(st.integers(0, len(shape)))
    out = [1 if draw(st.booleans()) else s for s in shape[drop:]]
    return tuple(out)


@given(data=st.data())
@SETTINGS
def test_elementwise_chains(data):
    """unary -> binary (broadcast, mixed dtypes: type promotion) -> unary, step by step."""
    x = data.draw(tensors())
    xd = x.to("jax")
    for _ in range(3):
        kind = data.draw(st.sampled_from(["unary", "binary", "scalar"]))
        if kind == "unary":
            name = data.draw(st.sampled_from(sorted(UNARY)))
            r = both(UNARY[name], x, xd)
        elif kind == "binary":
            name = data.draw(st.sampled_from(sorted(BINARY)))
            other = data.draw(tensors(shape=_broadcast_partner(data.draw, tuple(x.shape))))
            r = both(BINARY[name], x, xd, other)
        else:
            name = data.draw(st.sampled_from(sorted(WITH_SCALAR)))
            s = data.draw(st.sampled_from([2, -1, 0.5, True, math.inf, 0]))
            r = both(functools.partial(WITH_SCALAR[name], s=s), x, xd)
        if r is None:
            return
        x, xd = r
        if not isinstance(x, torch.Tensor):
            return


@given(data=st.data())
@SETTINGS
def test_reductions(data):
    x = data.draw(tensors())
    name = data.draw(st.sampled_from(sorted(REDUCTIONS)))
    dim = data.draw(st.one_of(st.none(), st.integers(-x.dim(), x.dim() - 1))) if x.dim() else None
    both(lambda t: REDUCTIONS[name](t, dim), x, x.to("jax"))


def _view(draw, x):
    """A view op applicable to ``x`` (a function of the tensor), with its name."""
    options = ["reshape_flat", "unsqueeze"]
    if x.dim() >= 1:
        options += ["slice", "select", "narrow", "flip_view", "expand_like"]
    if x.dim() >= 2:
        options += ["t", "diagonal", "permute"]
    name = draw(st.sampled_from(options))
    if name == "reshape_flat":
        return name, lambda t: t.reshape(-1)
    if name == "unsqueeze":
        d = draw(st.integers(0, x.dim()))
        return name, lambda t: t.unsqueeze(d)
    d = draw(st.integers(0, x.dim() - 1))
    size = x.shape[d]
    if name == "slice":
        start = draw(st.integers(0, size))
        step = draw(st.integers(1, 3))
        return name, lambda t: t.narrow(d, 0, t.shape[d])[(slice(None),) * d + (slice(start, None, step),)]
    if name == "select":
        if size == 0:
            return "reshape_flat", lambda t: t.reshape(-1)
        i = draw(st.integers(-size, size - 1))
        return name, lambda t: t.select(d, i)
    if name == "narrow":
        start = draw(st.integers(0, size))
        length = draw(st.integers(0, size - start))
        return name, lambda t: t.narrow(d, start, length)
    if name == "flip_view":  # a negative-step view does not exist in PyTorch; unfold is a real view
        return name, lambda t: t.unfold(d, 1, 1)
    if name == "expand_like":
        return name, lambda t: t.unsqueeze(0).expand(2, *t.shape)
    if name == "t":
        return name, lambda t: t.transpose(0, 1)
    if name == "diagonal":
        off = draw(st.integers(-2, 2))
        return name, lambda t: t.diagonal(off)
    perm = draw(st.permutations(list(range(x.dim()))))
    return name, lambda t: t.permute(*perm)


INPLACE = {
    "add_": lambda v: v.add_(1),
    "mul_": lambda v: v.mul_(2),
    "fill_": lambda v: v.fill_(3),
    "zero_": lambda v: v.zero_(),
    "neg_": lambda v: v.neg_(),
    "clamp_": lambda v: v.clamp_(min=0),
    "copy_": lambda v: v.copy_(torch.ones_like(v)),
}


@given(data=st.data())
@SETTINGS
def test_views_and_inplace_writes(data):
    """Nested views, then an in-place op through the last one: the base and every view agree."""
    dtype = data.draw(st.sampled_from([torch.float32, torch.int64, torch.float64, torch.int32, torch.bfloat16]))
    base_d = data.draw(tensors(dtype=dtype, min_dims=1)).to("jax")
    # the CPU twin has the device tensor's layout (moving a non-dense view to a device
    # makes it contiguous, on CUDA too), so views of both have the same strides
    base = base_d.cpu()
    views, views_d = [base], [base_d]
    for _ in range(data.draw(st.integers(1, 3))):
        _, fn = _view(data.draw, views[-1])
        r = both(fn, views[-1], views_d[-1])
        if r is None:
            return
        views.append(r[0])
        views_d.append(r[1])
    name = data.draw(st.sampled_from(sorted(INPLACE)))
    target, target_d = views[-1], views_d[-1]
    r = both(INPLACE[name], target, target_d)
    for v, vd in zip(views, views_d):
        check_same(vd, v)
    if r is not None:
        assert base_d._version == base._version


@given(data=st.data())
@SETTINGS
def test_indexing(data):
    """Index tensors, boolean masks and slices: reads, setitem, index_put_ with accumulate."""
    dtype = data.draw(st.sampled_from([torch.float32, torch.int64, torch.bool, torch.float16, torch.uint8]))
    x = data.draw(tensors(dtype=dtype, min_dims=1))
    xd = x.to("jax")
    n = x.shape[0]
    kind = data.draw(st.sampled_from(["index", "mask", "setitem_index", "setitem_mask", "accumulate", "slice"]))
    idx = torch.tensor(data.draw(st.lists(st.integers(-n - 1, n) if n else st.integers(-1, 1), max_size=5)))
    idx = idx.long()
    mask = torch.tensor(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=torch.bool)
    value = data.draw(st.sampled_from([0, 1, 5]))
    if kind == "index":
        both(lambda t, i: t[i], x, xd, idx)
    elif kind == "mask":
        both(lambda t, m: t[m], x, xd, mask)
    elif kind == "slice":
        start, stop = data.draw(st.integers(-n - 1, n + 1)), data.draw(st.integers(-n - 1, n + 1))
        both(lambda t: t[start:stop], x, xd)
    else:

        def write(t, i):
            t = t.clone()
            if kind == "setitem_index":
                t[i] = value
            elif kind == "setitem_mask":
                t[mask.to(t.device)] = value
            else:
                t.index_put_((i,), torch.full(i.shape + t.shape[1:], value, dtype=t.dtype, device=t.device), True)
            return t

        both(write, x, xd, idx)


@given(x=tensors(dtype=torch.int32, min_dims=1), y=tensors(dtype=torch.int8, min_dims=1))
@SETTINGS
def test_integer_overflow_wraps(x, y):
    """Integer arithmetic wraps around as on the CPU; mixed widths promote first."""
    xd, yd = x.to("jax"), y.to("jax")
    both(lambda a: a * 3 + 2147483647, x, xd)
    both(lambda a: a - (-2147483648), x, xd)
    both(lambda a: (a * a).sum(), y, yd)
    both(lambda a: a.to(torch.int8), x, xd)
    if x.dim() == y.dim() and x.shape == y.shape:
        both(lambda a, b: a + b, x, xd, y)


def test_extreme_value_table():
    """A fixed table of edge values through the same ops, so a regression shows without hypothesis."""
    # no subnormals: XLA's CPU backend flushes them to zero (see docs/COVERAGE.md)
    x = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, 1.2e-38, -1.0, 3.4e38])
    xd = x.to("jax")
    for name, fn in UNARY.items():
        if name == "bitwise_not":
            continue
        both(fn, x, xd)
    for name, fn in BINARY.items():
        if name == "bitwise_and":
            continue
        both(fn, x, xd, x.flip(0))
    check_same(to_cpu(xd).to("jax"), x)


def test_complex_division_and_scaling_of_edge_values():
    """NOTE [Complex division]: PyTorch divides complex numbers with numpy's algorithm, no
    special cases for infinities ((inf + inf j) / -1 is nan + nan j; XLA's own division
    gives -inf - inf j); every pair of these parts, divided both ways, by a wrapped
    number, and through reciprocal, sgn and addcdiv; and add, sub and addcmul, whose
    scalar of 1 PyTorch multiplies by as a complex number (NOTE [Complex scaling]). (No
    values whose quotients are subnormal: XLA's CPU backend flushes them to zero.)"""
    parts = [0.0, -0.0, 1.0, -1.0, 2.5, math.inf, -math.inf, math.nan]
    for dtype in (torch.complex64, torch.complex128):
        z = torch.tensor([complex(a, b) for a in parts for b in parts], dtype=dtype)
        a, b = z.repeat_interleave(len(z)), z.repeat(len(z))
        both(torch.div, a, a.to("jax"), b)
        both(lambda x: x / -1, z, z.to("jax"))
        both(lambda x: x / 2j, z, z.to("jax"))
        both(torch.reciprocal, z, z.to("jax"))
        both(torch.sgn, z, z.to("jax"))
        both(lambda x, y: x.div_(y), a.clone(), a.clone().to("jax"), b)
        both(lambda x, y: torch.addcdiv(torch.ones_like(x), x, y), a, a.to("jax"), b)  # (1 + 0j) * x first
        # NOTE [Complex scaling]: alpha and value multiply as complex numbers, 1 too
        both(torch.add, a, a.to("jax"), b)
        both(torch.sub, a, a.to("jax"), b)
        both(lambda x, y: torch.addcmul(torch.ones_like(x), x, y), a, a.to("jax"), b)
