"""The map between torch dtypes and JAX (numpy) dtypes."""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import torch

_PAIRS = [
    (torch.float64, jnp.float64),
    (torch.float32, jnp.float32),
    (torch.float16, jnp.float16),
    (torch.bfloat16, jnp.bfloat16),
    (torch.int64, jnp.int64),
    (torch.int32, jnp.int32),
    (torch.int16, jnp.int16),
    (torch.int8, jnp.int8),
    (torch.uint8, jnp.uint8),
    (torch.uint16, jnp.uint16),
    (torch.uint32, jnp.uint32),
    (torch.uint64, jnp.uint64),
    (torch.bool, jnp.bool_),
    (torch.complex64, jnp.complex64),
    (torch.complex128, jnp.complex128),
    (torch.float8_e4m3fn, ml_dtypes.float8_e4m3fn),
    (torch.float8_e5m2, ml_dtypes.float8_e5m2),
    (torch.float8_e4m3fnuz, ml_dtypes.float8_e4m3fnuz),
    (torch.float8_e5m2fnuz, ml_dtypes.float8_e5m2fnuz),
]

TO_NP: dict[torch.dtype, np.dtype] = {t: np.dtype(j) for t, j in _PAIRS}
TO_TORCH: dict[np.dtype, torch.dtype] = {np.dtype(j): t for t, j in _PAIRS}

# dtypes that torch.Tensor.numpy() cannot export; their bytes cross as this dtype
NUMPY_CARRIER = {
    torch.bfloat16: torch.int16,
    torch.uint16: torch.int16,
    torch.uint32: torch.int32,
    torch.uint64: torch.int64,
    torch.float8_e4m3fn: torch.uint8,
    torch.float8_e5m2: torch.uint8,
    torch.float8_e4m3fnuz: torch.uint8,
    torch.float8_e5m2fnuz: torch.uint8,
}


class UnsupportedDtype(TypeError):
    """A dtype the jax device has no JAX dtype for (complex32): the user's error, raised as is."""


def unsupported(dtype: torch.dtype, op: str = "") -> TypeError:
    where = f" (in {op})" if op else ""
    return UnsupportedDtype(
        f"torch_jax: dtype {dtype} is not supported on the jax device{where}; "
        f"supported dtypes: {', '.join(str(d).replace('torch.', '') for d in TO_NP)}"
    )


def to_np(dtype: torch.dtype) -> np.dtype:
    try:
        return TO_NP[dtype]
    except KeyError:
        raise unsupported(dtype) from None


def to_torch(dtype) -> torch.dtype:
    return TO_TORCH[np.dtype(dtype)]


def tensor_to_numpy(t: torch.Tensor) -> np.ndarray:
    """A numpy view (no copy) of a CPU tensor, for every dtype including bfloat16."""
    carrier = NUMPY_CARRIER.get(t.dtype)
    if carrier is None:
        return t.numpy()
    return t.view(carrier).numpy().view(TO_NP[t.dtype])


def numpy_to_tensor(a: np.ndarray) -> torch.Tensor:
    """A CPU tensor sharing memory with a writable numpy array, for every dtype."""
    dtype = TO_TORCH[a.dtype]
    carrier = NUMPY_CARRIER.get(dtype)
    if carrier is None:
        return torch.from_numpy(a)
    return torch.from_numpy(a.view(TO_NP[carrier])).view(dtype)
