"""Sparse COO and CSR tensors on the jax device.

A sparse jax tensor is PyTorch's own sparse tensor whose member tensors (indices and
values, or compressed indices and values) are dense jax tensors. Kernels for the sparse
jax dispatch keys come in three kinds:

- metadata kernels borrowed from the CPU (constructors, member access, resizing):
  NOTE [Metadata-only sparse kernels] in ``_meta.py``;
- compute kernels written as dense jax ops on the members (``_coo.py``, ``_csr.py``):
  conversions, coalescing, elementwise ops that keep sparsity, sums, matrix products;
- the sparse CPU fallback for everything else (``_fallback.py``), warned and counted as
  the dense fallback is.
"""

from __future__ import annotations

import torch

from torch_jax.sparse import _coo, _csr, _meta
from torch_jax.sparse._fallback import sparse_fallback

COO_KEY, CSR_KEY = "SparsePrivateUse1", "SparseCsrPrivateUse1"
_libs: list = []
KERNELS: dict = {}  # (op, key) -> kind ("metadata" or "kernel"), for the coverage report


def install(lib) -> None:
    """Register the sparse kernels (SparsePrivateUse1, SparseCsrPrivateUse1) into ``lib``."""
    for op, kernel, key in _meta.kernels():
        _impl(lib, op, kernel, key, "metadata")
    for op, kernel in _coo.kernels():
        _impl(lib, op, kernel, COO_KEY, "kernel")
    for op, kernel in _csr.kernels():
        _impl(lib, op, kernel, CSR_KEY, "kernel")
    for op, kernel in _csr.converters():  # (dense -> COO or CSR dispatches on the dense key)
        _impl(lib, op, kernel, "PrivateUse1", "kernel")
        if (op, COO_KEY) not in KERNELS:
            _impl(lib, op, kernel, COO_KEY, "kernel")
    fallback = torch.library.Library("_", "IMPL")  # noqa: TOR901 (a backend fallback is global)
    for key in (COO_KEY, CSR_KEY):
        fallback.fallback(sparse_fallback, key)
    _libs.append(fallback)


def _impl(lib, op, kernel, key: str, kind: str) -> None:
    lib.impl(op, kernel, key)
    KERNELS[op, key] = kind
