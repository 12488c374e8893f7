"""The inference fast paths of ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer``.

In eval mode under ``torch.no_grad()`` (or ``inference_mode``), with batch-first 3-D input,
self-attention and an even head count, those modules call one fused op instead of their
Python forward: ``_native_multi_head_attention`` and ``_transformer_encoder_layer_fwd``,
which PyTorch lets a PrivateUse1 device take (the device type is in the modules' list of
fast-path devices). Both are written here from their CPU kernels' steps, with
``_masked_softmax``, the softmax they mask with.
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from torch_jax.ops._activations import gelu
from torch_jax.ops._matmul import _dot
from torch_jax.ops._nn import _matmul_nn, _matmul_nt, native_layer_norm
from torch_jax.ops._promote import opmath
from torch_jax.ops._registry import aten, lower


def _masked(x, mask, dim, mask_type):
    """softmax(x) along ``dim`` with the elements where ``mask`` is true left out, as the
    CPU's ``_masked_softmax``: a non-bool mask counts as true where it is nonzero; mask
    type 1 is a (B, L) key padding mask of (B, H, L, L) scores, type 0 an (L, L) mask,
    type 2 (and any other mask) one of the scores' shape. A slice masked everywhere is
    NaN, as on the CPU."""
    mask = mask.astype(jnp.bool_)
    if mask_type == 1 and mask.ndim == 2 and x.ndim == 4:
        mask = mask.reshape(mask.shape[0], 1, 1, mask.shape[1])
    s = jnp.where(jnp.broadcast_to(mask, x.shape), -jnp.inf, opmath(x))
    e = jnp.exp(s - jnp.max(s, axis=dim, keepdims=True))
    return e / jnp.sum(e, axis=dim, keepdims=True)


@lower(aten._masked_softmax.default, meta=False)
def masked_softmax(x, mask, dim=None, mask_type=None):
    dim = x.ndim - 1 if dim is None else dim
    return _masked(x, mask, dim, mask_type).astype(x.dtype)


@lower(aten._masked_softmax_backward.default, meta=False)
def masked_softmax_backward(g, out, mask, dim=None):
    dim = out.ndim - 1 if dim is None else dim
    go, oo = opmath(g), opmath(out)
    gi = oo * (go - jnp.sum(go * oo, axis=dim, keepdims=True))
    return jnp.where(jnp.broadcast_to(mask.astype(jnp.bool_), gi.shape), 0, gi).astype(g.dtype)


def _linear(x, w, b):
    """x @ w^T + b in the compute dtype."""
    return _dot(x, w, ((x.ndim - 1,), (1,))) + b


def _attention(query, key, value, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, mask_type):
    """(projected output (B, T, D), attention weights (B, H, T, S)) in the compute dtype."""
    b, t, d = query.shape
    dh = d // num_head
    wq, wk, wv = jnp.split(opmath(qkv_weight), 3)
    bq, bk, bv = jnp.split(opmath(qkv_bias), 3)

    def heads(x, w, bias):  # (B, T, D) -> (B, H, T, dh)
        y = _linear(opmath(x), w, bias)
        return y.reshape(x.shape[0], x.shape[1], num_head, dh).transpose(0, 2, 1, 3)

    # the CPU kernel scales q after its bias by 1/sqrt(dh), rounded to the input dtype
    q = heads(query, wq, bq) * jnp.asarray(1.0 / math.sqrt(dh), query.dtype).astype(wq.dtype)
    k, v = heads(key, wk, bk), heads(value, wv, bv)
    s = _matmul_nt(q, k)  # (B, H, T, S)
    if mask is None:
        p = jnp.exp(s - jnp.max(s, axis=-1, keepdims=True))
        p = p / jnp.sum(p, axis=-1, keepdims=True)
    else:
        p = _masked(s, mask, s.ndim - 1, mask_type)
    ctx = _matmul_nn(p, v).transpose(0, 2, 1, 3).reshape(b, t, d)  # (B, T, D)
    return _linear(ctx, opmath(proj_weight), opmath(proj_bias)), p


# trust_meta=False: without need_weights the CPU returns no weights (None), the Meta kernel
# an empty tensor
@lower(aten._native_multi_head_attention.default, trust_meta=False)
def native_multi_head_attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight,
                                proj_bias, mask=None, need_weights=True, average_attn_weights=True,
                                mask_type=None):  # fmt: skip
    if query.size == 0:
        return jnp.zeros(query.shape, query.dtype), None
    out, p = _attention(query, key, value, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, mask_type)
    if not need_weights:
        return out.astype(query.dtype), None
    if average_attn_weights:
        p = jnp.sum(p, axis=1) / num_head
    return out.astype(query.dtype), p.astype(query.dtype)


@lower(aten._transformer_encoder_layer_fwd.default)
def transformer_encoder_layer_fwd(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                                  use_gelu, norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2,
                                  norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None,
                                  mask_type=None):  # fmt: skip
    """The CPU kernel's steps: self-attention and a two-layer feed-forward block, each
    added to its input, with layer norms before (``norm_first``) or after them."""
    if src.size == 0:
        return src

    def norm(x, w, b):
        return opmath(native_layer_norm(x, [embed_dim], w, b, eps)[0])

    x = opmath(src)
    if norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    x = opmath(src) + _attention(x, x, x, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, mask_type)[0]
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    residual = x
    if norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    h = _linear(x, opmath(ffn_weight_1), opmath(ffn_bias_1))
    h = gelu(h) if use_gelu else jnp.maximum(h, 0)
    x = residual + _linear(h, opmath(ffn_weight_2), opmath(ffn_bias_2))
    if not norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    return x.astype(src.dtype)
