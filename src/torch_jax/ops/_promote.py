"""PyTorch's type promotion, applied to JAX values at trace time.

JAX's promotion differs from PyTorch's (PyTorch's 0-dim tensors do not promote
within a category; Python scalars, "wrapped numbers", never raise the result past
the default dtype). So lowerings never rely on JAX's: they ask PyTorch's own
``elementwise_dtypes`` about stand-ins of their operands and cast explicitly.
A Python scalar reaches a lowering as a weakly-typed 0-d tracer (or a Python number
when static); both stand for a wrapped number.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as KIND
from torch._prims_common import elementwise_dtypes

from torch_jax.tensor import _dtypes

DEFAULT = KIND.DEFAULT
INT_TO_FLOAT = KIND.INT_TO_FLOAT
ALWAYS_BOOL = KIND.ALWAYS_BOOL
COMPLEX_TO_FLOAT = KIND.COMPLEX_TO_FLOAT
BOOL_TO_LONG = KIND.BOOL_TO_LONG
NO_OPMATH = KIND.NO_OPMATH

_PY = {"b": True, "i": 1, "u": 1, "f": 1.0, "c": 1j}


def is_weak(x) -> bool:
    """A wrapped number: a Python scalar, or a weakly-typed 0-d JAX value."""
    if isinstance(x, (bool, int, float, complex)):
        return True
    return bool(getattr(jax.typeof(x), "weak_type", False)) and np.ndim(x) == 0


def torch_dtype(x) -> torch.dtype:
    """The torch dtype a JAX value or Python scalar stands for."""
    if isinstance(x, bool):
        return torch.bool
    if isinstance(x, int):
        return torch.int64
    if isinstance(x, float):
        return torch.get_default_dtype()
    if isinstance(x, complex):
        return torch.complex64 if torch.get_default_dtype() == torch.float32 else torch.complex128
    return _dtypes.to_torch(x.dtype)


def _stand_in(x):
    if x is None or isinstance(x, (bool, int, float, complex)):
        return x
    if is_weak(x):
        return _PY[np.dtype(x.dtype).kind]
    return _meta(_dtypes.to_torch(x.dtype), np.ndim(x))


@functools.cache
def _meta(dtype: torch.dtype, ndim: int) -> torch.Tensor:
    return torch.empty([1] * ndim, dtype=dtype, device="meta")


def dtypes(*args, kind=DEFAULT) -> tuple[np.dtype, np.dtype]:
    """(computation dtype, result dtype) of an elementwise op, as numpy dtypes."""
    stand_ins = [_stand_in(a) for a in args if a is not None]
    compute, result = elementwise_dtypes(*stand_ins, type_promotion_kind=kind)
    return _dtypes.to_np(compute), _dtypes.to_np(result)


def result_dtype(*args, kind=DEFAULT) -> np.dtype:
    return dtypes(*args, kind=kind)[1]


def cast(x, dtype: np.dtype):
    """``x`` as a JAX value of ``dtype`` (Python scalars included)."""
    if isinstance(x, (bool, int, float, complex)):
        return jnp.asarray(x, dtype)
    if x.dtype == dtype:
        return x
    if jnp.iscomplexobj(x) and not jnp.issubdtype(dtype, jnp.complexfloating):
        x = jnp.real(x)  # PyTorch drops the imaginary part (and warns on the host side)
    return x.astype(dtype)


def promote(*args, kind=DEFAULT):
    """The operands cast to the computation dtype, and the result dtype."""
    compute, result = dtypes(*args, kind=kind)
    return [None if a is None else cast(a, compute) for a in args], result


# the half types, which PyTorch's CPU kernels compute in float32 ("opmath")
LOW_PRECISION = (np.dtype(jnp.float16), np.dtype(jnp.bfloat16))


def opmath_dtype(dtype):
    """The dtype PyTorch's CPU kernels compute ``dtype`` in: float32 for the half types."""
    return np.dtype(jnp.float32) if np.dtype(dtype) in LOW_PRECISION else dtype


def opmath(x):
    """``x`` in its opmath dtype (half types widened to float32)."""
    return x.astype(jnp.float32) if x.dtype in LOW_PRECISION else x


def in_opmath(fn, *xs):
    """``fn(*xs)`` computed in opmath and cast back to the first operand's dtype."""
    if xs[0].dtype in LOW_PRECISION:
        return fn(*(opmath(x) for x in xs)).astype(xs[0].dtype)
    return fn(*xs)
