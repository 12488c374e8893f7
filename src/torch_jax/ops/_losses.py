"""Loss functions and their backward ops. Losses that PyTorch composes from other ops
(l1, kl_div, margin ranking, cosine embedding, ...) need no lowering here."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from torch_jax.ops import _context
from torch_jax.ops._promote import opmath
from torch_jax.ops._registry import aten, lower

# ---------------------------------------------------------------- pointwise losses


def _nll_parts(x, target, weight, ignore_index):
    """Per-element loss terms and weights; the class axis is 1 (0 for 1-D input)."""
    axis = 0 if x.ndim == 1 else 1
    n_classes = x.shape[axis]
    t = target.astype(jnp.int64)
    valid = t != ignore_index
    bad = valid & ((t < 0) | (t >= n_classes))
    _context.check(jnp.any(bad), IndexError, "Target {value} is out of bounds.", jnp.max(jnp.where(bad, t, -(2**62))))
    safe = jnp.where(valid, jnp.clip(t, 0, n_classes - 1), 0)
    picked = jnp.squeeze(jnp.take_along_axis(x, jnp.expand_dims(safe, axis), axis=axis), axis)
    w = jnp.ones((), x.dtype) if weight is None else weight[safe]
    w = jnp.where(valid, w, jnp.zeros((), x.dtype))
    return -picked * w, w, safe, valid, axis


@lower(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
def nll_loss_forward(x, target, weight, reduction, ignore_index):
    terms, w, _, _, _ = _nll_parts(x, target, weight, ignore_index)
    total = jnp.sum(jnp.broadcast_to(w, terms.shape))
    if reduction == 0:
        return terms, total
    if reduction == 1:
        return jnp.sum(terms) / total, total
    return jnp.sum(terms), total


@lower(aten.nll_loss_backward.default, aten.nll_loss2d_backward.default)
def nll_loss_backward(g, x, target, weight, reduction, ignore_index, total_weight):
    """As the CPU kernel: each counted target's element gets ``weight * -(g / total_weight)``
    (``mean``) and every other element 0, even where that value is NaN or inf: a batch
    whose targets are all ``ignore_index`` has a NaN mean loss but a zero gradient."""
    _, w, safe, valid, axis = _nll_parts(x, target, weight, ignore_index)
    w = jnp.broadcast_to(w, safe.shape)
    scale = w * -(g / total_weight) if reduction == 1 else w * -g
    classes = lax.broadcasted_iota(safe.dtype, x.shape, axis)
    hit = (classes == jnp.expand_dims(safe, axis)) & jnp.expand_dims(valid, axis)
    return jnp.where(hit, jnp.expand_dims(scale, axis), jnp.zeros((), x.dtype)).astype(x.dtype)


@lower(aten.mse_loss.default)
def mse_loss(x, y, reduction=1):
    d = (x - y) ** 2
    return _reduce(d, reduction)


@lower(aten.mse_loss_backward.default)
def mse_loss_backward(g, x, y, reduction):
    scale = 2.0 / x.size if reduction == 1 and x.size else 2.0
    return (g * scale * (x - y)).astype(x.dtype)


def _reduce(v, reduction):
    if reduction == 0:
        return v
    if reduction == 1:
        return jnp.mean(v)
    return jnp.sum(v)


@lower(aten.smooth_l1_loss.default)
def smooth_l1_loss(x, y, reduction=1, beta=1.0):
    d = jnp.abs(x - y)
    v = d - 0.5 * beta if beta == 0 else jnp.where(d < beta, 0.5 * d * d / beta, d - 0.5 * beta)
    return _reduce(v, reduction)


@lower(aten.binary_cross_entropy.default)
def binary_cross_entropy(x, y, weight=None, reduction=1):
    v = -(y * jnp.maximum(jnp.log(x), -100) + (1 - y) * jnp.maximum(jnp.log1p(-x), -100))
    if weight is not None:
        v = v * weight
    return _reduce(v, reduction)


@lower(aten.binary_cross_entropy_backward.default)
def binary_cross_entropy_backward(g, x, y, weight=None, reduction=1):
    gf, xf, yf = opmath(g), opmath(x), opmath(y)
    # the CPU kernel's clamp of the denominator (EPSILON = 1e-12)
    v = gf * (xf - yf) / jnp.maximum((1 - xf) * xf, 1e-12)
    if weight is not None:
        v = v * opmath(weight)
    if reduction == 1 and x.size:
        v = v / x.size
    return v.astype(x.dtype)


@lower(aten.huber_loss.default)
def huber_loss(x, y, reduction=1, delta=1.0):
    z = jnp.abs(opmath(x) - opmath(y))  # float16 computes in float32, as on CPU
    return _reduce(jnp.where(z < delta, 0.5 * z * z, delta * (z - 0.5 * delta)), reduction).astype(x.dtype)


# huber_loss_backward's composite kernel calls its out= overload, which reaches the device
@lower(aten.huber_loss_backward.default)
def huber_loss_backward(g, x, y, reduction, delta):
    d = x - y
    norm = 1.0 / x.size if reduction == 1 and x.size else 1.0
    v = jnp.where(d < -delta, -delta, jnp.where(d > delta, delta, d))
    return (v * norm * g).astype(x.dtype)


# smooth_l1_loss_backward's composite kernel calls its grad_input= overload, likewise
@lower(aten.smooth_l1_loss_backward.default)
def smooth_l1_loss_backward(g, x, y, reduction, beta):
    d = x - y
    norm = 1.0 / x.size if reduction == 1 and x.size else 1.0
    inner = jnp.sign(d) if beta == 0 else d / beta  # beta 0 is the L1 loss
    v = jnp.where(d < -beta, -1, jnp.where(d > beta, 1, inner))
    return (v * norm * g).astype(x.dtype)


# ---------------------------------------------------------------- margin losses


def _frames(x):
    """(N, C) view of a margin loss input, which may be one frame (C,)."""
    return x.reshape(1, -1) if x.ndim <= 1 else x


def _frame_reduce(per_frame, reduction, shape):
    if reduction == 0:
        return per_frame.reshape(shape)
    if reduction == 1:
        return jnp.mean(per_frame)
    return jnp.sum(per_frame)


def _multi_margin(x, target, p, margin, weight, reduction):
    xf = opmath(_frames(x))  # (N, C)
    n, c = xf.shape
    t = target.reshape(-1).astype(jnp.int64)
    bad = (t < 0) | (t >= c)
    _context.check(jnp.any(bad), RuntimeError, "target out of range")
    t = jnp.clip(t, 0, c - 1)
    x_t = jnp.take_along_axis(xf, t[:, None], axis=1)  # (N, 1)
    z = margin - x_t + xf
    h = jnp.where(z > 0, z, 0)
    h = jnp.where(p == 1, h, h * h)
    if weight is not None:
        h = h * opmath(weight)[t][:, None]
    h = jnp.where(jnp.arange(c)[None, :] == t[:, None], 0, h)  # the target class itself is skipped
    per_frame = jnp.sum(h, axis=1) / c
    shape = target.shape if x.ndim > 1 else ()
    return _frame_reduce(per_frame, reduction, shape)


@lower(aten.multi_margin_loss.default)
def multi_margin_loss(x, target, p=1, margin=1, weight=None, reduction=1):
    return _multi_margin(x, target, p, margin, weight, reduction).astype(x.dtype)


@lower(aten.multi_margin_loss_backward.default)
def multi_margin_loss_backward(g, x, target, p, margin, weight=None, reduction=1):
    _, vjp = jax.vjp(lambda x_: _multi_margin(x_, target, p, margin, weight, reduction), opmath(x))
    return vjp(opmath(g).reshape(_multi_margin(x, target, p, margin, weight, reduction).shape))[0].astype(x.dtype)


def _multilabel_margin(x, target, reduction):
    """The loss and the is_target mask: target rows list class indices, ended by the first -1."""
    xf = opmath(_frames(x))  # (N, C)
    n, c = xf.shape
    t = _frames(target).astype(jnp.int64)  # (N, C)
    valid = jnp.cumprod(t >= 0, axis=1).astype(jnp.bool_)  # the labels before the first negative one
    bad = valid & (t >= c)
    _context.check(jnp.any(bad), RuntimeError, "multilabel_margin_loss: target out of range")
    safe = jnp.clip(t, 0, c - 1)
    is_target = jnp.any(valid[:, :, None] & (safe[:, :, None] == jnp.arange(c)), axis=1)  # (N, C)
    x_t = jnp.take_along_axis(xf, safe, axis=1)  # (N, J)
    z = 1 - x_t[:, :, None] + xf[:, None, :]  # (N, J, C)
    h = jnp.where((z > 0) & valid[:, :, None] & ~is_target[:, None, :], z, 0)
    per_frame = jnp.sum(h, axis=(1, 2)) / c
    shape = x.shape[:-1] if x.ndim > 1 else ()
    return _frame_reduce(per_frame, reduction, shape), is_target.reshape(x.shape)


# trust_meta=False: the Meta kernel gives a 1-D input's unreduced loss the shape (1,), the
# CPU gives it ()
@lower(aten.multilabel_margin_loss_forward.default, trust_meta=False)
def multilabel_margin_loss_forward(x, target, reduction):
    loss, is_target = _multilabel_margin(x, target, reduction)
    return loss.astype(x.dtype), is_target.astype(x.dtype)


@lower(aten.multilabel_margin_loss_backward.default)
def multilabel_margin_loss_backward(g, x, target, reduction, is_target):
    loss, vjp = jax.vjp(lambda x_: _multilabel_margin(x_, target, reduction)[0], opmath(x))
    return vjp(opmath(g).reshape(loss.shape))[0].astype(x.dtype)


# ---------------------------------------------------------------- CTC


def _ctc_setup(log_probs, targets, target_lengths, max_len, blank):
    """Per-batch extended labels (blank, l1, blank, l2, ..., blank) and their log-probabilities."""
    lp = log_probs if log_probs.ndim == 3 else log_probs[:, None]  # (T, N, C)
    tl = jnp.asarray(target_lengths, jnp.int64).reshape(-1)  # (N,)
    if targets.ndim == 2 or log_probs.ndim == 2:  # padded (N, S)
        tgt = targets.reshape(tl.shape[0], -1)[:, :max_len].astype(jnp.int64)
    else:  # concatenated targets of all batch entries
        offsets = jnp.cumsum(tl) - tl
        idx = jnp.clip(offsets[:, None] + jnp.arange(max_len), 0, max(targets.shape[0] - 1, 0))
        tgt = targets.astype(jnp.int64)[idx] if targets.shape[0] else jnp.zeros(idx.shape, jnp.int64)
    s = 2 * max_len + 1
    ext = jnp.full((tl.shape[0], s), blank, jnp.int64).at[:, 1::2].set(tgt)  # (N, S')
    pos = jnp.arange(s)
    in_target = pos[None, :] < 2 * tl[:, None] + 1  # (N, S')
    prev2 = jnp.concatenate([jnp.full((tl.shape[0], 2), -1, jnp.int64), ext[:, :-2]], axis=1)
    skip = (ext != blank) & (ext != prev2) & (pos >= 2)  # may come from s - 2
    lp_ext = jnp.take_along_axis(lp, jnp.broadcast_to(ext[None], (lp.shape[0],) + ext.shape), axis=2)  # (T, N, S')
    return lp, tl, ext, in_target, skip, lp_ext


def _shift(a, k):
    """a[..., s - k] along the last axis, -inf where s < k (k may be negative)."""
    pad = jnp.full(a.shape[:-1] + (abs(k),), -jnp.inf, a.dtype)
    return jnp.concatenate([pad, a[..., :-k]], -1) if k > 0 else jnp.concatenate([a[..., -k:], pad], -1)


def _lse3(a, b, c):
    """log(e^a + e^b + e^c) the way PyTorch's CPU kernel sums it (one shared max), so
    that float32 results round alike."""
    m = jnp.maximum(jnp.maximum(a, b), c)
    m = jnp.where(m == -jnp.inf, 0, m)
    return jnp.log(jnp.exp(a - m) + jnp.exp(b - m) + jnp.exp(c - m)) + m


def _ctc_alpha(lp_ext, il, in_target, skip):
    neg = jnp.asarray(-jnp.inf, lp_ext.dtype)
    first = jnp.where((jnp.arange(lp_ext.shape[2]) < 2) & in_target, lp_ext[0], neg)

    def step(prev, xs):
        t, lpt = xs
        a = _lse3(prev, _shift(prev, 1), jnp.where(skip, _shift(prev, 2), neg))
        cur = jnp.where(in_target & (t < il)[:, None], a + lpt, neg)
        return cur, cur

    _, rest = lax.scan(step, first, (jnp.arange(1, lp_ext.shape[0]), lp_ext[1:]))
    return jnp.concatenate([first[None], rest], axis=0)  # (T, N, S')


def _ctc_nll(log_alpha, il, tl):
    last = jnp.take_along_axis(log_alpha, jnp.clip(il - 1, 0)[None, :, None], axis=0)[0]  # (N, S')
    end = jnp.take_along_axis(last, (2 * tl)[:, None], axis=1)[:, 0]
    before = jnp.take_along_axis(last, jnp.clip(2 * tl - 1, 0)[:, None], axis=1)[:, 0]
    ll = _lse3(end, jnp.where(tl > 0, before, -jnp.inf), jnp.asarray(-jnp.inf, end.dtype))
    return jnp.where(il > 0, -ll, jnp.where(tl == 0, 0.0, jnp.inf).astype(ll.dtype))


def _max_len(targets, target_lengths):
    if isinstance(target_lengths, (list, tuple)):
        return max(target_lengths, default=0)
    return targets.shape[-1] if targets.ndim == 2 else targets.shape[0]


@lower(aten._ctc_loss.default)
def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    """The negative log-likelihood (N,) and log_alpha (N, T, 2 * max target length + 1)."""
    max_len = _max_len(targets, target_lengths)
    lp, tl, _, in_target, skip, lp_ext = _ctc_setup(log_probs, targets, target_lengths, max_len, blank)
    il = jnp.asarray(input_lengths, jnp.int64).reshape(-1)
    log_alpha = _ctc_alpha(lp_ext, il, in_target, skip)
    nll = _ctc_nll(log_alpha, il, tl)
    if log_probs.ndim == 2:
        return nll[0], log_alpha[:, 0]
    return nll, jnp.swapaxes(log_alpha, 0, 1)


# _ctc_loss.Tensor (lengths as tensors) is a kernel in runtime/_redirects: log_alpha's
# shape depends on the values of target_lengths, so they are read to the host first.


@lower(aten._ctc_loss_backward.default, aten._ctc_loss_backward.Tensor)
def ctc_loss_backward(g, log_probs, targets, input_lengths, target_lengths, nll, log_alpha, blank, zero_infinity=False):
    """PyTorch's CTC gradient, exp(lp) - exp(log(alpha beta) + nll - lp), which is the
    gradient with respect to the logits of a log_softmax, not of ``log_probs`` itself."""
    max_len = (log_alpha.shape[-1] - 1) // 2
    lp, tl, ext, in_target, skip, lp_ext = _ctc_setup(log_probs, targets, target_lengths, max_len, blank)
    il = jnp.asarray(input_lengths, jnp.int64).reshape(-1)
    la = log_alpha[:, None] if log_probs.ndim == 2 else jnp.swapaxes(log_alpha, 0, 1)  # (T, N, S')
    neg = jnp.asarray(-jnp.inf, lp.dtype)
    pos = jnp.arange(ext.shape[1])
    end = in_target & ((pos == 2 * tl[:, None]) | (pos == 2 * tl[:, None] - 1))
    # beta may come from s + 2 when alpha may go from s to s + 2
    skip_next = jnp.concatenate([skip[:, 2:], jnp.zeros((skip.shape[0], 2), jnp.bool_)], axis=1)

    def step(nxt, xs):
        t, lpt = xs
        b = _lse3(nxt, _shift(nxt, -1), jnp.where(skip_next, _shift(nxt, -2), neg))
        cur = jnp.where(in_target & (t < il - 1)[:, None], b + lpt, neg)
        cur = jnp.where((t == il - 1)[:, None] & end, lpt, cur)
        return cur, cur

    t_all = jnp.arange(lp.shape[0])
    _, lb = lax.scan(step, jnp.full(ext.shape, neg), (t_all, lp_ext), reverse=True)  # (T, N, S')
    # log(sum of alpha * beta over the positions of each character)
    ab = la + lb  # (T, N, S')
    m = jnp.max(ab, axis=2, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0)
    onehot = jax.nn.one_hot(ext, lp.shape[2], dtype=lp.dtype)  # (N, S', C)
    lcab = jnp.log(jnp.einsum("tns,nsc->tnc", jnp.exp(ab - m), onehot, precision=lax.Precision.HIGHEST)) + m
    nll_n = nll.reshape(-1)
    grad = jnp.exp(lp) - jnp.exp(lcab + nll_n[None, :, None] - lp)
    grad = grad * g.reshape(-1)[None, :, None]
    keep = (t_all[:, None] < il[None, :])[:, :, None]
    if zero_infinity:
        keep = keep & ~jnp.isinf(nll_n)[None, :, None]
    grad = jnp.where(keep, grad, 0)
    return grad.reshape(log_probs.shape)
