"""Linear algebra: factorizations, solvers, inverses, determinants, norms of matrices.

The factorizations call jax.lax.linalg, which on the CPU runs the LAPACK routines
PyTorch's CPU kernels run (getrf, potrf, geqrf/orgqr, gesdd, syevd, geev), so pivots,
and the signs and phases of non-unique factors (Q, U/V, eigenvectors), are LAPACK's.

LAPACK's ``info`` outputs are computed from the factors (getrf: the first exactly-zero
pivot, 1-based; potrf: the order of the first leading minor that is not positive
definite); errors PyTorch raises from them inside a kernel go through ``_context.check``.

NOTE [LU of the transpose]: for a contiguous real ``A``, PyTorch's _linalg_det and
_linalg_slogdet factor ``A^T`` (a free F-contiguous view) instead of ``A``, and their
backward formulas read the returned LU that way.
The lowerings ask the executor whether ``A`` is contiguous (``_context.is_contiguous``,
part of the cache key) and factor the same matrix.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax
from jax._src.lax import linalg as _lla_private  # geqrf and ormqr are not re-exported by jax.lax.linalg
from jax.lax import linalg as lla

from torch_jax import _compat
from torch_jax.ops import _context, _reductions
from torch_jax.ops._registry import aten, cpu_fallback, lower

LinAlgError = torch.linalg.LinAlgError


def _mT(x):
    return jnp.swapaxes(x, -1, -2)


def _mH(x):
    return jnp.conj(_mT(x))


def _mm(a, b):
    return jnp.matmul(a, b, precision=lax.Precision.HIGHEST)


def _eye_like(x):
    return jnp.broadcast_to(jnp.eye(x.shape[-2], x.shape[-1], dtype=x.dtype), x.shape)


def _broadcast_batch(a, b):
    """``a`` and ``b`` with their batch dimensions (all but the last two) broadcast."""
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return jnp.broadcast_to(a, batch + a.shape[-2:]), jnp.broadcast_to(b, batch + b.shape[-2:])


def _first_true(flags):
    """1-based index of the first true flag along the last axis, 0 if none (int32)."""
    if flags.shape[-1] == 0:
        return jnp.zeros(flags.shape[:-1], jnp.int32)
    return jnp.where(jnp.any(flags, -1), jnp.argmax(flags, -1) + 1, 0).astype(jnp.int32)


def _raise_on_info(info, message: str):
    """PyTorch's _linalg_check_errors inside a kernel; ``message`` formats {value} (info)."""
    _context.check(jnp.any(info > 0), LinAlgError, message, jnp.max(info, initial=0))


# ---------------------------------------------------------------- LU


def _lu(a):
    """getrf: (LU, 1-based int32 pivots, permutation with a[perm] == L @ U, info)."""
    lu, piv, perm = lla.lu(a)
    k = min(a.shape[-2], a.shape[-1])
    info = _first_true(jnp.diagonal(lu, axis1=-2, axis2=-1)[..., :k] == 0)
    return lu, (piv + 1).astype(jnp.int32), perm, info


def _permutation(pivots, m: int):
    """LAPACK's 1-based row swaps as a permutation: ``perm`` with A[perm] == L @ U."""
    return lla.lu_pivots_to_permutation(pivots.astype(jnp.int32) - 1, m)


def _rows(x, perm):
    """``x[..., perm, :]`` for a batch of permutations."""
    return jnp.take_along_axis(x, perm[..., :, None], axis=-2)


def _lu_solve(lu, perm, b, adjoint: bool):
    """Solve ``A X = B`` (``A^H X = B`` if adjoint) for A = P L U given as (lu, perm)."""
    lu, b = _broadcast_batch(lu, b)
    perm = jnp.broadcast_to(perm, lu.shape[:-1])
    if not adjoint:
        y = lla.triangular_solve(lu, _rows(b, perm), left_side=True, lower=True, unit_diagonal=True)
        return lla.triangular_solve(lu, y, left_side=True, lower=False)
    # A^H = U^H L^H P^T: solve with U^H, then L^H, then undo the permutation
    y = lla.triangular_solve(lu, b, left_side=True, lower=False, transpose_a=True, conjugate_a=True)
    y = lla.triangular_solve(lu, y, left_side=True, lower=True, transpose_a=True, conjugate_a=True, unit_diagonal=True)
    inverse = jnp.argsort(perm, axis=-1)
    return _rows(y, inverse)


def _lu_solve_sided(lu, perm, b, left: bool, adjoint: bool):
    """linalg_lu_solve's four cases; ``X A = B`` is ``A^H X^H = B^H``."""
    if left:
        return _lu_solve(lu, perm, b, adjoint)
    return _mH(_lu_solve(lu, perm, _mH(b), not adjoint))


def _lu_of(a):
    """The LU PyTorch's solve/det kernels compute (NOTE [LU of the transpose])."""
    transposed = not jnp.iscomplexobj(a) and _context.is_contiguous(0)
    return _lu(_mT(a) if transposed else a), transposed


@lower(aten.linalg_lu_factor_ex.default)
def linalg_lu_factor_ex(a, pivot=True, check_errors=False):
    lu, piv, _, info = _lu(a)
    if check_errors:
        _raise_on_info(info, "linalg.lu_factor_ex: U[{value},{value}] is zero and using it on lu_solve would result "
                       "in a division by zero. If you still want to perform the factorization, consider calling "
                       "linalg.lu(A, pivot) or linalg.lu_factor_ex(A, pivot)")  # fmt: skip
    return lu, piv, info


def _unpack(lu, perm, m: int, n: int):
    """(P, L, U) of A = P L U from getrf's packed factor."""
    k = min(m, n)
    lower = jnp.tril(lu[..., :, :k], -1) + _eye_like(lu[..., :, :k])
    upper = jnp.triu(lu[..., :k, :])
    p = jnp.swapaxes(jax.nn.one_hot(perm, m, dtype=lu.dtype), -1, -2)  # P[perm[i], i] = 1
    return p, lower, upper


@lower(aten.linalg_lu.default)
def linalg_lu(a, pivot=True):
    m, n = a.shape[-2:]
    lu, _, perm, _ = _lu(a)
    return _unpack(lu, perm, m, n)


@lower(aten.lu_unpack.default)
def lu_unpack(lu, pivots, unpack_data=True, unpack_pivots=True):
    m, n = lu.shape[-2:]
    perm = _permutation(pivots, m) if unpack_pivots else jnp.zeros(lu.shape[:-2] + (m,), jnp.int32)
    p, lower, upper = _unpack(lu, perm, m, n)
    empty = jnp.zeros((0,), lu.dtype)
    return (p if unpack_pivots else empty), *((lower, upper) if unpack_data else (empty, empty))


@lower(aten.linalg_lu_solve.default)
def linalg_lu_solve(lu, pivots, b, left=True, adjoint=False):
    perm = _permutation(pivots, lu.shape[-1])
    return _lu_solve_sided(lu, perm, b, left, adjoint)


def _is_vector_rhs(a, b) -> bool:
    return b.ndim == 1 or (b.ndim == a.ndim - 1 and b.shape == a.shape[:-1])


@lower(aten._linalg_solve_ex.default)
def linalg_solve_ex(a, b, left=True, check_errors=False):
    lu, piv, perm, info = _lu(a)
    vector = _is_vector_rhs(a, b)
    b2 = b[..., None] if vector else b
    x = _lu_solve_sided(lu, perm, b2, left, False)
    if vector:
        x = x[..., 0]
    if check_errors:
        _raise_on_info(info, "torch.linalg.solve_ex: The solver failed because the input matrix is singular.")
    return x, lu, piv, info


@lower(aten.linalg_inv_ex.default)
def linalg_inv_ex(a, check_errors=False):
    lu, _, perm, info = _lu(a)
    inv = _lu_solve(lu, perm, _eye_like(a), False)
    if check_errors:
        _raise_on_info(info, "linalg.inv_ex: The diagonal element {value} is zero, the inversion could not be "
                       "completed because the input matrix is singular.")  # fmt: skip
    return inv, info


def _perm_sign(pivots):
    """(-1) ** (number of row swaps) of getrf's 1-based pivots."""
    swaps = jnp.sum(pivots != jnp.arange(1, pivots.shape[-1] + 1, dtype=pivots.dtype), -1)
    return 1 - 2 * (swaps % 2)


@lower(aten._linalg_det.default)
def linalg_det(a):
    (lu, piv, _, _), _ = _lu_of(a)
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    det = jnp.prod(diag, -1) * _perm_sign(piv).astype(a.dtype)
    return det, lu, piv


@lower(aten._linalg_slogdet.default)
def linalg_slogdet(a):
    (lu, piv, _, _), _ = _lu_of(a)
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    mag = jnp.abs(diag)
    unit = jnp.where(mag == 0, jnp.zeros_like(diag), diag / jnp.where(mag == 0, 1, mag).astype(diag.dtype))
    sign = jnp.prod(unit, -1) * _perm_sign(piv).astype(a.dtype)
    return sign, jnp.sum(jnp.log(mag), -1), lu, piv


# ---------------------------------------------------------------- Cholesky


def _cholesky_info(a):
    """potrf's info: the order of the first leading minor that is not positive definite,
    from an unblocked factorization of the lower triangle (only run when one failed)."""
    n = a.shape[-1]
    idx = jnp.arange(n)

    def step(k, carry):
        low, info = carry
        row = low[..., k, :]  # L[k, :k], zeros beyond
        d = jnp.real(a[..., k, k]) - jnp.sum(jnp.abs(row) ** 2, -1)
        bad = ~(d > 0)  # NaN counts as failure, as in LAPACK
        info = jnp.where((info == 0) & bad, k + 1, info)
        dk = jnp.sqrt(jnp.where(bad, 1, d)).astype(a.dtype)
        col = (a[..., :, k] - jnp.einsum("...ij,...j->...i", low, jnp.conj(row))) / dk[..., None]
        col = jnp.where(idx > k, col, jnp.where(idx == k, dk[..., None], 0))
        return low.at[..., :, k].set(col), info

    zeros = jnp.zeros(a.shape[:-2], jnp.int32)
    return lax.fori_loop(0, n, step, (jnp.zeros_like(a), zeros))[1]


def _cholesky(a, upper: bool):
    if a.size == 0:
        return a, jnp.zeros(a.shape[:-2], jnp.int32)
    low = jnp.tril(lla.cholesky(a, symmetrize_input=False))
    failed = jnp.any(jnp.isnan(low))
    zeros = jnp.zeros(a.shape[:-2], jnp.int32)
    info = lax.cond(failed, _cholesky_info, lambda _: zeros, a)
    return (_mH(low) if upper else low), info


_NOT_PD = ("The factorization could not be completed because the input is not positive-definite "
           "(the leading minor of order {value} is not positive-definite).")  # fmt: skip


@lower(aten.linalg_cholesky_ex.default)
def linalg_cholesky_ex(a, upper=False, check_errors=False):
    factor, info = _cholesky(a, upper)
    if check_errors:
        _raise_on_info(info, "linalg.cholesky_ex: " + _NOT_PD)
    return factor, info


@lower(_compat.aten_op("cholesky"))  # NOTE [aten.cholesky] (torch_jax/_compat)
def cholesky(a, upper=False):
    factor, info = _cholesky(a, upper)
    _raise_on_info(info, "cholesky: " + _NOT_PD)
    return factor


def _cholesky_factor_solve(factor, b, upper: bool):
    """Solve (L L^H) X = B, or (U^H U) X = B."""
    factor, b = _broadcast_batch(factor, b)
    if upper:
        y = lla.triangular_solve(factor, b, left_side=True, lower=False, transpose_a=True, conjugate_a=True)
        return lla.triangular_solve(factor, y, left_side=True, lower=False)
    y = lla.triangular_solve(factor, b, left_side=True, lower=True)
    return lla.triangular_solve(factor, y, left_side=True, lower=True, transpose_a=True, conjugate_a=True)


@lower(aten._cholesky_solve_helper.default)
def cholesky_solve_helper(b, factor, upper):
    return _cholesky_factor_solve(factor, b, upper)


@lower(aten.cholesky_inverse.default)
def cholesky_inverse(factor, upper=False):
    return _cholesky_factor_solve(factor, _eye_like(factor), upper)


# ---------------------------------------------------------------- triangular solves


def _tri_solve(a, b, *, upper: bool, left: bool, transpose=False, conjugate=False, unit=False):
    a, b = _broadcast_batch(a, b)
    return lla.triangular_solve(
        a, b, left_side=left, lower=not upper, transpose_a=transpose, conjugate_a=conjugate, unit_diagonal=unit
    )


@lower(aten.linalg_solve_triangular.default)
def linalg_solve_triangular(a, b, upper, left=True, unitriangular=False):
    return _tri_solve(a, b, upper=upper, left=left, unit=unitriangular)


@lower(aten.triangular_solve.default)
def triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    x = _tri_solve(a, b, upper=upper, left=True, transpose=transpose, unit=unitriangular)
    batch = x.shape[:-2]
    return x, jnp.broadcast_to(a, batch + a.shape[-2:])


# ---------------------------------------------------------------- QR, Householder


@lower(aten.linalg_qr.default)
def linalg_qr(a, mode="reduced"):
    if mode == "r":
        return jnp.zeros((0,), a.dtype), jnp.triu(lla.qr(a, full_matrices=False)[1])
    return lla.qr(a, full_matrices=(mode == "complete"))


@lower(aten.geqrf.default, trust_meta=False)
def geqrf(a):
    return _lla_private.geqrf(a)


@lower(aten.linalg_householder_product.default)
def linalg_householder_product(a, tau):
    return lla.householder_product(a, tau)


@lower(aten.ormqr.default)
def ormqr(a, tau, c, left=True, transpose=False):
    a, c = _broadcast_batch(a, c)
    tau = jnp.broadcast_to(tau, a.shape[:-2] + tau.shape[-1:])
    return _lla_private.ormqr(a, tau, c, left=left, transpose=transpose)


# ---------------------------------------------------------------- spectral


@lower(aten._linalg_svd.default)
def linalg_svd(a, full_matrices=False, compute_uv=True, driver=None):
    if not compute_uv:
        s = lla.svd(a, full_matrices=False, compute_uv=False)
        empty = jnp.zeros((0,), a.dtype)
        return empty, s, empty
    u, s, vh = lla.svd(a, full_matrices=full_matrices, compute_uv=True)
    return u, s, vh


@lower(aten._linalg_eigh.default)
def linalg_eigh(a, uplo="L", compute_v=True):
    v, w = lla.eigh(a, lower=(uplo.upper() == "L"), symmetrize_input=False)
    return w, (v if compute_v else jnp.zeros((0,), a.dtype))


# NOTE [Ops added in torch 2.14]: linalg_matrix_sqrth and linalg_polar exist from torch 2.14
# (_compat.aten_op: absent from the table before). Their backward formulas are made of ops
# lowered here already.


@lower(_compat.aten_op("linalg_matrix_sqrth"))
def linalg_matrix_sqrth(a):
    """The principal square root of a symmetric (Hermitian) matrix from its lower triangle,
    as PyTorch computes it: eigenvalues below 0 count as 0."""
    v, w = lla.eigh(a, lower=True, symmetrize_input=False)
    root = jnp.sqrt(jnp.maximum(w, 0)).astype(v.dtype)
    return _mm(v * root[..., None, :], _mH(v))


@lower(_compat.aten_op("linalg_polar"))
def linalg_polar(a):
    """A = U H: U = W V^H and H = V S V^H from the SVD A = W S V^H."""
    w, s, vh = lla.svd(a, full_matrices=False)
    return _mm(w, vh), _mm(_mH(vh) * s[..., None, :].astype(vh.dtype), vh)


@lower(aten.linalg_eig.default)
def linalg_eig(a):
    w, v = lla.eig(a, compute_left_eigenvectors=False)
    return w, v


@lower(aten._linalg_eigvals.default)
def linalg_eigvals(a):
    return lla.eig(a, compute_left_eigenvectors=False, compute_right_eigenvectors=False)[0]


@lower(aten.linalg_eigvals.out)
def linalg_eigvals_out(a, out):
    # linalg_eigvals is CompositeImplicitAutograd but its out= overload is a CPU kernel
    return linalg_eigvals(a)


# ---------------------------------------------------------------- least squares


@lower(aten.linalg_lstsq.default, trust_meta=False)
def linalg_lstsq(a, b, rcond=None, driver=None):
    """The minimum-norm least-squares solution (from the SVD); the other outputs as
    LAPACK's drivers fill them: rank (all but gels), singular values (gelsd/gelss), and
    the residuals (m > n and not gelsy; PyTorch leaves them empty for rank-deficient
    gelsd/gelss inputs, a value-dependent shape this assumes away)."""
    driver = driver or "gelsy"
    m, n = a.shape[-2:]
    vector = b.ndim == a.ndim - 1
    b2 = b[..., None] if vector else b
    a, b2 = _broadcast_batch(a, b2)
    real = jnp.real(a[..., :0, :0]).dtype
    u, s, vh = lla.svd(a, full_matrices=False)
    eps = float(np.finfo(real).eps)
    cutoff = (eps * max(m, n) if rcond is None or rcond < 0 else rcond) * s[..., :1]
    # gels assumes full rank; the others drop singular values below the cutoff
    keep = jnp.ones_like(s, bool) if driver == "gels" else s > cutoff
    inv_s = jnp.where(keep, 1 / jnp.where(keep, s, 1), 0).astype(a.dtype)
    if driver == "gels":  # LAPACK's QR (m >= n) or LQ (m < n) solve, rounding as it does
        if m >= n:
            q, r = lla.qr(a, full_matrices=False)
            x = lla.triangular_solve(r, _mm(_mH(q), b2), left_side=True, lower=False)
        else:
            q, r = lla.qr(_mH(a), full_matrices=False)
            y = lla.triangular_solve(r, b2, left_side=True, lower=False, transpose_a=True, conjugate_a=True)
            x = _mm(q, y)
    else:
        x = _mm(_mH(vh), inv_s[..., :, None] * _mm(_mH(u), b2))
    if m > n and driver != "gelsy":
        residuals = jnp.sum(jnp.abs(b2 - _mm(a, x)) ** 2, -2).astype(real)
    else:
        residuals = jnp.zeros((0,), real)
    rank = jnp.sum(keep, -1).astype(jnp.int64) if driver != "gels" else jnp.zeros((0,), jnp.int64)
    sv = s if driver in ("gelsd", "gelss") else jnp.zeros((0,), real)
    return (x[..., 0] if vector else x), residuals, rank, sv


# ---------------------------------------------------------------- other matrix functions


# PyTorch's matrix exponential (Bader, Blanes, Casas 2019, "Computing the Matrix
# Exponential with an Optimized Taylor Polynomial Approximation"): a Taylor polynomial of
# degree 1, 2, 4, 8, 12 or 18 chosen by the 1-norm, with scaling and squaring past the
# last bound. Reproduced step by step (not jax.scipy.linalg.expm's Pade approximant) so
# the float32 results agree to rounding.
_THETAS = {
    4: (1.192092800768788e-07, 5.978858893805233e-04, 5.116619363445086e-02,
        5.800524627688768e-01, 1.461661507209034e00, 3.010066362817634e00),
    8: (2.220446049250313e-16, 2.580956802971767e-08, 3.397168839976962e-04,
        4.991228871115323e-02, 2.996158913811580e-01, 1.090863719290036e00),
}  # fmt: skip
_T12 = (
    (9.0198e-16, 0.46932117595418237389, -0.20099424927047284052, -0.04623946134063071740),
    (5.31597895759871264183, 1.19926790417132231573, 0.01179296240992997031, 0.01108844528519167989),
    (0.18188869982170434744, 0.05502798439925399070, 0.09351590770535414968, 0.00610700528898058230),
    (-2.0861320e-13, -0.13181061013830184015, -0.02027855540589259079, -0.00675951846863086359),
)
_T18 = (
    (0.0, -1.00365581030144618291e-01, -8.02924648241156932449e-03, -8.92138498045729985177e-04, 0.0),
    (0.0, 3.97849749499645077844e-01, 1.36783778460411720168e00, 4.98289622525382669416e-01,
     -6.37898194594723280150e-04),
    (-1.09676396052962061844e01, 1.68015813878906206114e00, 5.71779846478865511061e-02,
     -6.98210122488052056106e-03, 3.34975017086070470649e-05),
    (-9.04316832390810593223e-02, -6.76404519071381882256e-02, 6.75961301770459654925e-02,
     2.95552570429315521194e-02, -1.39180257516060693404e-05),
    (0.0, 0.0, -9.23364619367118555360e-02, -1.69364939002081722752e-02, -1.40086798182036094347e-05),
)  # fmt: skip


def _combine(coef, mats):
    """sum_j coef[j] * mats[j], with the coefficients rounded to the matrices' real dtype."""
    real = jnp.real(mats[0]).dtype
    out = mats[0] * jnp.asarray(coef[0], real)
    for c, m in zip(coef[1:], mats[1:]):
        out = out + m * jnp.asarray(c, real)
    return out


def _taylor(a, degree: int):
    eye = _eye_like(a)
    a2 = _mm(a, a)
    if degree == 1:
        return eye + a
    if degree == 2:
        return eye + a + a2 / 2
    if degree == 4:
        return eye + a + _mm(a2, _combine((1 / 2.0, 1 / 6.0, 1 / 24.0), (eye, a, a2)))
    if degree == 8:
        r = 0.1330413469565007072504e2  # sqrt(177)
        x3 = 2.0 / 3.0
        x1, x2 = x3 * ((1.0 + r) / 88.0), x3 * ((1.0 + r) / 352.0)
        x4, x5 = (-271.0 + 29.0 * r) / (315.0 * x3), (-11.0 + 11.0 * r) / (1260.0 * x3)
        x6, x7 = (-99.0 + 11.0 * r) / (5040.0 * x3), (89.0 - r) / (5040.0 * x3)
        y2 = (857.0 - 58.0 * r) / 630.0
        a4 = _mm(a2, _combine((x1, x2), (a, a2)))
        a8 = _mm(_combine((x3, 1.0), (a2, a4)), _combine((x4, x5, x6, x7), (eye, a, a2, a4)))
        return _combine((1.0, 1.0, y2, 1.0), (eye, a, a2, a8))
    a3 = _mm(a, a2)
    if degree == 12:
        b = [_combine(row, (eye, a, a2, a3)) for row in _T12]
        b[2] = b[2] + _mm(b[3], b[3])
        return b[0] + _mm(b[1] + b[2], b[2])
    a6 = _mm(a3, a3)
    b = [_combine(row, (eye, a, a2, a3, a6)) for row in _T18]
    b[3] = b[3] + _mm(b[0], b[4])
    return b[1] + _mm(b[2] + b[3], b[3])


@lower(aten.linalg_matrix_exp.default)
def linalg_matrix_exp(a):
    n = a.shape[-1]
    if n <= 1:
        return jnp.exp(a)
    thetas = _THETAS[8 if jnp.real(a).dtype == jnp.float64 else 4]
    norm = jnp.max(jnp.sum(jnp.abs(a), -2), -1)[..., None, None]  # operator 1-norm, (B..., 1, 1)
    # NaN norms match no interval and leave NaN, as on CPU
    out = jnp.full_like(a, jnp.nan)
    lower_bound = -1.0
    for degree, theta in zip((1, 2, 4, 8, 12), thetas):
        out = jnp.where((lower_bound < norm) & (norm <= theta), _taylor(a, degree), out)
        lower_bound = theta
    # scaling and squaring: exp(A) = exp(A / 2^s)^(2^s)
    s = jnp.maximum(0, jnp.ceil(jnp.log2(norm / thetas[-1])))
    s = jnp.where(norm >= thetas[-2], s, 0).astype(jnp.int32)
    big = _taylor(a / (2.0**s).astype(a.dtype), 18)
    big = lax.fori_loop(0, jnp.max(s), lambda i, m: jnp.where(i < s, _mm(m, m), m), big)
    return jnp.where(norm >= thetas[-2], big, out)


@lower(aten.linalg_cross.default)
def linalg_cross(a, b, dim=-1):
    shape = jnp.broadcast_shapes(a.shape, b.shape)
    a, b = jnp.broadcast_to(a, shape), jnp.broadcast_to(b, shape)
    a0, a1, a2 = (jnp.take(a, i, axis=dim) for i in range(3))
    b0, b1, b2 = (jnp.take(b, i, axis=dim) for i in range(3))
    return jnp.stack([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], axis=dim)


# ---------------------------------------------------------------- pairwise distances


def _pnorm(diff, p: float, axis=-1):
    """The p-norm of ``diff`` along ``axis``, as PyTorch's distance kernels compute it."""
    a = jnp.abs(diff)
    if p == 0:
        return jnp.sum(a != 0, axis).astype(diff.dtype)
    if p == 1:
        return jnp.sum(a, axis)
    if p == 2:
        return jnp.sqrt(jnp.sum(a * a, axis))
    if p == float("inf"):
        return jnp.max(a, axis, initial=0)
    return jnp.sum(a**p, axis) ** (1 / p)


def _pnorm_grad(diff, g, dist, p: float):
    """d dist / d diff times ``g`` (diff (..., M); g and dist broadcast over M)."""
    g, dist = g[..., None], dist[..., None]
    zero = jnp.zeros_like(diff)
    if p == 0:
        return zero
    if p == 1:
        return jnp.sign(diff) * g
    if p == 2:
        return jnp.where(dist == 0, zero, g * diff / jnp.where(dist == 0, 1, dist))
    if p == float("inf"):
        return g * jnp.sign(diff) * (jnp.abs(diff) == dist)
    safe = jnp.where(dist == 0, 1, dist)
    if p < 2:
        v = jnp.sign(diff) * jnp.abs(diff) ** (p - 1) * g / safe ** (p - 1)
        return jnp.where((dist == 0) | ((diff == 0) & (p < 1)), zero, v)
    return jnp.where(dist == 0, zero, diff * jnp.abs(diff) ** (p - 2) * g / safe ** (p - 1))


def _batched(x1, x2):
    batch = jnp.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    return jnp.broadcast_to(x1, batch + x1.shape[-2:]), jnp.broadcast_to(x2, batch + x2.shape[-2:])


@lower(aten._cdist_forward.default)
def cdist_forward(x1, x2, p, compute_mode=None):
    x1, x2 = _batched(x1, x2)  # (B..., P, M), (B..., R, M)
    mode = compute_mode or 0
    if p == 2 and (mode == 1 or (mode == 0 and (x1.shape[-2] > 25 or x2.shape[-2] > 25))):
        # PyTorch's _euclidean_dist: |a|^2 - 2 a.b + |b|^2 in one matmul, clamped before the sqrt
        n1 = jnp.sum(x1 * x1, -1, keepdims=True)
        n2 = jnp.sum(x2 * x2, -1, keepdims=True)
        a = jnp.concatenate([-2 * x1, n1, jnp.ones_like(n1)], -1)
        b = jnp.concatenate([x2, jnp.ones_like(n2), n2], -1)
        return jnp.sqrt(jnp.maximum(_mm(a, _mT(b)), 1e-30))
    return _pnorm(x1[..., :, None, :] - x2[..., None, :, :], p)  # (B..., P, R)


@lower(aten._cdist_backward.default)
def cdist_backward(grad, x1, x2, p, dist):
    """The gradient for x1 with x1 expanded to the broadcast batch (autograd sums it back),
    except that an empty problem gives zeros of x1's own shape, as PyTorch's kernel does."""
    shape = x1.shape
    x1, x2 = _batched(x1, x2)
    if 0 in x1.shape[:-2] or 0 in (x1.shape[-2], x2.shape[-2], x1.shape[-1]):
        return jnp.zeros(shape, x1.dtype)
    diff = x1[..., :, None, :] - x2[..., None, :, :]  # (B..., P, R, M)
    return jnp.sum(_pnorm_grad(diff, grad, dist, p), -2)


def _pairs(n: int):
    return np.triu_indices(n, 1)


@lower(aten._pdist_forward.default)
def pdist_forward(x, p=2):
    i, j = _pairs(x.shape[0])
    return _pnorm(x[i] - x[j], p)


@lower(aten._pdist_backward.default)
def pdist_backward(grad, x, p, pdist):
    i, j = _pairs(x.shape[0])
    c = _pnorm_grad(x[i] - x[j], grad, pdist, p)  # (pairs, M)
    return jnp.zeros_like(x).at[i].add(c).at[j].add(-c)


@lower(aten.norm.ScalarOpt_dim, aten.norm.ScalarOpt_dim_dtype, static=("p",))
def norm(x, p, dim, keepdim=False, dtype=None):
    # torch.norm's vector norms are linalg.vector_norm's; an empty dim reduces everything
    return _reductions.linalg_vector_norm(x, 2 if p is None else p, list(dim) or None, keepdim, dtype)


@lower(aten.trace.default)
def trace(a):
    acc = jnp.int64 if jnp.issubdtype(a.dtype, jnp.integer) or a.dtype == jnp.bool_ else a.dtype
    return jnp.trace(a.astype(acc))


cpu_fallback(aten.linalg_ldl_factor_ex.default, "Bunch-Kaufman (sytrf) pivoting has no JAX implementation")
cpu_fallback(aten.linalg_ldl_solve.default, "solves with sytrf's packed factor, which has no JAX implementation")
