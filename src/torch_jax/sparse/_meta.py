"""Sparse kernels borrowed from the CPU: the ones that only build or read metadata.

NOTE [Metadata-only sparse kernels]: a sparse tensor on ``jax`` is PyTorch's own
``SparseTensorImpl`` (or ``SparseCsrTensorImpl``) whose member tensors (indices,
values, crow/col indices) are dense jax tensors. The CPU's kernels for constructing
such a tensor, reading its members and resizing it never read element data: they set
and return member tensors and sizes, or call other ops through the dispatcher (which
come back to the jax kernels). Those kernels are registered for the jax sparse keys
as a redispatch to the CPU key. A CPU kernel that reads the data (through ``data_ptr``
or accessors) must never be borrowed: a jax tensor's data pointer is a fake address
(NOTE [The storage box] in tensor/_storage.py) and reading it crashes the process.
Each op below was checked, one process per op, to give the CPU's metadata without
touching element data.
"""

from __future__ import annotations

import torch
from torch._C import DispatchKey, DispatchKeySet

aten = torch.ops.aten

# COO ops whose SparseCPU kernel only builds, reads or resizes metadata
COO = (
    aten._sparse_coo_tensor_with_dims.default,
    aten._sparse_coo_tensor_with_dims_and_tensors.default,
    aten._indices.default,
    aten._values.default,
    aten.indices.default,
    aten.values.default,
    aten._nnz.default,
    aten.sparse_dim.default,
    aten.dense_dim.default,
    aten._dimI.default,
    aten._dimV.default,
    aten.is_coalesced.default,
    aten._coalesced_.default,
    aten.sparse_resize_.default,
    aten.sparse_resize_and_clear_.default,
    aten.empty.memory_format,
    aten.zero_.default,
    aten.copy_sparse_to_sparse_.default,
    aten.copy_.default,
    aten.clone.default,
    aten.resize_as_sparse_.default,
    aten.empty_like.default,
    aten.unsqueeze.default,  # (indices and values concatenated with zeros by dense ops)
)

# CSR (compressed) ops whose SparseCsrCPU kernel only builds, reads or resizes metadata
CSR = (
    aten.crow_indices.default,
    aten.col_indices.default,
    aten.ccol_indices.default,
    aten.row_indices.default,
    aten.values.default,
    aten._nnz.default,
    aten.sparse_dim.default,
    aten.dense_dim.default,
    aten.empty.memory_format,
    aten.resize_as_sparse_.default,
    aten.copy_.default,
    aten.clone.default,
    aten.empty_like.default,
)

_KEYS = {
    "SparsePrivateUse1": DispatchKeySet(DispatchKey.SparseCPU),
    "SparseCsrPrivateUse1": DispatchKeySet(DispatchKey.SparseCsrCPU),
}


def borrowed(op, key: str):
    """``op``'s CPU kernel for the sparse layout of ``key``, called with jax tensors."""
    cpu = _KEYS[key]

    def kernel(*args, **kwargs):
        return op.redispatch(cpu, *args, **kwargs)

    kernel.__name__ = f"{op}_borrowed".replace(".", "_")
    return kernel


def kernels():
    """(op, kernel, key) for every borrowed metadata kernel."""
    return [(op, borrowed(op, "SparsePrivateUse1"), "SparsePrivateUse1") for op in COO] + [
        (op, borrowed(op, "SparseCsrPrivateUse1"), "SparseCsrPrivateUse1") for op in CSR
    ]
