"""The ops of AOTAutograd's graphs that the eager lowering table does not hold: views,
and the factories and copies that eager mode reaches through other ops.

NOTE [Views in compiled graphs]: eager mode never lowers a view: PyTorch's Meta kernel
gives the view's sizes, strides and offset, and the view shares its base's storage box
(NOTE [Strict eager] in runtime/_executor). A graph from AOTAutograd is functional (its
input mutations are ``copy_`` nodes at the end, NOTE [Input mutations in compiled
graphs] in compile/_graph), so inside one XLA computation a view is just the value it
shows: ``view`` is a reshape, ``t`` a transpose, ``expand`` a broadcast, ``slice`` a
strided slice. Which outputs alias which inputs is AOTAutograd's business: its runtime
wrapper makes output views of inputs again from the real input tensors.

Each rule takes the node's arguments in schema order (tensors as JAX arrays of their
logical shape, other arguments as Python values, sizes already concrete) and the node's
``meta["val"]`` (the fake result: its dtype), and returns the value.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from torch_jax.tensor import _dtypes

aten = torch.ops.aten
RULES: dict = {}


def rule(*ops):
    def deco(fn):
        for op in ops:
            if op is not None:
                RULES[op] = fn
        return fn

    return deco


def _dim(d: int, ndim: int) -> int:
    return d + max(ndim, 1) if d < 0 else d


def _np_dtype(val):
    return _dtypes.TO_NP[val.dtype]


@rule(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view_copy.default)
def _view(val, x, size):
    return jnp.reshape(x, tuple(size))


@rule(aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default, aten.lift_fresh.default)
def _alias(val, x):
    return x


@rule(aten.t.default)
def _t(val, x):
    return x.T if x.ndim == 2 else x


@rule(aten.transpose.int)
def _transpose(val, x, dim0, dim1):
    if x.ndim == 0:
        return x
    return jnp.swapaxes(x, _dim(dim0, x.ndim), _dim(dim1, x.ndim))


@rule(aten.permute.default)
def _permute(val, x, dims):
    return jnp.transpose(x, [_dim(d, x.ndim) for d in dims]) if x.ndim else x


@rule(aten.expand.default, aten.expand_copy.default)
def _expand(val, x, size, implicit=False):
    lead = len(size) - x.ndim
    shape = tuple(x.shape[i - lead] if s == -1 else s for i, s in enumerate(size))
    return jnp.broadcast_to(x, shape)


@rule(aten.unsqueeze.default)
def _unsqueeze(val, x, dim):
    return jnp.expand_dims(x, _dim(dim, x.ndim + 1))


@rule(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims)
def _squeeze(val, x, dim=None):
    if x.ndim == 0:
        return x
    dims = range(x.ndim) if dim is None else [dim] if isinstance(dim, int) else dim
    axes = tuple(d for d in (_dim(d, x.ndim) for d in dims) if x.shape[d] == 1)
    return jnp.squeeze(x, axes) if axes else x


@rule(aten.slice.Tensor, aten.slice_copy.Tensor)
def _slice(val, x, dim=0, start=None, end=None, step=1):
    d = _dim(dim, x.ndim)
    n = x.shape[d]
    start, end, _ = slice(start, end, 1).indices(n)
    end = max(end, start)
    return lax.slice_in_dim(x, start, end, step, axis=d)


@rule(aten.select.int, aten.select_copy.int)
def _select(val, x, dim, index):
    d = _dim(dim, x.ndim)
    index = index + x.shape[d] if index < 0 else index
    return lax.index_in_dim(x, index, d, keepdims=False)


@rule(aten.narrow.default)
def _narrow(val, x, dim, start, length):
    d = _dim(dim, x.ndim)
    start = start + x.shape[d] if start < 0 else start
    return lax.slice_in_dim(x, start, start + length, axis=d)


@rule(aten.split.Tensor, aten.split_copy.Tensor)
def _split(val, x, split_size, dim=0):
    d = _dim(dim, x.ndim)
    n = x.shape[d]
    sizes = [min(split_size, n - i) for i in range(0, n, split_size)] if split_size else [n]
    return _split_sizes(val, x, sizes or [0], dim)


@rule(aten.split_with_sizes.default, aten.split_with_sizes_copy.default)
def _split_sizes(val, x, split_sizes, dim=0):
    d = _dim(dim, x.ndim)
    out, start = [], 0
    for s in split_sizes:
        out.append(lax.slice_in_dim(x, start, start + s, axis=d))
        start += s
    return out


@rule(aten.unbind.int, aten.unbind_copy.int)
def _unbind(val, x, dim=0):
    d = _dim(dim, x.ndim)
    return [lax.index_in_dim(x, i, d, keepdims=False) for i in range(x.shape[d])]


@rule(aten.diagonal.default, aten.diagonal_copy.default)
def _diagonal(val, x, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(x, offset, _dim(dim1, x.ndim), _dim(dim2, x.ndim))


@rule(aten.unfold.default)
def _unfold(val, x, dim, size, step):
    d = _dim(dim, x.ndim)
    if x.ndim == 0:
        return jnp.reshape(x, (1,))
    count = (x.shape[d] - size) // step + 1
    starts = np.arange(count) * step
    windows = jnp.take(x, (starts[:, None] + np.arange(size)[None, :]).reshape(-1), axis=d)
    shape = x.shape[:d] + (count, size) + x.shape[d + 1 :]
    return jnp.moveaxis(windows.reshape(shape), d + 1, -1)


@rule(aten.view_as_real.default)
def _view_as_real(val, x):
    return jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)


@rule(aten.view_as_complex.default)
def _view_as_complex(val, x):
    return lax.complex(x[..., 0], x[..., 1])


@rule(aten.view.dtype)
def _view_dtype(val, x, dtype):
    target = _np_dtype(val)
    if target.itemsize == x.dtype.itemsize:
        return lax.bitcast_convert_type(x, target)
    if target.itemsize < x.dtype.itemsize:  # each element becomes several along the last dim
        out = lax.bitcast_convert_type(x, target)
        return out.reshape(x.shape[:-1] + (-1,))
    ratio = target.itemsize // x.dtype.itemsize
    return lax.bitcast_convert_type(x.reshape(x.shape[:-1] + (-1, ratio)), target)


@rule(aten.as_strided.default, aten.as_strided_copy.default)
def _as_strided(val, x, size, stride, storage_offset=None):
    """A strided read of ``x``'s elements in row-major order (a graph's value is dense):
    right for an ``as_strided`` of a contiguous base, which is what AOTAutograd emits
    when it cannot replay a view (compile/_graph checks the base is contiguous)."""
    flat = jnp.reshape(x, (-1,))
    offset = storage_offset or 0
    if not size:
        return flat[offset]
    index = np.full((), offset, np.int64)
    for n, s in zip(size, stride):
        index = index[..., None] + np.arange(n) * s
    return flat[index]


@rule(aten.full_like.default)
def _full_like(val, x, fill_value, *rest):
    return jnp.full(x.shape, fill_value, _np_dtype(val))


@rule(aten.empty_like.default, aten.zeros_like.default, aten.new_empty.default, aten.new_zeros.default)
def _zeros_like(val, x, *rest):
    return jnp.zeros(tuple(val.shape) if not _symbolic(val) else _shape_arg(x, rest), _np_dtype(val))


@rule(aten.ones_like.default, aten.new_ones.default)
def _ones_like(val, x, *rest):
    return jnp.ones(tuple(val.shape) if not _symbolic(val) else _shape_arg(x, rest), _np_dtype(val))


@rule(aten.empty.memory_format, aten.zeros.default)
def _zeros(val, size, *rest):
    return jnp.zeros(tuple(size), _np_dtype(val))


@rule(aten.empty_strided.default)
def _empty_strided(val, size, stride, *rest):
    return jnp.zeros(tuple(size), _np_dtype(val))


@rule(aten.ones.default)
def _ones(val, size, *rest):
    return jnp.ones(tuple(size), _np_dtype(val))


def _symbolic(val) -> bool:
    return any(not isinstance(s, int) for s in val.shape)


def _shape_arg(x, rest):
    """The size a ``new_*`` op takes (its first argument after self), else ``x``'s shape."""
    if rest and isinstance(rest[0], (list, tuple)):
        return tuple(rest[0])
    return x.shape


@rule(aten._assert_scalar.default)
def _assert_scalar(val, cond, assert_msg):
    # ``torch._check`` on sizes (dynamic shapes) leaves this in the graph. Sizes arrive as
    # ints (NOTE [Compiled graphs]), so the condition is a Python bool here and the call
    # raises the CPU's error before the computation runs, as eager's kernel does; only a
    # condition on a value read from a tensor would be traced, and the graphs that read
    # one (``_local_scalar_dense``) run op by op. (NOTE [Asserts are value checks] in
    # ops/_asserts: ``_assert_async`` on a tensor is a lowering, checked after the graph.)
    if not isinstance(cond, (bool, int, float, np.bool_)):
        from torch_jax.compile._graph import Unsupported

        raise Unsupported("aten._assert_scalar of a value read from a tensor")
    if not cond:
        raise RuntimeError(assert_msg)
