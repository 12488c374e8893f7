"""Kernels that send an op to another op the table lowers."""

from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend

from torch_jax import _compat

aten = torch.ops.aten


def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    # native_batch_norm's schema does not mark running_mean/var as written although it
    # updates them in training; _native_batch_norm_legit is the annotated form.
    if running_mean is None and running_var is None:
        return aten._native_batch_norm_legit.no_stats(input, weight, bias, training, momentum, eps)
    if not training:
        return aten._native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var, momentum, eps)
    return aten._native_batch_norm_legit(input, weight, bias, running_mean, running_var, training, momentum, eps)


def native_batch_norm_out(
    input, weight, bias, running_mean, running_var, training, momentum, eps, *, out, save_mean, save_invstd
):
    results = native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)
    from torch_jax.runtime._install import write_out

    return write_out(results, (out, save_mean, save_invstd), (input,))


def addbmm_(self, batch1, batch2, *, beta=1, alpha=1):
    # the CPU and CUDA kernels run addbmm.out(self, ..., out=self), which resizes a self
    # that merely broadcasts (shape [1] or []) to the result's shape
    result = aten.addbmm.default(self, batch1, batch2, beta=beta, alpha=alpha)
    if self.shape != result.shape:
        self.resize_(result.shape)
    return self.copy_(result)


def conj_physical_out(self, *, out):
    # conj_physical is composite (it calls _conj_physical), so no out= is derived for it
    from torch_jax.runtime._install import write_out

    return write_out(aten._conj_physical.default(self), (out,), (self,))


def ctc_loss_tensor(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    # log_alpha's shape depends on the values of target_lengths: read the lengths to the
    # host, as PyTorch's CUDA kernel does, and run the int[] overload
    return aten._ctc_loss.default(
        log_probs, targets, input_lengths.tolist(), target_lengths.tolist(), blank, zero_infinity
    )


def batch_norm_update_stats(input, running_mean, running_var, momentum):
    """(mean, biased var) over all dims but the channel dim; the running stats move by
    ``momentum`` towards the mean and the unbiased var (its schema does not mark them as
    written, so this is a kernel of lowered ops rather than a lowering)."""
    dims = [0, *range(2, input.dim())]
    n = input.numel() // max(input.size(1), 1)
    acc = torch.float32 if input.dtype in (torch.float16, torch.bfloat16) else input.dtype
    mean = input.to(acc).mean(dims)
    var = input.to(acc).var(dims, correction=0)
    with torch.no_grad():
        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
        if running_var is not None:
            unbiased = var * (n / (n - 1)) if n > 1 else var
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
    # half inputs with float32 running stats ("mixed") give float32 statistics, as on CPU
    mixed = acc != input.dtype and running_mean is not None and running_mean.dtype == torch.float32
    out = torch.float32 if mixed else input.dtype
    return mean.to(out), var.to(out)


def fused_sdp_choice(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False
):
    """The op that names a device's attention kernel: ours
    (_scaled_dot_product_fused_attention_overrideable, one fused XLA computation).
    ``scaled_dot_product_attention`` itself does not ask it on a Python backend (NOTE
    [Attention in one op])."""
    return SDPBackend.OVERRIDEABLE.value


def scaled_dot_product_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False
):
    """NOTE [Attention in one op]: ``scaled_dot_product_attention`` is a composite op whose
    backend choice is a C++ dispatch stub that a Python backend cannot register, so on
    ``jax`` it always took the math path: about 8 ops per call (two batched products,
    softmax, masks, dropout), 27 with the backward. This kernel, registered for the
    device's autograd key (where it replaces the composite), sends the common cases to
    ``_scaled_dot_product_fused_attention_overrideable`` instead, one lowered op with its
    own backward, as PyTorch's backends for other devices do. A mask with ``is_causal``
    applies both, as PyTorch's CPU kernel does (its math path raises). The rest
    (grouped-query heads, broadcast batches, 2-D inputs, 3-D inputs on torch 2.11/2.12:
    NOTE [3-D attention before torch 2.13], the OVERRIDEABLE backend switched off by
    ``sdpa_kernel``) runs the composite as before, which also raises
    PyTorch's errors. Like the fused kernels of PyTorch's CPU (measured: its flash
    attention's backward) and CUDA, the op has no double backward."""
    if _overrideable_fits(query, key, value, attn_mask, dropout_p, is_causal):
        return aten._scaled_dot_product_fused_attention_overrideable(
            query, key, value, attn_mask, dropout_p, is_causal, False, scale=scale
        )[0]
    return aten.scaled_dot_product_attention.default.decompose(
        query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
    )


def _overrideable_fits(q, k, v, mask, dropout_p, is_causal) -> bool:
    if not torch._C._get_overrideable_sdp_enabled() or not 0.0 <= dropout_p < 1.0:
        return False
    tensors = (q, k, v) if mask is None else (q, k, v, mask)
    if any(t.device.type != "jax" or t.is_nested for t in tensors) or not (q.device == k.device == v.device):
        return False
    if not (q.dtype == k.dtype == v.dtype and q.is_floating_point()) or not (
        q.dim() == k.dim() == v.dim() and (q.dim() == 4 or (q.dim() == 3 and _compat.overrideable_attention_takes_3d()))
    ):
        return False
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-1] != v.shape[:-1] or q.shape[-1] != k.shape[-1]:
        return False
    if mask is None:
        return True
    if mask.device != q.device or mask.dtype not in (torch.bool, q.dtype):
        return False
    # the mask broadcasts to the scores' shape (torch.broadcast_shapes costs 9 us here)
    scores, shape = (*q.shape[:-1], k.shape[-2]), mask.shape
    return len(shape) <= len(scores) and all(m == 1 or m == s for m, s in zip(reversed(shape), reversed(scores)))


def autograd_kernels():
    """Kernels for the device's autograd key (they replace a composite op's decomposition)."""
    return [(aten.scaled_dot_product_attention.default, scaled_dot_product_attention)]


def kernels():
    return [
        (aten.native_batch_norm.default, native_batch_norm),
        (aten.native_batch_norm.out, native_batch_norm_out),
        (aten.addbmm_.default, addbmm_),
        (aten.conj_physical.out, conj_physical_out),
        (aten._ctc_loss.Tensor, ctc_loss_tensor),
        (aten.batch_norm_update_stats.default, batch_norm_update_stats),
        (aten._fused_sdp_choice.default, fused_sdp_choice),
    ]
