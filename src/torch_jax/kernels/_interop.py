"""JAX arrays and ``jax`` tensors, each as the other, without copies.

NOTE [Tensors and JAX arrays share buffers]: a ``jax`` tensor's storage holds a JAX
array (NOTE [Views share the storage box] in tensor/_storage), so :func:`to_jax` of a
tensor that is its whole storage, contiguous, is that array, and :func:`from_jax`
makes a tensor whose storage holds the given array: no copy either way. A view, a
transposed or a padded tensor is read into a new array first (one computation).

JAX arrays are immutable, so sharing is safe in both directions: an in-place write
to the tensor (``t.add_(1)``) computes a new array and puts it in the storage, and
an array obtained before the write keeps its values (CUDA's ``torch.from_dlpack``
shares memory that both sides write; here neither side sees the other's later
writes). The storage and every holder of the array own it together; donation (a
computation reusing an input's memory for its output, NOTE [Donation] in
runtime/_fused) only takes buffers nothing outside the device holds, so an array
held by JAX code is never donated under it.
"""

from __future__ import annotations

import jax
import torch

from torch_jax.device import _state as _devices
from torch_jax.kernels._jax_op import _cotangent
from torch_jax.runtime import _copy
from torch_jax.tensor import _dtypes, _storage


def to_jax(t: torch.Tensor) -> jax.Array:
    """The JAX array of a ``jax`` tensor's values in its shape: the storage's own array
    when the tensor is its whole storage, contiguous; otherwise a new array (one
    computation). Pending values of fused eager are computed first."""
    if not isinstance(t, torch.Tensor) or t.device.type != "jax":
        where = t.device if isinstance(t, torch.Tensor) else type(t).__name__
        raise TypeError(f'torch_jax.to_jax takes a jax tensor, got {where} (move it with .to("jax"))')
    if t.requires_grad:
        t = t.detach()
    return _copy.logical_array(t, "to_jax")


def from_jax(a: jax.Array, device=None) -> torch.Tensor:
    """A ``jax`` tensor over the JAX array ``a`` (no copy when ``a`` is on one of this
    process's devices; ``device``: put it on another ``jax`` device first)."""
    if not isinstance(a, jax.Array):
        raise TypeError(f"torch_jax.from_jax takes a jax.Array, got {type(a).__name__}")
    devices = a.devices()
    if device is not None:
        index = _devices.index_of(device)
    elif len(devices) == 1 and next(iter(devices)) in _devices._devices:
        index = _devices._devices.index(next(iter(devices)))
    else:
        raise ValueError(
            f"torch_jax.from_jax: the array lies on {sorted(str(d) for d in devices)}; a jax tensor lives "
            "on one of this process's devices: give device= to put it there"
        )
    if devices != {_devices.device(index)}:
        a = jax.device_put(a, _devices.sharding(index))
    return _storage.new_tensor(a.shape, _dtypes.to_torch(a.dtype), index, a)


def call_jax(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with every ``jax`` tensor in the arguments (nested in
    lists, tuples and dicts too) passed as its JAX array, and every JAX array in the
    result returned as a ``jax`` tensor. Autograd flows through ``jax.vjp`` when a
    floating tensor argument requires a gradient. ``fn`` runs at once, as JAX runs it
    (pass a ``jax.jit`` function to compile it); for an op that fused eager records and
    ``torch.compile`` puts inside its graph, use :func:`torch_jax.jax_op`."""
    leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
    where = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    for i in where:
        if leaves[i].device.type != "jax":
            raise TypeError(f"torch_jax.call_jax: argument tensors must be on jax, one is on {leaves[i].device}")
    tensors = [leaves[i] for i in where]
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        out_tree = []
        outs = _CallJax.apply(fn, leaves, where, tree, out_tree, *tensors)
        return jax.tree_util.tree_unflatten(out_tree[0], outs)
    for i, t in zip(where, tensors):
        leaves[i] = to_jax(t)
    a, k = jax.tree_util.tree_unflatten(tree, leaves)
    return jax.tree_util.tree_map(_to_tensor, fn(*a, **k))


def _to_tensor(x):
    return from_jax(x) if isinstance(x, jax.Array) else x


class _CallJax(torch.autograd.Function):
    """``call_jax`` with gradients: ``jax.vjp`` in the forward, its pullback in the
    backward (the outputs: a pytree of arrays)."""

    @staticmethod
    def forward(ctx, fn, leaves, where, tree, out_tree, *tensors):
        arrays = [to_jax(t) for t in tensors]
        grad_at = [i for i, t in enumerate(tensors) if t.requires_grad and (t.is_floating_point() or t.is_complex())]

        def f(*xs):
            filled = list(leaves)
            for i, x in zip(where, arrays):
                filled[i] = x
            for i, x in zip(grad_at, xs):
                filled[where[i]] = x
            a, k = jax.tree_util.tree_unflatten(tree, filled)
            return fn(*a, **k)

        out, ctx.pull = jax.vjp(f, *[arrays[i] for i in grad_at])
        out_leaves, ctx.treedef = jax.tree_util.tree_flatten(out)
        out_tree.append(ctx.treedef)
        ctx.grad_at, ctx.n = grad_at, len(tensors)
        ctx.avals = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in out_leaves]
        outs = tuple(from_jax(x) for x in out_leaves)
        ctx.mark_non_differentiable(*[o for o in outs if not (o.is_floating_point() or o.is_complex())])
        return outs

    @staticmethod
    def backward(ctx, *grads):
        cts = [_cotangent(aval, None if g is None else to_jax(g)) for g, aval in zip(grads, ctx.avals)]
        in_cts = ctx.pull(jax.tree_util.tree_unflatten(ctx.treedef, cts))
        grads_in = [None] * ctx.n
        for i, ct in zip(ctx.grad_at, in_cts):
            grads_in[i] = from_jax(ct)
        return (None, None, None, None, None, *grads_in)
