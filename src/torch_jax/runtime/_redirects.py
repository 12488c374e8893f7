"""Kernels that send an op to another op the table lowers."""

from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend

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
    """scaled_dot_product_attention asks the device which kernel to use: ours
    (_scaled_dot_product_fused_attention_overrideable, one fused XLA computation)."""
    return SDPBackend.OVERRIDEABLE.value


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
