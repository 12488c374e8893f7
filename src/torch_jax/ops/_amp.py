"""GradScaler's two kernels (``torch.amp.GradScaler("jax")``), as PyTorch's CPU
kernels compute them (aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp)."""

from __future__ import annotations

import functools

import jax.numpy as jnp

from torch_jax.ops._promote import opmath
from torch_jax.ops._registry import aten, lower


@lower(aten._amp_foreach_non_finite_check_and_unscale_.default)
def amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale):
    """Each gradient times ``inv_scale`` (in opmath); ``found_inf`` set to 1 when any
    gradient holds an inf or a NaN, left as it was otherwise."""
    s = inv_scale.reshape(())  # a one-element float32 tensor
    bad = functools.reduce(jnp.logical_or, [~jnp.all(jnp.isfinite(g)) for g in grads], jnp.bool_(False))
    unscaled = [(opmath(g) * s).astype(g.dtype) for g in grads]
    return unscaled, jnp.where(bad, jnp.ones_like(found_inf), found_inf)


@lower(aten._amp_update_scale_.default)
def amp_update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    """After an inf: scale times ``backoff_factor``, tracker 0. Otherwise the tracker
    counts successful steps; at ``growth_interval`` the scale grows by ``growth_factor``
    (unless that overflows float32) and the tracker restarts."""
    found = found_inf.reshape(()) != 0
    wide = scale.astype(jnp.float64)  # the CPU multiplies by the double factors, then rounds
    backed_off = (wide * backoff_factor).astype(scale.dtype)
    grown = (wide * growth_factor).astype(scale.dtype)
    successful = growth_tracker + 1
    grow = successful == growth_interval
    new_scale = jnp.where(found, backed_off, jnp.where(grow & jnp.isfinite(grown), grown, scale))
    new_tracker = jnp.where(found | grow, jnp.zeros_like(growth_tracker), successful)
    return new_scale, new_tracker
