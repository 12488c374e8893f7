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

An op's result is bucketed when an input already is, or once calls of the same shapes
but the growing length have taken 8 lengths, so a fixed-shape program never sees one;
``config.bucketing`` is ``"auto"`` (that), ``"off"``, or ``"force"`` (every call a rule
applies to, used by the tests to prove the rules on PyTorch's own samples). Values are
the same as without buckets up to float rounding: a product over a padded length sums
the same terms plus exact zeros, in the order XLA picks for the bucket's size.
"""

from __future__ import annotations

import torch

from torch_jax._config import config
from torch_jax.runtime import _recompiles
from torch_jax.tensor import _storage

aten = torch.ops.aten
_Padded = _storage.Padded
_MIN = 16


def size(n: int) -> int:
    """The bucket of a length: the next power of two, at least 16."""
    return max(_MIN, 1 << max(n - 1, 0).bit_length())


def _padded(t):
    """``t``'s padded storage, where ``t`` is all of it (whole, contiguous, its dtype,
    no conjugate or negative bit); else None."""
    if not isinstance(t, torch.Tensor) or t.is_cpu:
        return None
    try:
        box = t.untyped_storage()._box
    except AttributeError:
        return None
    arr = box.arr
    if arr.__class__ is not _Padded:
        return None
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


def _wanted(signature, length: int, padded_input: bool) -> bool:
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
    if len(seen) < _THRESHOLD:
        seen.add(length)
    return len(seen) >= _THRESHOLD


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
    return ("cat", d, bucket), {(0, 0)} if padded is not None else set()


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
        return ("attention", d, pk.arr.shape[d]), {(1, None), (2, None)}
    if config.bucketing == "force" and k.shape[d] == v.shape[d] and k.shape[d] > 0:
        return ("attention", d, size(k.shape[d])), set()
    return None


PLANS = {
    aten.cat.default: _cat,
    aten._scaled_dot_product_fused_attention_overrideable.default: _attention,
}


def plan(spec, args):
    """How a call of a bucket-aware op runs (a hashable plan the lowering reads, and the
    (argument, list item) positions it takes padded), or None for the plain path."""
    if config.bucketing == "off":
        return None
    return PLANS[spec.op](args)
