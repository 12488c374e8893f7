"""Compute kernels for sparse COO tensors on jax, made of dense ops on their members.

A COO tensor of ``sparse_dim`` S holds ``indices`` (S, nnz) and ``values`` (nnz, *dense
sizes), both dense jax tensors; each kernel here composes dense jax ops on them (which are
lowered to JAX), so nothing reads element data on the host. Combinations a kernel does
not cover (a sparse times sparse product, a sparse ``self`` in ``addmm``...) run through
the sparse CPU fallback (NOTE [Sparse CPU fallback]).
"""

from __future__ import annotations

import math

import torch

from torch_jax.sparse._fallback import sparse_fallback

aten = torch.ops.aten
Tensor = torch.Tensor


def make(indices: Tensor, values: Tensor, size, coalesced: bool = False) -> Tensor:
    """A COO tensor of ``size`` with these members (not copied)."""
    return aten._sparse_coo_tensor_with_dims_and_tensors(
        indices.shape[0],
        values.dim() - 1,
        list(size),
        indices,
        values,
        dtype=values.dtype,
        layout=torch.sparse_coo,
        device=values.device,
        is_coalesced=coalesced,
    )


def linear(indices: Tensor, sizes) -> Tensor:
    """Row-major flat positions (nnz,) of the sparse ``indices`` (S, nnz) in ``sizes`` (S,)."""
    flat = indices[-1]
    stride = 1
    for d in range(len(sizes) - 2, -1, -1):
        stride *= sizes[d + 1]
        flat = flat + indices[d] * stride
    return flat


def unravel(flat: Tensor, sizes) -> Tensor:
    """The inverse of :func:`linear`: (S, nnz) indices of row-major positions ``flat``."""
    rows = []
    for s in reversed(sizes):
        rows.append(torch.remainder(flat, s))
        flat = torch.div(flat, s, rounding_mode="floor")
    return torch.stack(rows[::-1]) if rows else flat.new_zeros((0, flat.numel()))


def _sparse_sizes(t: Tensor):
    return list(t.shape[: t.sparse_dim()])


# NOTE [Coalescing on jax]: duplicates are found by sorting the flat positions of the
# indices (``unique(return_inverse=True)``, one host sync for the count of distinct
# positions) and their values summed with ``index_add``; the result is sorted as the
# CPU's is.
def _coalesce(self: Tensor) -> Tensor:
    indices, values = self._indices(), self._values()
    sizes = _sparse_sizes(self)
    if self._nnz() == 0 or self.sparse_dim() == 0:
        return make(indices.clone(), values.clone(), self.shape, coalesced=True)
    flat = linear(indices, sizes)
    unique, inverse = torch.unique(flat, sorted=True, return_inverse=True)
    summed = values.new_zeros((unique.numel(), *values.shape[1:]))  # (nnz', *dense)
    summed = (
        summed.index_add(0, inverse, values)
        if values.dtype != torch.bool
        else summed.index_put((inverse,), values, accumulate=True)
    )
    return make(unravel(unique, sizes), summed, self.shape, coalesced=True)


def _to_dense(self: Tensor, dtype=None, masked_grad=None) -> Tensor:
    values = self._values()
    out = values.new_zeros(self.shape)
    if self._nnz() > 0:
        out.index_put_(tuple(self._indices()), values, accumulate=True)
    return out if dtype is None else out.to(dtype)


def to_sparse(self: Tensor, sparse_dim: int | None = None) -> Tensor:
    """Dense -> COO (``Tensor.to_sparse``), and COO -> COO with another sparse_dim."""
    if self.layout == torch.sparse_coo:
        if sparse_dim is None or sparse_dim == self.sparse_dim():
            return self
        return to_sparse(self.to_dense(), sparse_dim)
    if self.layout != torch.strided:
        return sparse_fallback(aten._to_sparse.sparse_dim, self, sparse_dim)
    sparse_dim = self.dim() if sparse_dim is None else sparse_dim
    lead = self.reshape(math.prod(self.shape[:sparse_dim]), *self.shape[sparse_dim:])  # (N, *dense)
    nonzero = lead != 0
    if lead.dim() > 1:
        nonzero = nonzero.flatten(1).any(1)
    flat = torch.nonzero(nonzero).reshape(-1)  # (nnz,) sorted: the result is coalesced
    return make(unravel(flat, list(self.shape[:sparse_dim])), lead[flat], self.shape, coalesced=True)


def sparse_mask(self: Tensor, mask: Tensor) -> Tensor:
    """``self`` (dense or COO) at ``mask``'s indices, as a COO tensor."""
    if mask.layout != torch.sparse_coo or self.shape != mask.shape:
        return sparse_fallback(aten.sparse_mask.default, self, mask)
    dense = self.to_dense() if self.layout == torch.sparse_coo else self
    if dense.layout != torch.strided:
        return sparse_fallback(aten.sparse_mask.default, self, mask)
    indices = mask._indices()
    return make(indices.clone(), dense[tuple(indices)], mask.shape, mask.is_coalesced())


def spmm(rows: Tensor, cols: Tensor, values: Tensor, dense: Tensor, m: int) -> Tensor:
    """(m, n): the product of the sparse (m, k) matrix with these entries and ``dense`` (k, n)."""
    dtype = torch.result_type(values, dense)
    out = dense.new_zeros((m, dense.shape[1]), dtype=dtype)
    if values.numel() == 0:
        return out
    return out.index_add(0, rows, values.to(dtype)[:, None] * dense[cols].to(dtype))  # (nnz, n) into rows


def matmul(a: Tensor, b: Tensor):
    """``a @ b`` for one COO or CSR 2-d matrix and one dense one; None if not that."""
    from torch_jax.sparse import _csr

    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        return None
    if b.layout == torch.strided and a.layout in (torch.sparse_coo, torch.sparse_csr):
        rows, cols, values = entries(a) if a.layout == torch.sparse_coo else _csr.entries(a)
        return spmm(rows, cols, values, b, a.shape[0])
    if a.layout == torch.strided and b.layout in (torch.sparse_coo, torch.sparse_csr):
        rows, cols, values = entries(b) if b.layout == torch.sparse_coo else _csr.entries(b)
        return spmm(cols, rows, values, a.t(), b.shape[1]).t()  # (b^T a^T)^T
    return None


def entries(t: Tensor):
    """(rows, cols, values) of a 2-d COO matrix with no dense dims."""
    if t.sparse_dim() != 2:
        return None
    indices = t._indices()
    return indices[0], indices[1], t._values()


def addmm(self, mat1, mat2, *, beta=1, alpha=1):
    if self.layout != torch.strided or any(t.layout == torch.sparse_coo and t.dense_dim() for t in (mat1, mat2)):
        return sparse_fallback(aten.addmm.default, self, mat1, mat2, beta=beta, alpha=alpha)
    product = matmul(mat1, mat2)
    if product is None:
        return sparse_fallback(aten.addmm.default, self, mat1, mat2, beta=beta, alpha=alpha)
    if alpha != 1:
        product = product * alpha
    if beta == 0:  # (self is ignored, NaNs included, as on the CPU)
        return product.expand(self.shape if self.dim() == 2 else product.shape).clone()
    return torch.add(self * beta if beta != 1 else self, product)


def addmm_(self, mat1, mat2, *, beta=1, alpha=1):
    return self.copy_(addmm(self, mat1, mat2, beta=beta, alpha=alpha))


def mm(self, mat2):
    product = None
    if not any(t.layout == torch.sparse_coo and t.dense_dim() for t in (self, mat2)):
        product = matmul(self, mat2)
    return sparse_fallback(aten.mm.default, self, mat2) if product is None else product


def add(self, other, *, alpha=1):
    """dense + COO -> dense; COO + COO -> COO (indices concatenated, coalesced when both were)."""
    if self.shape != other.shape or self.layout not in (torch.strided, torch.sparse_coo):
        return sparse_fallback(aten.add.Tensor, self, other, alpha=alpha)
    if other.layout != torch.sparse_coo:
        return sparse_fallback(aten.add.Tensor, self, other, alpha=alpha)
    values = other._values() if alpha == 1 else other._values() * alpha
    if self.layout == torch.strided:
        dtype = torch.result_type(self, other)
        out = self.to(dtype, copy=True)
        return out.index_put_(tuple(other._indices()), values.to(dtype), accumulate=True)
    if self.sparse_dim() != other.sparse_dim():
        return sparse_fallback(aten.add.Tensor, self, other, alpha=alpha)
    dtype = torch.result_type(self, other)
    indices = torch.cat([self._indices(), other._indices()], 1)
    out = make(indices, torch.cat([self._values().to(dtype), values.to(dtype)]), self.shape)
    return out.coalesce() if self.is_coalesced() and other.is_coalesced() else out


def add_(self, other, *, alpha=1):
    if self.layout == torch.strided and other.layout == torch.sparse_coo and self.shape == other.shape:
        values = other._values() if alpha == 1 else other._values() * alpha
        return self.index_put_(tuple(other._indices()), values.to(self.dtype), accumulate=True)
    return self.copy_(add(self, other, alpha=alpha))


def sub(self, other, *, alpha=1):
    return add(self, other, alpha=-alpha)


def sub_(self, other, *, alpha=1):
    return add_(self, other, alpha=-alpha)


def _scalar(x) -> bool:
    return not isinstance(x, Tensor) or (x.dim() == 0 and x.layout == torch.strided)


def mul(self, other):
    """COO times a scalar (a 0-d tensor); other products run on the CPU."""
    if self.layout == torch.sparse_coo and _scalar(other):
        sparse, scalar = self, other
    elif other.layout == torch.sparse_coo and _scalar(self):
        sparse, scalar = other, self
    else:
        return sparse_fallback(aten.mul.Tensor, self, other)
    values = sparse._values() * scalar
    return make(sparse._indices().clone(), values, sparse.shape, sparse.is_coalesced())


def mul_(self, other):
    if self.layout == torch.sparse_coo and _scalar(other):
        self._values().mul_(other)
        return self
    return sparse_fallback(aten.mul_.Tensor, self, other)


def div(self, other, *, rounding_mode=None):
    if self.layout != torch.sparse_coo or not _scalar(other):
        return sparse_fallback(aten.div.Tensor_mode, self, other, rounding_mode=rounding_mode)
    src = self if rounding_mode is None else self.coalesce()  # (floor(a/c) + floor(b/c) != floor((a+b)/c))
    values = torch.div(src._values(), other, rounding_mode=rounding_mode)
    return make(src._indices().clone(), values, self.shape, src.is_coalesced())


def div_tensor(self, other):
    return div(self, other)


def sum(self, *, dtype=None):
    return self._values().sum(dtype=dtype)


def sum_dim(self, dim, keepdim=False, *, dtype=None):
    """As the CPU's: ``_sparse_sum`` (dense ops on the members), integers summed as int64,
    then the summed dims put back for ``keepdim``."""
    if dim is None:
        return sum(self, dtype=dtype)
    if dtype is None and not self.dtype.is_floating_point and not self.dtype.is_complex:
        dtype = torch.int64
    out = torch._sparse_sum(self, dim) if dtype is None else torch._sparse_sum(self, dim, dtype=dtype)
    if keepdim:
        dims = [d % self.dim() for d in ([dim] if isinstance(dim, int) else dim)] or range(self.dim())
        for d in sorted(dims):
            out = out.unsqueeze(d)
    return out


# Elementwise ops that map zero to zero: a COO result has the (coalesced) input's indices
# and the op applied to its values, as the CPU's kernels do.
UNARY = (
    "abs asin asinh atan atanh ceil deg2rad erf erfinv expm1 floor frac log1p neg rad2deg round sgn sign "
    "signbit sin sinh sqrt tan tanh trunc relu isnan isinf isposinf isneginf"
).split()


def unary(name: str):
    fn = getattr(torch, name)

    def kernel(self):
        src = self.coalesce()
        return make(src._indices().clone(), fn(src._values()), self.shape, True)

    def inplace(self):
        if not self.is_coalesced():
            self.copy_(self.coalesce())
        getattr(self._values(), name + "_")()
        return self

    return kernel, inplace


def nan_to_num(self, nan=None, posinf=None, neginf=None):
    src = self.coalesce()
    return make(src._indices().clone(), torch.nan_to_num(src._values(), nan, posinf, neginf), self.shape, True)


def pow_scalar(self, exponent):
    if exponent == 0:  # (not zero preserving: the CPU refuses it)
        return sparse_fallback(aten.pow.Tensor_Scalar, self, exponent)
    src = self.coalesce()
    return make(src._indices().clone(), torch.pow(src._values(), exponent), self.shape, True)


def kernels():
    """(op, kernel) for the COO key."""
    table = [
        (aten._coalesce.default, _coalesce),
        (aten._to_dense.default, _to_dense),
        (aten.sparse_mask.default, sparse_mask),
        (aten.addmm.default, addmm),
        (aten.addmm_.default, addmm_),
        (aten.mm.default, mm),
        (aten.add.Tensor, add),
        (aten.add_.Tensor, add_),
        (aten.sub.Tensor, sub),
        (aten.sub_.Tensor, sub_),
        (aten.mul.Tensor, mul),
        (aten.mul_.Tensor, mul_),
        (aten.div.Tensor, div_tensor),
        (aten.div.Tensor_mode, div),
        (aten.sum.default, sum),
        (aten.sum.dim_IntList, sum_dim),
        (aten.nan_to_num.default, nan_to_num),
        (aten.pow.Tensor_Scalar, pow_scalar),
    ]
    for name in UNARY:
        functional, inplace = unary(name)
        table.append((getattr(aten, name).default, functional))
        if hasattr(aten, name + "_"):
            table.append((getattr(aten, name + "_").default, inplace))
    return table
