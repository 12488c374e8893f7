"""Buckets: tensors whose length keeps growing live in arrays of a few sizes.

NOTE [Buckets]: XLA compiles for fixed shapes, so an op whose inputs grow by one position
a step (a KV cache, generated ids) compiles again every step (NOTE [Shapes that keep
changing] in runtime/_recompiles). An op that knows buckets instead writes its result
into an array of a bucket's size, a power of two (16 at least), holding the tensor's
logical length as a run-time number: the storage's box then holds a
``_storage.Padded`` (the array, the logical shape, the padded dim), and the next call
of such an op takes the array and the length as they are, so every length within a
bucket runs the same compiled computation. What lies past the length is not part of
the tensor: it is filled with NaN (or the dtype's largest value), so that a rule that
read it would show, and every op that does not know buckets reads the storage through
``_storage.array``, which cuts the array to its logical shape first (on XLA:CPU a host
copy, nothing to compile per length).

The ops that know buckets, each only where its rule provably gives the same result:

- ``cat`` along the padded dim: the first input may be padded, the others are plain;
  each is written at its (run-time) offset into the output's bucket. Only for inputs
  of one dtype, contiguous, none a legacy empty 1-D tensor.
- scaled dot-product attention (the fused-attention op PyTorch gives PrivateUse1) with
  keys and values padded along their sequence dim: the positions past the length are
  masked out of the scores (-inf, so exp gives exactly 0 and the row's maximum and sum
  are those of the valid positions) and the values there are zeroed before the
  product, so only the valid positions contribute. Not with an attention mask or
  dropout (dropout's random mask is drawn for the scores' shape).
- the ops of a training step over variable-length batches, which get their padded
  tensors from the host: NOTE [Padded rows] below.

A host transfer (``.cpu()``, ``.item()``) cuts on the host and leaves the storage in
its bucket. An op's result is bucketed when an input already is, or once calls of the same shapes
but the growing length have taken 8 lengths, so a fixed-shape program never sees one;
``config.bucketing`` is ``"auto"`` (that), ``"off"``, or ``"force"`` (every call a rule
applies to, used by the tests to prove the rules on PyTorch's own samples). Values are
the same as without buckets up to float rounding: a product over a padded length sums
the same terms plus exact zeros, in the order XLA picks for the bucket's size.
"""

from __future__ import annotations

import math

import torch

from torch_jax._config import config
from torch_jax.ops._context import PaddedValue
from torch_jax.runtime import _recompiles
from torch_jax.tensor import _storage

aten = torch.ops.aten
_Padded = _storage.Padded
_MIN = 16


def size(n: int) -> int:
    """The bucket of a length: the next power of two, at least 16."""
    return max(_MIN, 1 << max(n - 1, 0).bit_length())


def _padded_box(t):
    """The storage box of ``t``, a jax tensor, when the storage is in a bucket; else None."""
    if not isinstance(t, torch.Tensor) or t.is_cpu:
        return None
    try:
        box = t.untyped_storage()._box
    except AttributeError:
        return None
    return box if box.arr.__class__ is _Padded else None


def _padded(t):
    """``t``'s padded storage, where ``t`` is all of it (whole, contiguous, its dtype,
    no conjugate or negative bit); else None."""
    box = _padded_box(t)
    if box is None:
        return None
    arr = box.arr
    if t.dtype is not box.dtype or tuple(t.shape) != arr.shape or t.storage_offset() or not t.is_contiguous():
        return None
    if t.is_conj() or t.is_neg():
        return None
    return arr


def view_in_bucket(t, padded, box_dtype):
    """The strides and offset of ``t``, a view of a padded storage, in the bucket's array,
    or None: a view whose dims each step along a different dim of the logical tensor
    and stay within it (a row, a column, the last position, the whole tensor) is the
    same block of the bucket's array, so ops read it there, and the storage stays in its
    bucket (NOTE [Buckets])."""
    if t.dtype is not box_dtype or t.is_conj() or t.is_neg() or t.numel() == 0:
        return None
    shape, bucket = padded.shape, padded.arr.shape
    logical, physical = _storage.contiguous_strides(shape), _storage.contiguous_strides(bucket)
    rest, at = t.storage_offset(), []
    for st in logical:
        q, rest = divmod(rest, st)
        at.append(q)
    strides, used = [], set()
    for n, st in zip(t.shape, t.stride()):
        if n == 1 or st == 0:
            strides.append(0)
            continue
        k = next((k for k, (m, lst) in enumerate(zip(shape, logical)) if lst == st and m > 1), None)
        if k is None or k in used or at[k] + n > shape[k]:
            return None
        used.add(k)
        strides.append(physical[k])
    return strides, sum(i * st for i, st in zip(at, physical))


_THRESHOLD = _recompiles.THRESHOLD  # lengths a call site takes before its results go into buckets
_lengths: dict = {}  # a call's shape with the growing dim left out -> the lengths it took


def _wanted(signature, length: int, padded_input: bool, threshold: int = _THRESHOLD) -> bool:
    """Whether a result goes into a bucket: always when forced, and otherwise when an
    input is in one already or calls of this ``signature`` (the op and its shapes but
    the growing length) have taken ``_THRESHOLD`` lengths, so a fixed-shape program
    never sees a bucket."""
    mode = config.bucketing
    if mode == "force" or padded_input:
        return True
    seen = _lengths.get(signature)
    if seen is None:
        if len(_lengths) > _recompiles.MAX_NOTES:
            _lengths.clear()
        seen = _lengths[signature] = set()
    if len(seen) < threshold:
        seen.add(length)
    return len(seen) >= threshold


def _cat(args):
    tensors = args[0]
    dim = args[1] if len(args) > 1 else 0
    if len(tensors) < 2:
        return None
    first = tensors[0]
    shape = first.shape
    ndim = len(shape)
    if ndim == 0 or not -ndim <= dim < ndim:
        return None
    d = dim % ndim
    total = 0
    for t in tensors:
        if t.dim() != ndim:
            return None
        total += t.shape[d]
    padded = _padded(first)
    if padded is not None and padded.dim != d:
        padded = None
    # (first the cheap question, which a fixed-shape program answers no; then the rule's
    # conditions)
    if not _wanted((d, shape[:d] + shape[d + 1 :], len(tensors), first.dtype), total, padded is not None):
        return None
    for t in tensors:
        if t.is_cpu or t.dtype is not first.dtype or (ndim == 1 and t.shape[0] == 0):
            return None
        if t.shape[:d] != shape[:d] or t.shape[d + 1 :] != shape[d + 1 :]:
            return None
        if not t.is_contiguous():  # (the result's layout follows its inputs': a bucket is row-major)
            return None
    if padded is not None and total <= padded.arr.shape[d]:
        bucket = padded.arr.shape[d]
    else:
        bucket = size(total)
    return ("cat", d, bucket), {(0, 0): True} if padded is not None else {}


def _attention(args):
    q, k, v = args[:3]
    bias = args[3] if len(args) > 3 else None
    dropout = args[4] if len(args) > 4 else 0.0
    if bias is not None or dropout or k.dim() != v.dim() or k.dim() < 2:
        return None
    d = k.dim() - 2
    pk, pv = _padded(k), _padded(v)
    both = pk is not None and pv is not None and pk.dim == pv.dim == d and pk.arr.shape[d] == pv.arr.shape[d]
    if both and k.shape[d] == v.shape[d]:
        return ("attention", d, pk.arr.shape[d]), {(1, None): True, (2, None): True}
    if config.bucketing == "force" and k.shape[d] == v.shape[d] and k.shape[d] > 0:
        return ("attention", d, size(k.shape[d])), {}
    return None


PLANS = {
    aten.cat.default: _cat,
    aten._scaled_dot_product_fused_attention_overrideable.default: _attention,
}


def plan(spec, args):
    """How a call of a bucket-aware op runs (a hashable plan the lowering reads, and what
    it takes in its bucket: {(argument, list item): True for the whole storage, or the
    argument's ``Layout``}), or None for the plain path."""
    if config.bucketing == "off":
        return None
    return PLANS[spec.op](args)


# ---------------------------------------------------------------- ops over padded rows
#
# NOTE [Padded rows]: a batch whose length changes every step (the token ids of dynamic
# padding) comes from the host, and from then on every op of the step sees it: an
# embedding, the Linear layers (a view merges batch and length into the rows of a
# matrix product), activations, log-softmax, the loss, and all of their backward ops.
# So a host tensor whose length keeps changing is uploaded into a bucket (the host pads
# it: nothing to compile), and the ops below take such tensors, and views that merge
# the padded dim with others, in the bucket, each by one of two rules:
#
# - rows: the op computes each position of the padded dim from that position alone
#   (pointwise ops, softmax over another dim, a matrix product's rows, an embedding's
#   lookup, a sum over other dims); it runs on the whole bucket and its result is in
#   the same bucket, what lies past the length being garbage nobody reads as the
#   tensor's;
# - reduce: the op combines positions of the padded dim (a sum over it, the
#   contraction of a matrix product, the weight gradient of an embedding, a loss's
#   mean); what lies past the length is first replaced by a value that adds nothing
#   (0 for sums and products, ``ignore_index`` for a loss's targets, so the mean
#   divides by the valid count), and the result is plain.
#
# A view that merges the padded dim with the dims around it (``(2, n, 32) -> (2n, 32)``)
# reads the bucket as ``(2, B, 32) -> (2B, 32)``: its valid rows are blocks of ``n``
# every ``B`` (``PaddedValue.period``), and a result of such rows is stored as
# ``(2, B, 64)`` again. Every operand of one call must lie the same way (the same
# blocks, the same length); anything else takes the plain path, where the storage is
# cut to its length.

active = False  # whether any upload has gone into a bucket (until then no op looks)


class Layout:
    """Where a tensor lies in its storage's bucket: read the bucket's array with
    ``size`` and ``stride`` (offset 0) and reshape to ``shape`` (the tensor's shape, the
    padded dim at bucket size); along ``dim`` blocks of ``period`` steps of ``inner``
    elements, the first ``length`` steps of each the tensor's."""

    __slots__ = ("size", "stride", "shape", "dim", "period", "inner", "length")

    def __init__(self, size, stride, shape, dim, period, inner, length):
        self.size, self.stride, self.shape = size, stride, shape
        self.dim, self.period, self.inner, self.length = dim, period, inner, length

    def rows(self):
        """What two operands must share to combine position by position along their padded dims."""
        return self.shape[self.dim], self.period, self.inner, self.length


def in_bucket(t):
    """``t``'s ``Layout`` when it is a view at offset 0 of a padded storage that covers the
    storage's whole length (its padded dim, alone or merged with neighbours, is one of
    ``t``'s dims); None when ``t`` is not a jax tensor of a padded storage; False when it
    is one but not such a view (a plan then takes the plain path: reading the storage
    cut to its length would take it out of its bucket under the other operands)."""
    box = _padded_box(t)
    if box is None:
        return None
    padded = box.arr
    if t.dtype is not box.dtype or t.storage_offset() or t.numel() == 0 or t.is_conj() or t.is_neg():
        return False
    shape, bucket, d = padded.shape, padded.arr.shape, padded.dim
    logical, physical = _storage.contiguous_strides(shape), _storage.contiguous_strides(bucket)
    size, stride, merged = [], [], list(t.shape)
    dim = period = inner = None
    used = set()
    for i, (n, st) in enumerate(zip(t.shape, t.stride())):
        if n == 1 or st == 0:
            size.append(n)
            stride.append(0)
            continue
        # the logical dims k..j this dim steps through: j's stride is st, sizes multiply to n
        j = next((j for j, (m, lst) in enumerate(zip(shape, logical)) if lst == st and m > 1), None)
        if j is None:
            return False
        k, total = j, shape[j]
        while total < n and k > 0:
            k -= 1
            total *= shape[k]
        group = range(k, j + 1)
        if used.intersection(group):
            return False
        used.update(group)
        if k == j and j != d:
            if n > shape[j]:
                return False
            size.append(n)
            stride.append(physical[j])
            continue
        if total != n:
            return False
        if d not in group:  # (dims the bucket does not change merge there as well)
            size.append(n)
            stride.append(physical[j])
            continue
        size.extend(bucket[g] for g in group)
        stride.extend(physical[g] for g in group)
        merged[i] = math.prod(bucket[g] for g in group)
        dim, period, inner = i, bucket[d], math.prod(bucket[d + 1 : j + 1])
    if dim is None:
        return False
    return Layout(tuple(size), tuple(stride), tuple(merged), dim, period, inner, padded.length)


def upload_dim(shape: tuple, dtype) -> int | None:
    """The dim along which a host tensor being uploaded goes into a bucket, or None:
    the dim whose length keeps changing between uploads of otherwise equal shapes
    (``_THRESHOLD`` lengths; ``_IDS_THRESHOLD`` for integer tensors, the token ids and
    labels of dynamic padding, which models do not hold as parameters), or every
    upload's ``force_dim`` when bucketing is forced."""
    mode = config.bucketing
    if mode == "off" or not shape or 0 in shape:
        return None
    if mode == "force":
        return None if force_dim is None else force_dim % len(shape)
    threshold = _THRESHOLD if dtype.is_floating_point or dtype.is_complex else _IDS_THRESHOLD
    for d, n in enumerate(shape):
        signature = ("upload", d, shape[:d] + shape[d + 1 :], dtype)
        if _wanted(signature, n, False, threshold):
            if signature not in _announced:
                if len(_announced) > _recompiles.MAX_NOTES:
                    _announced.clear()
                _announced.add(signature)
                _recompiles.note_bucketing(shape, d, _lengths.get(signature, ()))
            return d
    return None


_announced: set = set()  # the upload signatures whose bucketing the user was told of


_IDS_THRESHOLD = 3


force_dim = 0  # the dim forced bucketing pads uploads along, or None (the tests try each)


def _tensor_args(spec, args):
    for pos in spec.tensor_args:
        a = args[pos]
        if a is not None:
            yield pos, a


def _rows_plan(spec, args):
    """Pointwise ops (``torch.Tag.pointwise``): every padded operand lies the same way
    and has the result's shape, every other one broadcasts along the padded dim. Past
    the length each operand repeats its first position, so a value check of the op
    (integer division by zero) fails on the padding only where it fails on the tensor."""
    layout, fills, plain = None, [], []
    for pos, a in _tensor_args(spec, args):
        if not isinstance(a, torch.Tensor):
            continue
        lay = in_bucket(a)
        if lay is False:
            return None
        if lay is None:
            if not a.is_cpu:
                plain.append(a)
            continue
        if not a.is_contiguous() or (layout is not None and (lay.shape != layout.shape or lay.rows() != layout.rows())):
            return None
        layout = lay
        fills.append((pos, lay))
    if layout is None:
        return None
    nd = len(layout.shape)
    for a in plain:
        if a.dim() > nd or not a.is_contiguous():
            return None
        at = layout.dim - (nd - a.dim())
        if at >= 0 and a.shape[at] != 1:
            return None
    return _plan_of(fills, {pos: REPEAT for pos, _ in fills}, ((0, layout.dim),))


REPEAT = "repeat"  # a fill: each position past the length holds its block's first (PaddedValue.repeated)


def _plan_of(operands, fill, outs):
    """A plan: ``operands`` (position, Layout) read in the bucket, each filled past its
    length with ``fill`` (a dict position -> value, or None: left as it is) before the
    op; ``outs``: (result, dim) of the results in the bucket."""
    fills = tuple((pos, None if fill is None else fill.get(pos)) for pos, _ in operands)
    return ("padded", fills, tuple(outs)), {(pos, None): lay for pos, lay in operands}


def _matmul_plan(a, b, at: int):
    """mm's (at 0) or addmm's (at 1) operands ``a @ b``: a's rows padded (the result's
    rows are), b's columns padded (the result's columns are), or the contracted dim
    padded in both (zeros there add nothing)."""
    la, lb = in_bucket(a), in_bucket(b)
    if la is False or lb is False:
        return None
    if la is not None and lb is None and la.dim == 0:
        return _plan_of([(at, la)], None, ((0, 0),))
    if la is None and lb is not None and lb.dim == 1:
        return _plan_of([(at + 1, lb)], None, ((0, 1),))
    if la is not None and lb is not None and la.dim == 1 and lb.dim == 0 and la.rows() == lb.rows():
        return _plan_of([(at, la), (at + 1, lb)], {at: 0, at + 1: 0}, ())
    return None


def _mm(spec, args):
    return _matmul_plan(args[0], args[1], 0)


def _addmm(spec, args):
    bias = args[0]
    planned = _matmul_plan(args[1], args[2], 1)
    if planned is None or not isinstance(bias, torch.Tensor) or in_bucket(bias) is not None:
        return None
    outs = planned[0][2]
    if outs:  # the bias broadcasts along the result's padded dim
        d = outs[0][1] - (2 - bias.dim())
        if d >= 0 and bias.shape[d] != 1:
            return None
    return planned


def _softmax(spec, args):
    """(log-)softmax over a dim that is not the padded one, and their backward."""
    grads = spec.op in (aten._softmax_backward_data.default, aten._log_softmax_backward_data.default)
    first = in_bucket(args[0])
    if not first or not args[0].is_contiguous():
        return None
    operands = [(0, first)]
    if grads:
        second = in_bucket(args[1])
        if not second or not args[1].is_contiguous() or second.shape != first.shape or second.rows() != first.rows():
            return None
        operands.append((1, second))
    if args[2 if grads else 1] % len(first.shape) == first.dim:
        return None
    return _plan_of(operands, None, ((0, first.dim),))


def _same_rows(*layouts):
    return all(lay and lay.dim == 0 and lay.rows() == layouts[0].rows() for lay in layouts)


def _nll_loss(spec, args):
    """nll_loss over padded rows: the targets past the length are ``ignore_index``, so
    they add nothing and the mean divides by the valid rows alone."""
    backward = spec.op is aten.nll_loss_backward.default
    at = 1 if backward else 0
    x, target = args[at], args[at + 1]
    weight, reduction, ignore = args[at + 2 : at + 5]
    if x.dim() != 2 or (weight is not None and in_bucket(weight) is not None):
        return None
    lx, lt = in_bucket(x), in_bucket(target)
    if not _same_rows(lx, lt):
        return None
    operands, fill = [(at, lx), (at + 1, lt)], {at: 0, at + 1: ignore}
    if backward:
        lg = in_bucket(args[0])
        if reduction == 0:  # (per-row gradients)
            if not _same_rows(lx, lg):
                return None
            operands.append((0, lg))
            fill[0] = 0
        elif lg is not None:
            return None
        return _plan_of(operands, fill, ((0, 0),))
    return _plan_of(operands, fill, ((0, 0),) if reduction == 0 else ())


def _sum(spec, args):
    """A sum over dims: over the padded one (zeros past the length), or over others (rows)."""
    x = args[0]
    lay = in_bucket(x)
    if not lay or not x.is_contiguous():
        return None
    dims = args[1] if len(args) > 1 else None
    keepdim = len(args) > 2 and args[2]
    nd = len(lay.shape)
    dims = list(range(nd)) if not dims else [d % nd for d in dims]
    if lay.dim in dims:
        return _plan_of([(0, lay)], {0: 0}, ())
    dim = lay.dim if keepdim else lay.dim - sum(d < lay.dim for d in dims)
    return _plan_of([(0, lay)], None, ((0, dim),))


def _embedding(spec, args):
    """An embedding's lookup of padded ids (0 past the length: a row that exists)."""
    weight, ids = args[0], args[1]
    lay = in_bucket(ids)
    if not lay or in_bucket(weight) is not None or weight.dim() != 2 or weight.shape[0] == 0:
        return None
    return _plan_of([(1, lay)], {1: 0}, ((0, lay.dim),))


def _embedding_backward(spec, args):
    """The weight gradient of an embedding: the gradients past the length are 0 (and
    their ids a row that exists), so they add nothing. Not with ``scale_grad_by_freq``,
    which would count those ids."""
    grad, ids, _, padding_idx, scale = args
    lg, li = in_bucket(grad), in_bucket(ids)
    if scale or not lg or not li or lg.dim != li.dim or lg.rows() != li.rows():
        return None
    return _plan_of([(0, lg), (1, li)], {0: 0, 1: padding_idx if padding_idx >= 0 else 0}, ())


RULES = {
    aten.mm.default: _mm,
    aten.addmm.default: _addmm,
    aten._softmax.default: _softmax,
    aten._log_softmax.default: _softmax,
    aten._softmax_backward_data.default: _softmax,
    aten._log_softmax_backward_data.default: _softmax,
    aten.nll_loss_forward.default: _nll_loss,
    aten.nll_loss_backward.default: _nll_loss,
    aten.sum.dim_IntList: _sum,
    aten.embedding.default: _embedding,
    aten.embedding_dense_backward.default: _embedding_backward,
}


def rule_of(op):
    """The plan function of an op that takes padded rows (NOTE [Padded rows]), or None."""
    rule = RULES.get(op)
    if rule is None and torch.Tag.pointwise in op.tags:
        rule = _rows_plan
    return rule


def plan_rows(spec, args):
    """``plan`` for the ops of NOTE [Padded rows]: only once an upload went into a bucket
    and some tensor argument is in one."""
    if config.bucketing == "off":
        return None
    return spec.rows_rule(spec, args)


def run_padded(lowering, vals, planned):
    """The lowering of a call planned by NOTE [Padded rows]: fill the padded operands,
    run the op on the buckets, and mark the results that are in one."""
    _, fills, outs = planned
    vals = list(vals)
    first = None
    for pos, fill in fills:
        v = vals[pos]
        first = first or v
        vals[pos] = v.arr if fill is None else v.repeated() if fill == REPEAT else v.filled(fill)
    result = lowering(*vals)
    if not outs:
        return result
    results = list(result) if isinstance(result, (tuple, list)) else [result]
    for i, dim in outs:
        results[i] = PaddedValue(results[i], dim, None, first.period, first.inner)
    return results
