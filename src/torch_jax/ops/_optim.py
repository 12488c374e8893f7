"""The fused optimizer kernels (``torch.optim.SGD/Adam/AdamW/Adagrad(fused=True)``, what
Hugging Face's Trainer picks by default), each one computation over all parameters,
with the arithmetic of PyTorch's CPU kernels (aten/src/ATen/native/cpu/Fused*Kernel.cpp):
hyperparameters are doubles rounded to the opmath type, per-parameter step counts are
read on the device, and with ``grad_scale`` the gradients are unscaled in place first.
A ``found_inf`` that is nonzero skips the whole step (the gradients are still unscaled).
"""

from __future__ import annotations

import functools

import jax.numpy as jnp

from torch_jax.ops._promote import opmath
from torch_jax.ops._registry import aten, lower

_HYPER = ("lr",)  # (betas, eps and weight decay stay compile-time constants)


def _scalar(t):
    return t.reshape(()) if t is not None and not isinstance(t, float) else t


def _unscale(grads, grad_scale):
    if grad_scale is None:
        return [opmath(g) for g in grads]
    s = opmath(grad_scale.reshape(()))
    return [opmath(g) / s for g in grads]


def _written_grads(unscaled, grads, grad_scale):
    """The gradients after the step: unscaled in place when there was a ``grad_scale``,
    left as they are (None) otherwise."""
    if grad_scale is None:
        return None
    return [u.astype(g.dtype) for u, g in zip(unscaled, grads)]


def _skip(found_inf, new, old):
    """``new`` unless ``found_inf`` is set (then ``old``)."""
    if found_inf is None:
        return new
    skip = found_inf.reshape(()) == 1.0
    return [jnp.where(skip, o, n.astype(o.dtype)) for n, o in zip(new, old)]


def _as(x, like):
    """A double hyperparameter in ``like``'s opmath type, as the CPU kernels cast them."""
    return jnp.asarray(x, jnp.float64).astype(opmath(like).dtype)


def _adam(
    params,
    grads,
    exp_avgs,
    exp_avg_sqs,
    max_exp_avg_sqs,
    steps,
    lr,
    beta1,
    beta2,
    weight_decay,
    eps,
    amsgrad,
    maximize,
    grad_scale=None,
    found_inf=None,
    *,
    adamw: bool,
):
    """Adam's step, or AdamW's (``adamw``: decoupled weight decay)."""
    unscaled = _unscale(grads, grad_scale)
    lr = _scalar(lr)
    new_p, new_m, new_v, new_vmax = [], [], [], []
    for i, (p, g) in enumerate(zip(params, unscaled)):
        po = opmath(p)
        step = steps[i].reshape(()).astype(jnp.float64)
        bc1 = 1 - jnp.power(jnp.float64(beta1), step)
        bc2_sqrt = jnp.sqrt(1 - jnp.power(jnp.float64(beta2), step))
        if maximize:
            g = -g
        if weight_decay != 0:
            if adamw:
                po = po - _as(lr, po) * _as(weight_decay, po) * po
            else:
                g = g + po * _as(weight_decay, po)
        m = _as(beta1, po) * opmath(exp_avgs[i]) + _as(1 - beta1, po) * g
        v = _as(beta2, po) * opmath(exp_avg_sqs[i]) + _as(1 - beta2, po) * g * g
        step_size = (jnp.asarray(lr, jnp.float64) / bc1).astype(po.dtype)
        if amsgrad:
            vmax = jnp.maximum(opmath(max_exp_avg_sqs[i]), v)
            new_vmax.append(vmax)
            denom = jnp.sqrt(vmax) / bc2_sqrt.astype(po.dtype) + _as(eps, po)
        else:
            denom = jnp.sqrt(v) / bc2_sqrt.astype(po.dtype) + _as(eps, po)
        new_p.append(po - step_size * m / denom)
        new_m.append(m)
        new_v.append(v)
    return (
        _skip(found_inf, new_p, params),
        _written_grads(unscaled, grads, grad_scale),
        _skip(found_inf, new_m, exp_avgs),
        _skip(found_inf, new_v, exp_avg_sqs),
        _skip(found_inf, new_vmax, max_exp_avg_sqs) if amsgrad else None,
    )


fused_adam_ = lower(aten._fused_adam_.default, aten._fused_adam_.tensor_lr, traced=_HYPER)(
    functools.partial(_adam, adamw=False)
)
fused_adamw_ = lower(aten._fused_adamw_.default, aten._fused_adamw_.tensor_lr, traced=_HYPER)(
    functools.partial(_adam, adamw=True)
)


@lower(aten._fused_sgd_.default, aten._fused_sgd_.tensor_lr, traced=("lr",))
def fused_sgd_(
    params,
    grads,
    momentum_buffers,
    weight_decay,
    momentum,
    lr,
    dampening,
    nesterov,
    maximize,
    is_first_step,
    grad_scale=None,
    found_inf=None,
):
    unscaled = _unscale(grads, grad_scale)
    lr = _scalar(lr)
    new_p, new_b = [], []
    for i, (p, g) in enumerate(zip(params, unscaled)):
        po = opmath(p)
        if maximize:
            g = -g
        if weight_decay != 0:
            g = g + po * _as(weight_decay, po)
        if momentum != 0:
            if is_first_step:
                b = g
            else:
                b = opmath(momentum_buffers[i]) * _as(momentum, po) + _as(1 - dampening, po) * g
            new_b.append(b)
            g = g + _as(momentum, po) * b if nesterov else b
        new_p.append(po - _as(lr, po) * g)
    return (
        _skip(found_inf, new_p, params),
        _written_grads(unscaled, grads, grad_scale),
        _skip(found_inf, new_b, momentum_buffers) if momentum != 0 else None,
    )


@lower(aten._fused_adagrad_.default, traced=("lr",))
def fused_adagrad_(
    params, grads, state_sums, state_steps, lr, lr_decay, weight_decay, eps, maximize, grad_scale=None, found_inf=None
):
    unscaled = _unscale(grads, grad_scale)
    lr = _scalar(lr)
    new_p, new_s = [], []
    for i, (p, g) in enumerate(zip(params, unscaled)):
        po = opmath(p)
        step = state_steps[i].reshape(()).astype(jnp.float64)
        if maximize:
            g = -g
        if weight_decay != 0:
            g = g + po * _as(weight_decay, po)
        clr = (jnp.asarray(lr, jnp.float64) / (1 + (step - 1) * lr_decay)).astype(po.dtype)
        s = opmath(state_sums[i]) + g * g
        new_s.append(s)
        new_p.append(po - clr * g / (jnp.sqrt(s) + _as(eps, po)))
    # the default overload marks state_steps as written (it is not); tensor_lr does not
    return (
        _skip(found_inf, new_p, params),
        _written_grads(unscaled, grads, grad_scale),
        _skip(found_inf, new_s, state_sums),
        None,
    )


@lower(aten._fused_adagrad_.tensor_lr)
def fused_adagrad_tensor_lr_(
    params, grads, state_sums, state_steps, lr, lr_decay, weight_decay, eps, maximize, grad_scale=None, found_inf=None
):
    return fused_adagrad_(
        params, grads, state_sums, state_steps, lr, lr_decay, weight_decay, eps, maximize, grad_scale, found_inf
    )[:3]
