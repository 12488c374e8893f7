"""Views alias and in-place writes propagate exactly as on CPU.

Each case is a program run twice, on CPU and on jax; everything it returns (the base
after the writes, the views) must match in values, dtype, shape and strides.
"""

from __future__ import annotations

import pytest
import torch

from conftest import assert_same


def base(device, dtype=torch.float32):
    return torch.arange(24, dtype=dtype).reshape(4, 6).to(device)


def _then(x, *writes):
    return x


CASES = {
    "select_add_": lambda d: _then(x := base(d), x[0].add_(1)),
    "select_negative_index": lambda d: _then(x := base(d), x[-1].mul_(2)),
    "column_mul_": lambda d: _then(x := base(d), x[:, 2].mul_(-1)),
    "transpose_row_fill_": lambda d: _then(x := base(d), x.t()[1].fill_(7)),
    "t_contiguous_check": lambda d: (x := base(d).t(), x.contiguous()),
    "permute_3d_write": lambda d: _then(x := base(d), x.view(2, 3, 4).permute(2, 0, 1)[1].fill_(9)),
    "diagonal_zero_": lambda d: _then(x := base(d), x[:, :4].diagonal().zero_()),
    "diagonal_offset": lambda d: _then(x := base(d), x.diagonal(offset=2).add_(100)),
    "step_slice": lambda d: _then(x := base(d), x[::2, 1::3].add_(100)),
    "narrow": lambda d: _then(x := base(d), x.narrow(1, 2, 3).sub_(5)),
    "nested_views": lambda d: _then(x := base(d), x[1:].t()[2:4][:, 1].fill_(-3)),
    "view_reshape_write": lambda d: _then(x := base(d), x.view(24)[5:10].zero_()),
    "reshape_of_contiguous_is_view": lambda d: _then(x := base(d), x.reshape(6, 4)[0].fill_(1)),
    "flatten_write": lambda d: _then(x := base(d), x.flatten()[::5].fill_(-1)),
    "unsqueeze_squeeze": lambda d: _then(x := base(d), x.unsqueeze(0).squeeze(0)[2].add_(3)),
    "expand_source_write": lambda d: (src := torch.arange(6.0).to(d), e := src.expand(3, 6), src.mul_(2), e * 1),
    "expand_read": lambda d: torch.arange(3.0).to(d).expand(2, 3) * 2,
    "unfold_read": lambda d: base(d).view(-1).unfold(0, 5, 2) * 1,
    "unfold_write": lambda d: _then(x := base(d), x.view(-1).unfold(0, 4, 4).mul_(2)),
    "split_write": lambda d: _then(x := base(d), [t.add_(i) for i, t in enumerate(x.split(2))]),
    "unbind_write": lambda d: _then(x := base(d), [t.mul_(i) for i, t in enumerate(x.unbind(1))]),
    "chunk_write": lambda d: _then(x := base(d), x.chunk(3, dim=1)[1].fill_(0)),
    "view_as_real_write": lambda d: (
        z := torch.complex(torch.arange(4.0), torch.ones(4)).to(d),
        torch.view_as_real(z).mul_(2),
        z,
    ),
    "view_as_complex_write": lambda d: (
        r := torch.arange(8.0).reshape(4, 2).to(d),
        torch.view_as_complex(r).mul_(1j),
        r,
    ),
    "dtype_view_same_size": lambda d: _then(x := base(d), x.view(torch.int32).add_(1)),
    "dtype_view_bytes": lambda d: (x := base(d), x.view(torch.uint8)[0, :8] * 1),
    "dtype_view_write_bytes": lambda d: _then(x := base(d), x.view(torch.uint8)[0, 4:8].zero_()),
    "setitem_int": lambda d: _then(x := base(d), x.__setitem__(2, 5.0)),
    "setitem_slice": lambda d: _then(x := base(d), x.__setitem__((slice(1, 3), slice(None)), 5.0)),
    "setitem_step_slice_tensor": lambda d: _then(
        x := base(d), x.__setitem__((slice(None), slice(0, 6, 2)), torch.full((4, 3), -2.0).to(d))
    ),
    "setitem_mask_scalar": lambda d: _then(x := base(d), x.__setitem__(x > 10, 0.0)),
    "setitem_mask_values": lambda d: _then(x := base(d), x.__setitem__(x > 10, torch.arange(13.0).to(d))),
    "setitem_row_mask": lambda d: _then(
        x := base(d), x.__setitem__(torch.tensor([True, False, True, False]).to(d), 3.0)
    ),
    "setitem_index_tensor": lambda d: _then(x := base(d), x.__setitem__(torch.tensor([0, 2]).to(d), -1.0)),
    "setitem_index_on_view": lambda d: _then(x := base(d), x.t().__setitem__(torch.tensor([1, 3]).to(d), 8.0)),
    "setitem_two_index_tensors": lambda d: _then(
        x := base(d), x.__setitem__((torch.tensor([0, 3]).to(d), torch.tensor([5, 1]).to(d)), 42.0)
    ),
    "index_put_accumulate": lambda d: base(d).index_put_(
        (torch.tensor([0, 0, 1]).to(d),), torch.ones(3, 6).to(d), accumulate=True
    ),
    "getitem_mask": lambda d: base(d)[base(d) > 10],
    "getitem_index_tensor": lambda d: base(d)[torch.tensor([3, 0, 3]).to(d)],
    "getitem_mask_and_slice": lambda d: base(d)[torch.tensor([True, False, True, False]).to(d), 2:4],
    "view_sees_later_write": lambda d: (x := base(d), v := x[1], x.add_(1000), v * 1),
    "write_through_two_views": lambda d: _then(x := base(d), x[0:2].add_(1), x[1:3].mul_(2)),
    "inplace_with_self_overlap_read": lambda d: _then(x := base(d), x[1].add_(x[0])),
    "copy_between_views": lambda d: _then(x := base(d), x[0].copy_(x[3])),
    "copy_broadcast_into_view": lambda d: _then(x := base(d), x[:, 1:3].copy_(torch.tensor([7.0, 8.0]).to(d))),
    "copy_cast_into_view": lambda d: _then(x := base(d), x[2].copy_(torch.arange(6).to(d))),
    "noncontiguous_input_to_op": lambda d: base(d).t()[1:3] @ base(d)[:, :2],
    "elementwise_on_transposed_keeps_strides": lambda d: base(d).t() + 1,
    "int_tensor_views": lambda d: _then(x := base(d, torch.int64), x[:, ::2].add_(7)),
    "bool_tensor_view": lambda d: _then(x := (base(d) > 5), x[0].fill_(True)),
    "as_strided_overlapping_read": lambda d: base(d).view(-1).as_strided((3, 4), (2, 1), 1) * 1,
    "as_strided_write": lambda d: _then(x := base(d), x.as_strided((2, 2), (6, 1), 3).fill_(-5)),
    "resize_grow_keeps_values": lambda d: (x := torch.arange(4.0).to(d), x.resize_(6), x[:4]),
    "zero_size_view": lambda d: (x := base(d), x[2:2].add_(1), x),
    "scalar_view_item": lambda d: (x := base(d), x[1, 2].add_(0.5), x),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_view_case(name):
    expected = CASES[name]("cpu")
    got = CASES[name]("jax")
    if name == "resize_grow_keeps_values":  # the grown tail is uninitialized memory on CPU
        got, expected = got[-1], expected[-1]
    assert_same(_tensors(got), _tensors(expected))


def _tensors(result):
    if isinstance(result, torch.Tensor):
        return result
    return [r for r in result if isinstance(r, torch.Tensor)]


def test_view_metadata_matches_cpu():
    for d in ("cpu", "jax"):
        x = torch.zeros(4, 6, device=d)
        v = x.t()[1:3]
        assert v._base is x
        assert v.is_contiguous() is False
    c, j = base("cpu"), base("jax")
    for fn in (lambda x: x[1], lambda x: x.t(), lambda x: x[:, 1::2], lambda x: x.diagonal(), lambda x: x.view(2, 12)):
        vc, vj = fn(c), fn(j)
        assert (vj.shape, vj.stride(), vj.storage_offset(), vj.is_contiguous()) == (
            vc.shape,
            vc.stride(),
            vc.storage_offset(),
            vc.is_contiguous(),
        )
        assert vj.data_ptr() - j.data_ptr() == vc.data_ptr() - c.data_ptr()
        assert vj.untyped_storage().nbytes() == vc.untyped_storage().nbytes() == 96


def test_version_counter_counts_writes_through_views():
    x = base("jax")
    v = x[1]
    assert x._version == 0
    v.add_(1)
    assert x._version == 1 and v._version == 1
    x.mul_(2)
    assert v._version == 2


def test_data_ptr_unique_per_storage_and_shared_by_views():
    tensors = [torch.zeros(8, device="jax") for _ in range(50)]
    ptrs = {t.data_ptr() for t in tensors}
    assert len(ptrs) == 50
    x = tensors[0]
    assert x[2:].data_ptr() == x.data_ptr() + 2 * 4
    assert x.view(2, 4).untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    # address ranges of live storages never overlap (aliasing checks compare them)
    spans = sorted((t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) for t in tensors)
    for (a, n), (b, _) in zip(spans, spans[1:]):
        assert a + n <= b


def test_autograd_through_inplace_on_view():
    def run(d):
        w = torch.arange(6.0, requires_grad=True)
        x = w.to(d) * 1
        x[1:4].mul_(3)  # CopySlices
        x.view(2, 3)[:, 0].exp_()
        (x * torch.arange(6.0).to(d)).sum().backward()
        return w.grad

    assert torch.allclose(run("jax"), run("cpu"))


def test_autograd_through_views_of_leaf():
    def run(d):
        w = torch.arange(12.0).reshape(3, 4).to(d).requires_grad_()
        y = (w.t()[1:3] ** 2).sum() + w.diagonal().sum() + w[:, ::2].exp().sum()
        y.backward()
        return w.grad

    assert torch.allclose(run("jax").cpu(), run("cpu"))


def test_contiguous_whole_storage_takes_fast_path():
    """A tensor that is its whole storage is read without any gather: the storage's
    array is passed to the computation as it is (the op's key has no view in it)."""
    from torch_jax.runtime import _executor

    x = torch.randn(64, 32, device="jax")
    key = []
    desc, _ = _executor._describe(x, key, -1)
    assert desc[0] != "v", desc
    desc, _ = _executor._describe(x.t(), [], -1)
    assert desc[0] == "v"


@pytest.mark.parametrize(
    "size, stride, offset",
    [((4, 6), (6, 1), 1), ((5, 5), (1, 5), 0), ((2, 2), (6, 1), 19), ((0, 9), (100, 100), 3), ((), (), 23)],
)
def test_as_strided_bounds_as_on_cpu(size, stride, offset):
    """as_strided past the end of the storage raises the CPU's error; a view that fits
    (an empty one anywhere) does not."""
    cpu = base("cpu")
    try:
        expected = cpu.as_strided(size, stride, offset)
    except RuntimeError as e:
        with pytest.raises(RuntimeError, match="out of bounds for storage") as got:
            base("jax").as_strided(size, stride, offset)
        assert str(got.value) == str(e)
        return
    assert_same(base("jax").as_strided(size, stride, offset), expected)


def _offset_views(x):
    """Views at storage offsets of a (4, 6, 10) tensor: slices of its nested shape, and
    (the last two) views that cross its rows, which read through a window."""
    flat = x.flatten()
    return [
        x[1],
        x[:, 2],
        x[..., 3:7],
        *x.split(3, dim=2),
        x[2:, 1:, ::2],
        x[1, :, 2:].t(),
        flat.as_strided((3, 4), (10, 1), 5),
        flat.as_strided((2, 5), (60, 2), 3),
        flat.as_strided((3, 4), (10, 1), 7),
        flat.as_strided((2, 5), (60, 2), 57),
    ]


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_views_at_offsets_read_as_on_cpu(mode):
    """NOTE [Views as slices of the storage's nested shape]: the ops' keys say which
    views are one slice at their offset; both kinds read the CPU's values."""
    import torch_jax
    from torch_jax.tensor import _strided

    cpu = torch.arange(240, dtype=torch.float32).reshape(4, 6, 10)
    slices = [_strided.slices_at(240, v.shape, v.stride(), v.storage_offset()) for v in _offset_views(cpu)]
    assert slices == [True] * 11 + [False, False], slices
    torch_jax.set_mode(mode)
    try:
        got = [v * 2 for v in _offset_views(cpu.to("jax"))]
    finally:
        torch_jax.set_mode("strict")
    for g, v in zip(got, _offset_views(cpu)):
        assert_same(g, v * 2)


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_writes_through_views_at_offsets_as_on_cpu(mode):
    import torch_jax

    def program(device):
        x = torch.arange(240, dtype=torch.float32).reshape(4, 6, 10).to(device)
        for i, v in enumerate(_offset_views(x)):
            v.mul_(-1).add_(1000 * i)
        return x

    torch_jax.set_mode(mode)
    try:
        got = program("jax")
    finally:
        torch_jax.set_mode("strict")
    assert_same(got, program("cpu"))
