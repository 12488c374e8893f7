"""Sparse COO and CSR tensors on jax: creation, conversions, coalescing, elementwise ops,
matrix products, sums, autograd and sparse optimizers, each compared with the CPU; the
sparse CPU fallback; and PyTorch's OpInfo sparse samples (report/_sparse.py)."""

from __future__ import annotations

import warnings

import pytest
import torch

import torch_jax
from conftest import fused_share
from torch_jax.report import _sparse

INDICES = torch.tensor([[0, 1, 1, 0, 2], [2, 0, 2, 2, 1]])  # (sparse_dim, nnz), with a duplicate
VALUES = torch.tensor([3.0, 4.0, 5.0, 1.0, -2.0])


def coo():
    return torch.sparse_coo_tensor(INDICES, VALUES, (3, 3), check_invariants=False)


def dense():
    return torch.tensor([[0.0, 1.5, 0.0, 2.0], [0.0, 0.0, 0.0, 0.0], [-3.0, 0.0, 4.0, 0.0]])


def assert_same(got, expected):
    """A jax result equals the CPU's: layout, dtype, shape, and values (dense values of a
    sparse result; its members where the result is coalesced, as the CPU's is)."""
    if isinstance(expected, (tuple, list)):
        for g, e in zip(got, expected, strict=True):
            assert_same(g, e)
        return
    _sparse.compare(got, expected)
    if expected.layout == torch.sparse_coo and expected.is_coalesced():
        assert got.is_coalesced()
        torch.testing.assert_close(got._indices().cpu(), expected._indices())
        torch.testing.assert_close(got._values().cpu(), expected._values())
    if expected.layout == torch.sparse_csr:
        torch.testing.assert_close(got.crow_indices().cpu(), expected.crow_indices())
        torch.testing.assert_close(got.col_indices().cpu(), expected.col_indices())


def both(fn, *inputs):
    """``fn`` on the CPU inputs and on their jax copies."""
    return fn(*[x.to("jax") for x in inputs]), fn(*inputs)


def test_create_on_device_and_move_back():
    s = torch.sparse_coo_tensor(INDICES.to("jax"), VALUES.to("jax"), (3, 3), check_invariants=False)
    assert s.layout == torch.sparse_coo and s.device == torch.device("jax:0")
    assert s._indices().device.type == "jax" and s._nnz() == 5 and s.sparse_dim() == 2
    assert_same(s, coo())
    t = torch.sparse_coo_tensor(INDICES, VALUES, (3, 3), device="jax", check_invariants=True)
    assert_same(t, coo())
    back = t.cpu()
    assert back.device.type == "cpu" and torch.equal(back.to_dense(), coo().to_dense())
    c = torch.sparse_csr_tensor(torch.tensor([0, 2, 2, 3]), torch.tensor([1, 3, 0]), torch.tensor([1.0, 2.0, 3.0]))
    assert_same(torch.sparse_csr_tensor(*[x.to("jax") for x in (c.crow_indices(), c.col_indices(), c.values())]), c)


@pytest.mark.parametrize("layout", ["coo", "csr", "csc"])
def test_to_jax_and_back(layout):
    x = {"coo": coo(), "csr": dense().to_sparse_csr(), "csc": dense().to_sparse_csc()}[layout]
    j = x.to("jax")
    assert j.layout == x.layout and j.device.type == "jax"
    back = j.cpu()
    assert back.layout == x.layout
    torch.testing.assert_close(back.to_dense(), x.to_dense())


def test_to_dense():
    assert_same(*both(lambda s: s.to_dense(), coo()))
    assert_same(*both(lambda s: s.to_dense(), dense().to_sparse_csr()))
    hybrid = torch.sparse_coo_tensor(INDICES[:1], torch.arange(10.0).reshape(5, 2), (3, 2))  # a dense dim
    assert_same(*both(lambda s: s.to_dense(), hybrid))


def test_to_sparse():
    assert_same(*both(lambda d: d.to_sparse(), dense()))
    assert_same(*both(lambda d: d.to_sparse(1), dense()))
    assert_same(*both(lambda d: d.to_sparse_csr(), dense()))
    assert_same(*both(lambda s: s.to_sparse_csr(), coo()))
    assert_same(*both(lambda d: d.to_sparse_csr().to_sparse(), dense()))


def test_coalesce_indices_values():
    got, expected = both(lambda s: s.coalesce(), coo())
    assert not coo().to("jax").is_coalesced()
    assert_same(got, expected)
    assert_same(got.indices(), expected.indices())
    assert_same(got.values(), expected.values())
    assert_same(*both(lambda s: torch.sparse_coo_tensor(s._indices(), s._values().sin(), (3, 3)).coalesce(), coo()))


@pytest.mark.parametrize(
    "name",
    ["mul_scalar", "scalar_mul", "neg", "div", "sin", "sqrt_abs", "pow", "dense_add", "sparse_add", "add_", "sub_"],
)
def test_elementwise_keeps_sparsity(name):
    fn = {
        "mul_scalar": lambda s: s * 2.5,
        "scalar_mul": lambda s: 3 * s,
        "neg": lambda s: -s,
        "div": lambda s: s / 4,
        "sin": lambda s: s.sin(),
        "sqrt_abs": lambda s: s.abs().sqrt(),
        "pow": lambda s: s.pow(2),
        "dense_add": lambda s: torch.ones(3, 3, device=s.device) + s,
        "sparse_add": lambda s: s + s * 2,
        "add_": lambda s: torch.ones(3, 3, device=s.device).add_(s, alpha=-0.5),
        "sub_": lambda s: torch.ones(3, 3, device=s.device).sub_(s),
    }[name]
    assert_same(*both(fn, coo()))
    if name not in ("div", "pow", "sparse_add", "sub_"):  # (the CPU has no CSR kernel for these)
        assert_same(*both(fn, dense()[:, :3].to_sparse_csr()))


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_sparse_mm_and_addmm(layout):
    s = coo() if layout == "coo" else coo().to_sparse_csr()
    d = torch.randn(3, 4)
    assert_same(*both(torch.sparse.mm, s, d))
    assert_same(*both(lambda s, d: torch.mm(s, d), s, d))
    assert_same(*both(lambda b, s, d: torch.addmm(b, s, d, beta=0.5, alpha=2.0), torch.randn(3, 4), s, d))
    assert_same(*both(lambda d, s: torch.mm(d, s), torch.randn(2, 3), s))


def test_sparse_sum():
    assert_same(*both(torch.sparse.sum, coo()))
    assert_same(*both(lambda s: torch.sparse.sum(s, 0), coo()))
    assert_same(*both(lambda s: torch.sparse.sum(s, (0, 1)), coo()))
    assert_same(*both(lambda s: s.sum(1), coo()))
    assert_same(*both(lambda s: s.sum(0, keepdim=True), dense().to_sparse_csr()))


def _spmm_grads(device):
    values = VALUES.to(device).requires_grad_()
    d = torch.randn(3, 4, generator=torch.Generator().manual_seed(0)).to(device).requires_grad_()
    s = torch.sparse_coo_tensor(INDICES.to(device), values, (3, 3))
    (torch.sparse.mm(s, d) ** 2).sum().backward()
    return d.grad, values.grad


def test_autograd_through_sparse_mm():
    got, expected = _spmm_grads("jax"), _spmm_grads("cpu")
    assert_same(got, expected)


def _train_embedding(device, optimizer, steps, **kwargs):
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 3, sparse=True).to(device)
    opt = optimizer(emb.parameters(), **kwargs)
    index = torch.randint(0, 10, (steps, 6))
    target = torch.randn(steps, 6, 3)
    for step in range(steps):
        opt.zero_grad()
        loss = ((emb(index[step].to(device)) - target[step].to(device)) ** 2).sum()
        loss.backward()
        if step == 0:
            assert emb.weight.grad.layout == torch.sparse_coo and emb.weight.grad.device.type == device
        opt.step()
    return emb.weight.detach()


def test_embedding_sparse_adam_50_steps():
    got = _train_embedding("jax", torch.optim.SparseAdam, 50, lr=0.05)
    expected = _train_embedding("cpu", torch.optim.SparseAdam, 50, lr=0.05)
    torch.testing.assert_close(got.cpu(), expected)  # float32 rounding


def test_embedding_sgd_sparse_grads():
    got = _train_embedding("jax", torch.optim.SGD, 10, lr=0.1)
    expected = _train_embedding("cpu", torch.optim.SGD, 10, lr=0.1)
    torch.testing.assert_close(got.cpu(), expected)


def test_fallback_warns_counts_and_errors():
    s, index = coo().to("jax"), torch.tensor([2, 0], device="jax")  # index_select: no sparse kernel
    with pytest.raises(NotImplementedError, match="index_select"):
        s.index_select(0, index)
    torch_jax.config.fallback = "warn"
    torch_jax.reset_stats()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = s.index_select(0, index)
    assert any("aten::index_select" in str(w.message) for w in caught)
    assert torch_jax.stats()["fallback_ops"]["aten::index_select"] == 1
    assert_same(got, coo().index_select(0, torch.tensor([2, 0])))


# OpInfo sparse samples: (OpInfo, layout) -> why they go through the CPU fallback, or why they
# are skipped (they fail on some samples, and which samples show it depends on random values)
FALLBACK = {("masked.prod", "sparse_csr"): "_sparse_csr_prod has no jax kernel"}
FAILING: dict = {}
MAX_SAMPLES = {"unary": 1, "reduction": 2}


def _cases():
    for op in _sparse.opinfos():
        for layout in _sparse.LAYOUTS:
            name = str(layout).replace("torch.", "")
            marks = [pytest.mark.skip(reason=FAILING[op.name, name])] if (op.name, name) in FAILING else []
            yield pytest.param(op, layout, id=f"{op.name}-{name}", marks=marks)


@pytest.mark.parametrize("op, layout", fused_share(list(_cases()), 2))
def test_opinfo_sparse_samples(op, layout):
    kind = "unary" if _sparse._is_unary(op) else "reduction"
    result = _sparse.check(op, layout, torch.float32, max_samples=MAX_SAMPLES[kind])
    if result.status == "skip":
        pytest.skip("no sample runs on the CPU in this layout")
    expected = "fallback" if (op.name, result.layout) in FALLBACK else "native"
    assert result.status == expected, f"{result.status}: {result.message} {result.fallback_ops}"


def test_report_table():
    from torch.testing._internal.common_methods_invocations import sparse_unary_ufuncs

    abs_op = next(op for op in sparse_unary_ufuncs if op.name == "abs")
    results = [_sparse.check(abs_op, layout, torch.float32, max_samples=1) for layout in _sparse.LAYOUTS]
    text = "\n".join(_sparse.markdown(results))
    assert "| abs | ok | ok |" in text and "**2 of 2 (OpInfo, layout, dtype) cases" in text


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_products_without_a_kernel_fall_back_with_their_gradients(allow_fallback):
    # (sampled_addmm and the reducing sparse.mm run on the CPU; the reducing product's
    # CPU kernel keeps the arg-max indices for its backward only for inputs that require
    # grad, so the fallback's copies must keep the flag)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(5, 5, generator=g).relu().to_sparse_csr()
    m1, m2 = torch.randn(5, 3, generator=g), torch.randn(3, 5, generator=g)
    assert_same(
        torch.sparse.sampled_addmm(a.to("jax"), m1.to("jax"), m2.to("jax"), beta=0.5),
        torch.sparse.sampled_addmm(a, m1, m2, beta=0.5),
    )
    w = torch.randn(5, 4, generator=g)
    for reduce in ("sum", "amax"):
        results = []
        for device in ("cpu", "jax"):
            s = a.detach().to(device).requires_grad_()
            x = w.detach().to(device).requires_grad_()
            torch.sparse.mm(s, x, reduce).square().sum().backward()
            results.append((x.grad, s.grad))
        assert_same(results[1], results[0])
