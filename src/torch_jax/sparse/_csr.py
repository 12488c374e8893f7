"""Compute kernels for sparse CSR tensors on jax, made of dense ops on their members.

A 2-d CSR matrix (m, k) holds ``crow_indices`` (m + 1,), ``col_indices`` (nnz,) and
``values`` (nnz,), dense jax tensors. Kernels cover 2-d matrices without batch or dense
dimensions; other compressed tensors (batched, hybrid, CSC, BSR) run through the sparse
CPU fallback (NOTE [Sparse CPU fallback]).
"""

from __future__ import annotations

import torch

from torch_jax.sparse import _coo
from torch_jax.sparse._fallback import sparse_fallback

aten = torch.ops.aten
Tensor = torch.Tensor


def make(crow: Tensor, col: Tensor, values: Tensor, size) -> Tensor:
    """A CSR tensor of ``size`` with these members (not copied)."""
    return aten._sparse_compressed_tensor_unsafe(
        crow, col, values, list(size), dtype=values.dtype, layout=torch.sparse_csr, device=values.device
    )


def _plain(t: Tensor) -> bool:
    """A 2-d CSR matrix without batch or dense dimensions."""
    return t.layout == torch.sparse_csr and t.dim() == 2 and t.dense_dim() == 0


def rows_of(crow: Tensor, nnz: int) -> Tensor:
    """The row (nnz,) of each stored entry: entry j is in row r when crow[r] <= j < crow[r + 1]."""
    positions = torch.arange(nnz, device=crow.device, dtype=crow.dtype)
    return torch.searchsorted(crow[1:], positions, right=True)


def entries(t: Tensor):
    """(rows, cols, values) of a plain CSR matrix."""
    col = t.col_indices()
    return rows_of(t.crow_indices(), col.numel()), col, t.values()


def from_entries(rows: Tensor, cols: Tensor, values: Tensor, size) -> Tensor:
    """CSR from entries sorted by row, then column."""
    bounds = torch.arange(size[0] + 1, device=rows.device, dtype=rows.dtype)
    crow = torch.searchsorted(rows, bounds)  # (m + 1,) entries before each row
    return make(crow, cols, values, size)


def _to_dense(self, dtype=None, masked_grad=None):
    if not _plain(self):
        return sparse_fallback(aten._to_dense.default, self, dtype, masked_grad)
    rows, cols, values = entries(self)
    out = values.new_zeros(self.shape)
    if values.numel():
        out.index_put_((rows, cols), values, accumulate=True)
    return out if dtype is None else out.to(dtype)


def to_csr(self: Tensor, dense_dim=None) -> Tensor:
    """Dense or COO 2-d matrix -> CSR."""
    if dense_dim not in (None, 0) or self.dim() != 2:
        return sparse_fallback(aten._to_sparse_csr.default, self, dense_dim)
    if self.layout == torch.sparse_csr:
        return self
    if self.layout == torch.strided:
        coo = _coo.to_sparse(self)
    elif self.layout == torch.sparse_coo and self.dense_dim() == 0:
        coo = self.coalesce()
    else:
        return sparse_fallback(aten._to_sparse_csr.default, self, dense_dim)
    indices = coo._indices()
    return from_entries(indices[0], indices[1].clone(), coo._values().clone(), self.shape)


def to_sparse(self, layout=None, blocksize=None, dense_dim=None):
    """``_to_sparse`` for dense, COO and CSR inputs, to COO or CSR."""
    if blocksize is None and dense_dim in (None, 0):
        if layout == torch.sparse_csr:
            return to_csr(self)
        if layout in (None, torch.sparse_coo):
            if self.layout == torch.sparse_csr and _plain(self):
                rows, cols, values = entries(self)
                return _coo.make(torch.stack([rows, cols]), values.clone(), self.shape, coalesced=True)
            if self.layout != torch.sparse_csr:
                return _coo.to_sparse(self)
    return sparse_fallback(aten._to_sparse.default, self, layout=layout, blocksize=blocksize, dense_dim=dense_dim)


def to_sparse_dim(self, sparse_dim):
    if self.layout == torch.sparse_csr:
        coo = to_sparse(self)
        return coo if sparse_dim == 2 else _coo.to_sparse(coo, sparse_dim)
    return _coo.to_sparse(self, sparse_dim)


def _same(t: Tensor, values: Tensor) -> Tensor:
    return make(t.crow_indices().clone(), t.col_indices().clone(), values, t.shape)


def unary(name: str):
    fn = getattr(torch, name)

    def kernel(self):
        return _same(self, fn(self.values()))

    def inplace(self):
        getattr(self.values(), name + "_")()
        return self

    return kernel, inplace


def mul(self, other):
    if self.layout == torch.sparse_csr and _coo._scalar(other):
        return _same(self, self.values() * other)
    if other.layout == torch.sparse_csr and _coo._scalar(self):
        return _same(other, other.values() * self)
    return sparse_fallback(aten.mul.Tensor, self, other)


def mul_(self, other):
    if self.layout == torch.sparse_csr and _coo._scalar(other):
        self.values().mul_(other)
        return self
    return sparse_fallback(aten.mul_.Tensor, self, other)


def add(self, other, *, alpha=1):
    """dense + CSR -> dense."""
    if self.layout != torch.strided or not _plain(other) or self.shape != other.shape:
        return sparse_fallback(aten.add.Tensor, self, other, alpha=alpha)
    rows, cols, values = entries(other)
    dtype = torch.result_type(self, other)
    values = values if alpha == 1 else values * alpha
    return self.to(dtype, copy=True).index_put_((rows, cols), values.to(dtype), accumulate=True)


def add_(self, other, *, alpha=1):
    if self.layout != torch.strided:
        return sparse_fallback(aten.add_.Tensor, self, other, alpha=alpha)
    return self.copy_(add(self, other, alpha=alpha))


def addmm(self, mat1, mat2, *, beta=1, alpha=1):
    if any(t.layout == torch.sparse_csr and not _plain(t) for t in (mat1, mat2)):
        return sparse_fallback(aten.addmm.default, self, mat1, mat2, beta=beta, alpha=alpha)
    return _coo.addmm(self, mat1, mat2, beta=beta, alpha=alpha)


def mm(self, mat2):
    product = _coo.matmul(self, mat2) if all(_plain(t) or t.layout == torch.strided for t in (self, mat2)) else None
    return sparse_fallback(aten.mm.default, self, mat2) if product is None else product


def sum(self, *, dtype=None):
    return self.values().sum(dtype=dtype)


def sum_dim(self, dim, keepdim=False, *, dtype=None):
    """A CSR sum over dims keeps them (the CPU refuses ``keepdim=False``); computed dense."""
    if not keepdim or not _plain(self):
        return sparse_fallback(aten.sum.dim_IntList, self, dim, keepdim, dtype=dtype)
    return to_csr(self.to_dense().sum(dim, keepdim=True, dtype=dtype))


def csr_sum(self, dim, keepdim=False, dtype=None):
    if not keepdim or not _plain(self):
        return sparse_fallback(aten._sparse_csr_sum.dim_dtype, self, dim, keepdim, dtype=dtype)
    return to_csr(self.to_dense().sum(dim, keepdim=True, dtype=dtype))


def kernels():
    """(op, kernel) for the CSR key."""
    table = [
        (aten._to_dense.default, _to_dense),
        (aten._to_sparse.default, to_sparse),
        (aten._to_sparse.sparse_dim, to_sparse_dim),
        (aten._to_sparse_csr.default, to_csr),
        (aten.addmm.default, addmm),
        (aten.mm.default, mm),
        (aten.add.Tensor, add),
        (aten.add_.Tensor, add_),
        (aten.mul.Tensor, mul),
        (aten.mul_.Tensor, mul_),
        (aten.sum.default, sum),
        (aten.sum.dim_IntList, sum_dim),
        (aten._sparse_csr_sum.dim_dtype, csr_sum),
    ]
    for name in (*_coo.UNARY, "angle"):
        functional, inplace = unary(name)
        table.append((getattr(aten, name).default, functional))
        if hasattr(aten, name + "_"):
            table.append((getattr(aten, name + "_").default, inplace))
    return table


def converters():
    """(op, kernel) shared by the dense and COO keys: conversions to COO and CSR."""
    return [
        (aten._to_sparse.default, to_sparse),
        (aten._to_sparse.sparse_dim, to_sparse_dim),
        (aten._to_sparse_csr.default, to_csr),
    ]
