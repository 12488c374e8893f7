"""Neural-network ops: softmax, losses, normalization, dropout, embedding, attention,
with the backward ops autograd calls for them."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from torch_jax import _compat
from torch_jax.ops import _context
from torch_jax.ops._promote import LOW_PRECISION as _LOW
from torch_jax.ops._promote import opmath
from torch_jax.ops._reductions import axes_except, p_norm
from torch_jax.ops._registry import aten, lower

# ---------------------------------------------------------------- softmax


@lower(aten._softmax.default)
def softmax(x, dim, half_to_float):
    out = _context.out_dtype()
    if x.ndim == 0:  # exp(x - x): NaN for infinite x, as on CPU
        return jnp.exp(opmath(x) - opmath(x)).astype(out)
    return jax.nn.softmax(opmath(x), axis=dim).astype(out)


@lower(aten._log_softmax.default)
def log_softmax(x, dim, half_to_float):
    out = _context.out_dtype()
    if x.ndim == 0:
        return (opmath(x) - opmath(x)).astype(out)
    return jax.nn.log_softmax(opmath(x), axis=dim).astype(out)


@lower(aten._softmax_backward_data.default)
def softmax_backward_data(g, y, dim, input_dtype):
    g32, y32 = opmath(g), opmath(y)
    if y.ndim == 0:
        return jnp.zeros_like(g)
    return (y32 * (g32 - jnp.sum(g32 * y32, axis=dim, keepdims=True))).astype(_context.out_dtype())


@lower(aten._log_softmax_backward_data.default)
def log_softmax_backward_data(g, y, dim, input_dtype):
    g32, y32 = opmath(g), opmath(y)
    if y.ndim == 0:
        return jnp.zeros_like(g)
    return (g32 - jnp.exp(y32) * jnp.sum(g32, axis=dim, keepdims=True)).astype(_context.out_dtype())


# ---------------------------------------------------------------- normalization


def _stats_axes(x, normalized_ndim):
    return tuple(range(x.ndim - normalized_ndim, x.ndim))


# trust_meta=False: the Meta kernel says float32 statistics for float16 inputs, the CPU
# returns them in the input's dtype
@lower(aten.native_layer_norm.default, trust_meta=False)
def native_layer_norm(x, normalized_shape, weight, bias, eps):
    ax = _stats_axes(x, len(normalized_shape))
    xf = opmath(x)
    mean = jnp.mean(xf, axis=ax, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=ax, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    y = (xf - mean) * rstd
    if weight is not None:
        y = y * opmath(weight)
    if bias is not None:
        y = y + opmath(bias)
    return y.astype(x.dtype), mean.astype(x.dtype), rstd.astype(x.dtype)


@lower(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(g, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    ax = _stats_axes(x, len(normalized_shape))
    batch_axes = tuple(range(x.ndim - len(normalized_shape)))
    gf, xf = opmath(g), opmath(x)
    mean, rstd = opmath(mean), opmath(rstd)
    x_hat = (xf - mean) * rstd
    dx_hat = gf * opmath(weight) if weight is not None else gf
    n = 1
    for a in ax:
        n *= x.shape[a]
    grad_input = (
        rstd
        * (dx_hat - jnp.mean(dx_hat, axis=ax, keepdims=True) - x_hat * jnp.mean(dx_hat * x_hat, axis=ax, keepdims=True))
        if n
        else jnp.zeros_like(xf)
    )
    grad_weight = jnp.sum(gf * x_hat, axis=batch_axes) if weight is not None else None
    grad_bias = jnp.sum(gf, axis=batch_axes) if bias is not None else None
    return grad_input, grad_weight, grad_bias


@lower(aten._weight_norm_interface.default)
def weight_norm_interface(v, g, dim):
    """w = v * (g / |v|), the norm over every dim but `dim` (kept, as g's shape; in the
    op math dtype, as the CPU's kernel saves it)."""
    vf = opmath(v)
    norm = jnp.sqrt(jnp.sum(vf * vf, axis=axes_except(v, dim), keepdims=True))
    return (vf * (opmath(g) / norm)).astype(v.dtype), norm


@lower(aten._weight_norm_interface_backward.default)
def weight_norm_interface_backward(grad_w, v, g, norm, dim):
    gw, vf, gf = opmath(grad_w), opmath(v), opmath(g)
    dot = jnp.sum(gw * vf, axis=axes_except(v, dim), keepdims=True)
    grad_v = (gf / norm) * (gw - vf * (dot / (norm * norm)))
    return grad_v.astype(v.dtype), (dot / norm).astype(g.dtype)


def _channel_shape(x):
    return (1, -1) + (1,) * (x.ndim - 2)


def _param_dtype(x, *params):
    """The dtype of batch norm's saved statistics: float32 when a float16/bfloat16 input
    comes with float32 parameters (PyTorch's mixed type), else the input's."""
    if x.dtype in _LOW and any(p is not None and p.dtype == jnp.float32 for p in params):
        return np.dtype(jnp.float32)
    return x.dtype


def _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    axes = (0,) + tuple(range(2, x.ndim))
    xf = opmath(x)
    c = _channel_shape(x)
    if training:
        pdt = _param_dtype(x, weight, bias, running_mean, running_var)
        mean = jnp.mean(xf, axis=axes)
        var = jnp.mean(jnp.square(xf - mean.reshape(c)), axis=axes)
        invstd = lax.rsqrt(var + eps)
        n = x.size // x.shape[1]
        new_mean = new_var = None
        if running_mean is not None:
            new_mean = ((1 - momentum) * opmath(running_mean) + momentum * mean).astype(running_mean.dtype)
        if running_var is not None:
            unbiased = var * (n / max(n - 1, 1))
            new_var = ((1 - momentum) * opmath(running_var) + momentum * unbiased).astype(running_var.dtype)
        # the CPU kernel normalizes with the statistics as saved (rounded to float16 if so)
        mean, invstd = opmath(mean.astype(pdt)), opmath(invstd.astype(pdt))
        save_mean, save_invstd = mean.astype(pdt), invstd.astype(pdt)
    else:
        mean = opmath(running_mean)
        invstd = lax.rsqrt(opmath(running_var) + eps)
        new_mean = new_var = None
        save_mean, save_invstd = mean, invstd
    # x * alpha + beta per channel, the CPU kernel's form (it rounds alike in float16)
    alpha = invstd if weight is None else invstd * opmath(weight)
    beta = -mean * alpha if bias is None else opmath(bias) - mean * alpha
    y = xf * alpha.reshape(c) + beta.reshape(c)
    return y.astype(x.dtype), save_mean, save_invstd, new_mean, new_var


def _empty_stats():
    return jnp.zeros((0,), jnp.float32)


# In eval mode PyTorch's CPU kernels return empty saved statistics (their Meta kernels
# say (C,)): the output shapes come from the lowering.
@lower(aten._native_batch_norm_legit.default, trust_meta=False)
def native_batch_norm_legit(x, weight, bias, running_mean, running_var, training, momentum, eps):
    y, m, s, new_mean, new_var = _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps)
    if not training:
        m = s = _empty_stats().astype(_param_dtype(x, weight, bias, running_mean, running_var))
    return y, m, s, new_mean, new_var


@lower(aten._native_batch_norm_legit.no_stats)
def native_batch_norm_legit_no_stats(x, weight, bias, training, momentum, eps):
    y, m, s, _, _ = _batch_norm(x, weight, bias, None, None, True, momentum, eps)
    return y, m, s


@lower(aten._native_batch_norm_legit_no_training.default, trust_meta=False)
def native_batch_norm_legit_no_training(x, weight, bias, running_mean, running_var, momentum, eps):
    y, _, _, _, _ = _batch_norm(x, weight, bias, running_mean, running_var, False, momentum, eps)
    empty = _empty_stats().astype(_param_dtype(x, weight, bias, running_mean, running_var))
    return y, empty, empty


# trust_meta=False: its Meta kernel says float32 statistics for float16 inputs where the
# CPU saves them in float16
@lower(aten._batch_norm_with_update.default, trust_meta=False)
def batch_norm_with_update(x, weight, bias, running_mean, running_var, momentum, eps):
    """Training-mode batch norm; returns the output, the saved statistics, an empty
    reserve, then the new running_mean and running_var (its written arguments)."""
    y, m, s, new_mean, new_var = _batch_norm(x, weight, bias, running_mean, running_var, True, momentum, eps)
    return y, m, s, jnp.zeros((0,), jnp.uint8), new_mean, new_var


# batch_norm_update_stats updates running_mean/running_var although its schema does not
# mark them as written, so it is a kernel (runtime/_redirects) built from lowered ops.


@lower(aten.batch_norm_backward.default)
def batch_norm_backward(
    g, x, weight, running_mean, running_var, save_mean, save_invstd, update, eps, output_mask, reserve
):
    return native_batch_norm_backward(
        g, x, weight, running_mean, running_var, save_mean, save_invstd, update, eps, output_mask
    )


@lower(aten.native_batch_norm_backward.default)
def native_batch_norm_backward(
    g, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask
):
    axes = (0,) + tuple(range(2, x.ndim))
    c = _channel_shape(x)
    gf, xf = opmath(g), opmath(x)
    if train:
        mean, invstd = save_mean, save_invstd
    else:
        mean, invstd = opmath(running_mean), lax.rsqrt(opmath(running_var) + eps)
    x_hat = (xf - mean.reshape(c)) * invstd.reshape(c)
    w = opmath(weight).reshape(c) if weight is not None else 1.0
    if train:
        dx_hat = gf * w
        grad_input = invstd.reshape(c) * (
            dx_hat
            - jnp.mean(dx_hat, axis=axes, keepdims=True)
            - x_hat * jnp.mean(dx_hat * x_hat, axis=axes, keepdims=True)
        )
    else:
        grad_input = gf * w * invstd.reshape(c)
    grad_weight = jnp.sum(gf * x_hat, axis=axes)
    grad_bias = jnp.sum(gf, axis=axes)
    return grad_input, grad_weight, grad_bias


@lower(aten.native_group_norm.default)
def native_group_norm(x, weight, bias, n, c, hw, group, eps):
    if x.size == 0:  # as on CPU: mean 0 and rstd NaN over empty groups
        mean = jnp.zeros((n, group), opmath(x).dtype)
        return x, mean, jnp.full((n, group), jnp.nan, mean.dtype)
    xf = opmath(x).reshape(n, group, -1)
    mean = jnp.mean(xf, axis=2)
    var = jnp.mean(jnp.square(xf - mean[..., None]), axis=2)
    rstd = lax.rsqrt(var + eps)
    y = ((xf - mean[..., None]) * rstd[..., None]).reshape(x.shape)
    cs = _channel_shape(x)
    if weight is not None:
        y = y * opmath(weight).reshape(cs)
    if bias is not None:
        y = y + opmath(bias).reshape(cs)
    return y.astype(x.dtype), mean, rstd


@lower(aten.native_group_norm_backward.default)
def native_group_norm_backward(g, x, mean, rstd, weight, n, c, hw, group, output_mask):
    # y = (x - mean) * rstd * w + b with the saved statistics
    per = (c // group) * hw  # (spelled out: an empty x has no -1 to infer)
    xf = opmath(x).reshape(n, group, per)
    x_hat = ((xf - mean[..., None]) * rstd[..., None]).reshape(x.shape)
    cs = _channel_shape(x)
    gf = opmath(g)
    w = opmath(weight).reshape(cs) if weight is not None else 1.0
    dx_hat = (gf * w).reshape(n, group, per)
    xh = x_hat.reshape(n, group, per)
    grad_input = (
        rstd[..., None] * (dx_hat - dx_hat.mean(axis=2, keepdims=True) - xh * (dx_hat * xh).mean(axis=2, keepdims=True))
    ).reshape(x.shape)
    axes = (0,) + tuple(range(2, x.ndim))
    return grad_input, jnp.sum(gf * x_hat, axis=axes), jnp.sum(gf, axis=axes)


# ---------------------------------------------------------------- dropout


@lower(aten.native_dropout.default, random=True)
def native_dropout(x, p, train):
    if train is False or p == 0 or x.size == 0:
        return x, jnp.ones(x.shape, jnp.bool_)
    if not 0 <= 1 - p <= 1:  # (the CPU kernel's bernoulli_(1 - p) checks it)
        raise RuntimeError(f"bernoulli_ expects p to be in [0, 1], but got p={1 - p}")
    keep = _context.dropout_keep(_context.rng_key(), 1.0 - p, x.shape)
    scale = 0.0 if p >= 1 else 1.0 / (1.0 - p)
    return jnp.where(keep, x * scale, jnp.zeros((), x.dtype)).astype(x.dtype), keep


@lower(aten.native_dropout_backward.default)
def native_dropout_backward(g, mask, scale):
    out = _context.out_dtype()  # a bool gradient times the float scale is float
    gm = opmath(g.astype(out)) * mask.astype(opmath(g.astype(out)).dtype)
    return (gm * scale).astype(out)


# ---------------------------------------------------------------- embedding and indexing


def check_index(idx, size: int, what: str = "index out of range in self"):
    bad = (idx < 0) | (idx >= size)
    _context.check(jnp.any(bad), IndexError, what)


@lower(aten.embedding.default)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    check_index(indices, weight.shape[0])
    return jnp.take(weight, indices.astype(jnp.int64), axis=0, mode="clip")


@lower(aten.embedding_dense_backward.default)
def embedding_dense_backward(g, indices, num_weights, padding_idx, scale_grad_by_freq):
    idx = indices.reshape(-1).astype(jnp.int64)
    gf = g.reshape(idx.shape[0], -1)
    if padding_idx >= 0:
        gf = jnp.where((idx == padding_idx)[:, None], jnp.zeros((), gf.dtype), gf)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), gf.dtype).at[idx].add(1)
        gf = gf / counts[idx][:, None]
    out = jnp.zeros((num_weights, gf.shape[1]), opmath(gf).dtype).at[idx].add(opmath(gf))
    return out.astype(g.dtype)


def _offset2bag(offsets, n, num_bags):
    """The bag of each index: bags start at offsets[:num_bags] (with include_last_offset
    the CPU kernels let the last bag run to the end of ``indices``)."""
    return jnp.searchsorted(offsets[:num_bags].astype(jnp.int64), jnp.arange(n), side="right") - 1


def _embedding_bag(weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx, forward_only):
    """PyTorch's CPU _embedding_bag: (output, offset2bag, bag_size, max_indices), the
    auxiliary outputs shaped as the CPU kernel shapes them (its Meta kernel differs)."""
    n = indices.shape[0]
    num_bags = offsets.shape[0] - (1 if include_last_offset else 0)
    idx = indices.astype(jnp.int64)
    check_index(idx, weight.shape[0])
    bag = _offset2bag(offsets, n, num_bags)  # (n,)
    valid = (idx != padding_idx) & (bag >= 0)
    rows = opmath(jnp.take(weight, idx, axis=0, mode="clip"))  # (n, D)
    counts = jax.ops.segment_sum(valid.astype(jnp.int64), bag, num_bags)  # (B,)
    itype = indices.dtype
    if mode == 2:
        low = jnp.asarray(-jnp.inf, rows.dtype)
        masked = jnp.where(valid[:, None], rows, low)
        best = jax.ops.segment_max(masked, bag, num_bags)  # (B, D)
        # the first index in the bag that holds the maximum
        first = jax.ops.segment_min(
            jnp.where(valid[:, None] & (masked == best[bag]), jnp.arange(n)[:, None], n), bag, num_bags
        )
        max_indices = jnp.where(counts[:, None] > 0, idx[jnp.clip(first, 0, max(n - 1, 0))], 0) if n else first * 0
        out = jnp.where(counts[:, None] > 0, best, 0)
        return out.astype(weight.dtype), bag.astype(itype), counts.astype(itype), max_indices.astype(itype)
    if per_sample_weights is not None:
        rows = rows * opmath(per_sample_weights)[:, None]
    out = jax.ops.segment_sum(jnp.where(valid[:, None], rows, 0), bag, num_bags)  # (B, D)
    if mode == 1:
        out = out / jnp.maximum(counts, 1)[:, None].astype(out.dtype)
        return out.astype(weight.dtype), bag.astype(itype), counts.astype(itype), counts.astype(itype)
    # sum: the CPU kernel leaves bag_size and max_indices zero, and offset2bag empty on its
    # fast path (float32/float16/bfloat16 weights, no padding_idx)
    fast = padding_idx < 0 and weight.dtype in (np.dtype(jnp.float32),) + _LOW
    aux = jnp.zeros((offsets.shape[0] if forward_only else num_bags,), itype)
    return out.astype(weight.dtype), bag[:0] if fast else bag.astype(itype), aux, aux


@lower(aten._embedding_bag.default, trust_meta=False)
def embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                  per_sample_weights=None, include_last_offset=False, padding_idx=-1):  # fmt: skip
    return _embedding_bag(weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx, False)


@lower(aten._embedding_bag_forward_only.default, trust_meta=False)
def embedding_bag_forward_only(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                               per_sample_weights=None, include_last_offset=False, padding_idx=-1):  # fmt: skip
    return _embedding_bag(weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx, True)


def _embedding_bag_grad(
    g, indices, bag, bag_size, max_indices, num_weights, scale_grad_by_freq, mode, psw, padding_idx
):
    idx = indices.astype(jnp.int64)
    gf = opmath(g)
    if mode == 2:
        nonempty = (bag_size > 0)[:, None]
        cols = jnp.broadcast_to(jnp.arange(g.shape[1]), g.shape)
        out = jnp.zeros((num_weights, g.shape[1]), gf.dtype)
        out = out.at[jnp.where(nonempty, max_indices.astype(jnp.int64), num_weights), cols].add(gf, mode="drop")
        return out.astype(g.dtype)
    valid = (idx != padding_idx) & (bag >= 0)
    rows = gf[jnp.clip(bag, 0)]  # (n, D)
    if psw is not None:
        rows = rows * opmath(psw)[:, None]
    if mode == 1:
        rows = rows / jnp.maximum(bag_size[jnp.clip(bag, 0)], 1)[:, None].astype(rows.dtype)
    if scale_grad_by_freq:
        # As PyTorch's CPU kernel does (a quirk, kept since the CPU is the oracle): the k-th
        # smallest distinct index is scaled by the count of sorted_indices[k], not its own.
        counts = jnp.zeros((num_weights,), rows.dtype).at[idx].add(1)
        srt = jnp.sort(idx)
        rank = jnp.cumsum(jnp.concatenate([jnp.ones((1,), jnp.int64), (srt[1:] != srt[:-1]).astype(jnp.int64)])) - 1
        k = rank[jnp.searchsorted(srt, idx)]
        rows = rows / counts[srt[k]][:, None]
    rows = jnp.where(valid[:, None], rows, 0)
    return jnp.zeros((num_weights, g.shape[1]), rows.dtype).at[idx].add(rows).astype(g.dtype)


@lower(aten._embedding_bag_backward.default)
def embedding_bag_backward(g, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
                           scale_grad_by_freq, mode, sparse, per_sample_weights, padding_idx=-1):  # fmt: skip
    # offset2bag may be empty (the forward's fast path): recomputed from the offsets
    bag = _offset2bag(offsets, indices.shape[0], g.shape[0])
    return _embedding_bag_grad(g, indices, bag, bag_size, maximum_indices, num_weights, scale_grad_by_freq, mode,
                               per_sample_weights, padding_idx)  # fmt: skip


@lower(aten._embedding_bag_dense_backward.default)
def embedding_bag_dense_backward(g, indices, offset2bag, bag_size, maximum_indices, num_weights,
                                 scale_grad_by_freq, mode, per_sample_weights, padding_idx=-1):  # fmt: skip
    bag = offset2bag.astype(jnp.int64)
    return _embedding_bag_grad(g, indices, bag, bag_size, maximum_indices, num_weights, scale_grad_by_freq, mode,
                               per_sample_weights, padding_idx)  # fmt: skip


@lower(aten._embedding_bag_per_sample_weights_backward.default)
def embedding_bag_per_sample_weights_backward(g, weight, indices, offsets, offset2bag, mode, padding_idx=-1):
    """d(output)/d(per_sample_weights) (sum mode): each index's row dotted with its bag's gradient."""
    idx = indices.astype(jnp.int64)
    bag = _offset2bag(offsets, idx.shape[0], g.shape[0])
    rows = opmath(jnp.take(weight, idx, axis=0, mode="clip"))
    v = jnp.sum(opmath(g)[jnp.clip(bag, 0)] * rows, axis=1)
    return jnp.where((idx != padding_idx) & (bag >= 0), v, 0).astype(g.dtype)


# ---------------------------------------------------------------- attention


def _sdpa_forward(q, k, v, bias, dropout_p, is_causal, scale, key):
    """softmax(q k^T * scale + bias) v; also returns the logsumexp (B, H, L)."""
    e = q.shape[-1]
    scale = 1.0 / math.sqrt(e) if scale is None else scale
    hq, hk = q.shape[-3] if q.ndim >= 3 else 1, k.shape[-3] if k.ndim >= 3 else 1
    if q.ndim >= 3 and hq != hk:  # grouped-query attention: repeat key/value heads
        k = jnp.repeat(k, hq // hk, axis=-3)
        v = jnp.repeat(v, hq // hk, axis=-3)
    s = _matmul_nt(opmath(q), opmath(k)) * scale
    s = _sdpa_masked(s, bias, is_causal)
    # softmax as PyTorch's math path takes it (_safe_softmax): a row masked everywhere
    # attends to nothing (zeros, and zero gradients) instead of giving NaN
    m, e, total = _exp_and_sum(s)
    lse = (jnp.log(total) + m)[..., 0]
    p = e / jnp.where(total == 0, 1, total)
    if dropout_p > 0:
        keep = _context.dropout_keep(key, 1.0 - dropout_p, p.shape)
        p = jnp.where(keep, p / (1.0 - dropout_p), 0.0)
    out = _matmul_nn(p, opmath(v))
    return out.astype(q.dtype), lse


def _exp_and_sum(s):
    """(m, exp(s - m), its row sums), m each row's maximum (0 where it is not finite)."""
    m = lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True))
    m = jnp.where(jnp.isfinite(m), m, 0)
    e = jnp.exp(s - m)
    return m, e, jnp.sum(e, axis=-1, keepdims=True)


def _sdpa_masked(s, bias, is_causal):
    """The scores with the causal mask and ``bias`` (bool: where to attend) applied."""
    if is_causal:
        causal = jnp.tril(jnp.ones(s.shape[-2:], jnp.bool_))
        s = jnp.where(causal, s, -jnp.inf)
    if bias is not None:
        if bias.dtype == jnp.bool_:
            s = jnp.where(bias, s, -jnp.inf)
        else:
            s = s + opmath(bias)
    return s


def _matmul_nn(a, b):
    return jnp.einsum("...ls,...sv->...lv", a, b, precision=lax.Precision.HIGHEST)


def _matmul_nt(a, b):
    return jnp.einsum("...le,...se->...ls", a, b, precision=lax.Precision.HIGHEST)


def _matmul_tn(a, b):
    """a^T b over the last two dims; on the CPU with ``a`` transposed behind a barrier
    (NOTE [Weight gradients on XLA:CPU] in ops/_matmul: XLA:CPU's own dot takes products
    contracted along the left operand's leading dim, at a fraction of YNNPACK's speed)."""

    def on_cpu(a, b):
        return _matmul_nn(lax.optimization_barrier(jnp.swapaxes(a, -1, -2)), b)

    def elsewhere(a, b):
        return jnp.einsum("...ls,...le->...se", a, b, precision=lax.Precision.HIGHEST)

    return lax.platform_dependent(a, b, cpu=on_cpu, default=elsewhere)


def _philox_words(rng):
    # (the key's 4 words as the int64 seed and offset that PyTorch's attention returns for
    # its backward, which _key_from_words turns back into the key)
    seed = (rng[0].astype(jnp.uint64) << 32) | rng[1].astype(jnp.uint64)
    offset = (rng[3].astype(jnp.uint64) << 32) | rng[2].astype(jnp.uint64)
    return lax.bitcast_convert_type(seed, jnp.int64), lax.bitcast_convert_type(offset, jnp.int64)


def _key_from_words(seed, offset):
    seed = lax.bitcast_convert_type(seed, jnp.uint64)
    offset = lax.bitcast_convert_type(offset, jnp.uint64)
    rng = jnp.stack([seed >> 32, seed & 0xFFFFFFFF, offset & 0xFFFFFFFF, offset >> 32]).astype(jnp.uint32)
    return _context.key_from_words(rng)


def _attention_in_bucket(k, v, d: int, bucket: int):
    """Keys and values as ``bucket`` positions along ``d`` (padded here if they come
    plain), the values past the length zeroed, and the mask of the valid positions."""
    if isinstance(k, _context.PaddedValue):
        length, k, v = k.length, k.arr, v.arr
    else:
        length = k.shape[d]
        widths = [(0, 0)] * k.ndim
        widths[d] = (0, bucket - length)
        k = jnp.pad(k, widths, constant_values=_context.pad_fill(k.dtype))
        v = jnp.pad(v, widths, constant_values=_context.pad_fill(v.dtype))
    valid = lax.iota(jnp.int64, bucket) < length
    v = jnp.where(valid[:, None], v, jnp.zeros((), v.dtype))
    return k, v, valid


@lower(aten._scaled_dot_product_fused_attention_overrideable.default, random=True)
def sdpa_overrideable(q, k, v, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False, scale=None):
    if attn_bias is not None and is_causal and _compat.sdpa_refuses_mask_with_causal():
        raise _context.PyTorchError(RuntimeError(_compat.SDPA_MASK_WITH_CAUSAL))
    plan = _context.current().bucket
    if plan is not None:  # NOTE [Buckets] (runtime/_buckets): keys and values in a bucket
        k, v, attn_bias = _attention_in_bucket(k, v, plan[1], plan[2])
    out, lse = _sdpa_forward(q, k, v, attn_bias, dropout_p, is_causal, scale, _context.rng_key())
    seed, offset = _philox_words(_context.current().rng)
    # the logsumexp as PyTorch's meta function has it: float32, (B, H, L) (B = 1 for 3-D)
    lse = lse.astype(jnp.float32).reshape((-1, *lse.shape[-2:]))
    return out, lse, None, None, q.shape[-2], k.shape[-2], seed, offset, None


@lower(aten._scaled_dot_product_fused_attention_overrideable_backward.default)
def sdpa_overrideable_backward(
    g,
    q,
    k,
    v,
    attn_bias,
    grad_input_mask,
    out,
    logsumexp,
    cum_seq_q,
    cum_seq_k,
    max_q,
    max_k,
    dropout_p,
    is_causal,
    philox_seed,
    philox_offset,
    scale=None,
):
    key = _key_from_words(philox_seed, philox_offset) if dropout_p > 0 else None
    has_bias = attn_bias is not None and attn_bias.size > 0 and attn_bias.dtype != jnp.bool_
    if q.ndim >= 3 and q.shape[-3] != k.shape[-3]:  # grouped-query heads
        return _sdpa_backward_by_vjp(g, q, k, v, attn_bias, has_bias, dropout_p, is_causal, scale, key)
    return _sdpa_backward(g, q, k, v, attn_bias, has_bias, dropout_p, is_causal, scale, key)


def _sdpa_backward(g, q, k, v, bias, has_bias, dropout_p, is_causal, scale, key):
    """Attention's gradients written out (NOTE [Attention's backward]).

    NOTE [Attention's backward]: with P = softmax(S) and Pd = P * keep / (1 - p) (keep:
    dropout's mask, drawn again from the forward's seed and offset), out = Pd v gives
    dv = Pd^T g, dP = (g v^T) * keep / (1 - p), dS = P * (dP - rowsum(P * dP)),
    dq = scale dS k, dk = scale dS^T q, and the gradient of a float mask is dS summed
    over the dims it was broadcast along. P is recomputed as the forward computes it,
    exp(S - max) / sum, not from the forward's logsumexp as exp(S - lse): lse is rounded
    to float32 at its own magnitude, so that form puts an error of about |lse| ulp on every
    probability. With logits up to ~29 it left the float32 dq and dk 10-20x further from
    the float64 gradients than the CPU's (1.4e-5 and 2.5e-5 against 1.2e-6 and 1.7e-6);
    recomputed, they are as close as the CPU's. The price, a second max and sum over the
    scores, did not show: the backward of 8x4x128x64 causal attention alone took 4.07 and
    3.76 ms against 4.10 and 3.73 ms before (two runs, medians of 30 alternating calls,
    2-core AMD EPYC). Written out rather than as the vjp of the forward, which XLA:CPU
    ran with its transposed batched products (dv, dk) on its own
    dot kernel: the backward of 8x4x128x64 causal attention with dropout alone, alternating
    in one process (2-core AMD EPYC), 6.13 -> 5.17 ms. The fused GPT-2 step did not move
    beyond noise (XLA had merged the vjp's second forward with the forward in the same
    graph). Grouped-query heads keep the vjp, which sums the repeated heads' gradients."""
    qo, ko, vo, go = opmath(q), opmath(k), opmath(v), opmath(g)
    e = q.shape[-1]
    scale = 1.0 / math.sqrt(e) if scale is None else scale
    s = _matmul_nt(qo, ko) * scale
    s = _sdpa_masked(s, bias, is_causal)
    _, e, total = _exp_and_sum(s)
    p = e / jnp.where(total == 0, 1, total)  # (a row masked everywhere: zeros)
    dpd = _matmul_nt(go, vo)
    if dropout_p > 0:
        keep = _context.dropout_keep(key, 1.0 - dropout_p, p.shape)
        pd = jnp.where(keep, p / (1.0 - dropout_p), 0.0)
        dp = jnp.where(keep, dpd / (1.0 - dropout_p), 0.0)
    else:
        pd, dp = p, dpd
    ds = p * (dp - jnp.sum(p * dp, axis=-1, keepdims=True))
    gq = _matmul_nn(ds, ko) * scale
    gk = _matmul_tn(ds, qo) * scale
    gv = _matmul_tn(pd, go)
    if has_bias:
        lead = ds.ndim - bias.ndim
        summed = tuple(range(lead)) + tuple(
            lead + i for i, n in enumerate(bias.shape) if n == 1 and ds.shape[lead + i] != 1
        )
        gb = jnp.sum(ds, axis=summed).reshape(bias.shape).astype(bias.dtype)
    else:
        gb = _no_bias_grad(bias, q)
    return gq.astype(q.dtype), gk.astype(k.dtype), gv.astype(v.dtype), gb


def _no_bias_grad(bias, q):
    """The mask's gradient slot when it has none: a boolean mask's is a tensor of its
    shape and dtype (what the op's Meta kernel gives; autograd drops it)."""
    return jnp.zeros((0,), q.dtype) if bias is None else jnp.zeros(bias.shape, bias.dtype)


def _sdpa_backward_by_vjp(g, q, k, v, bias, has_bias, dropout_p, is_causal, scale, key):
    def f(q_, k_, v_, b_):
        return _sdpa_forward(q_, k_, v_, b_ if has_bias else bias, dropout_p, is_causal, scale, key)[0]

    b0 = bias if has_bias else jnp.zeros((), q.dtype)
    _, vjp = jax.vjp(f, q, k, v, b0)
    gq, gk, gv, gb = vjp(g.astype(q.dtype))
    if not has_bias:
        gb = _no_bias_grad(bias, q)
    return gq, gk, gv, gb


@lower(aten.embedding_renorm.default, static=("norm_type",))
def embedding_renorm(weight, indices, max_norm, norm_type):
    """What ``embedding(max_norm=...)`` does first: every looked-up row whose norm exceeds
    ``max_norm`` is scaled by ``max_norm / (norm + 1e-7)``, the scale taken in double as on
    the CPU; a row looked up twice is scaled once."""
    # (Meta checks the dims and index dtypes)
    idx = indices.reshape(-1).astype(jnp.int64)
    check_index(idx, weight.shape[0])
    rows = weight[idx]
    norm = p_norm(jnp.abs(opmath(rows)), norm_type, 1).astype(rows.dtype).astype(jnp.float64)
    scale = (max_norm / (norm + 1e-7)).astype(rows.dtype)
    rows = jnp.where((norm > max_norm)[:, None], rows * scale[:, None], rows)
    return weight.at[idx].set(rows)
