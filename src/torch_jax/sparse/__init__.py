"""Sparse COO and CSR tensors on the jax device."""


def install(lib) -> None:
    """Register the sparse kernels (SparsePrivateUse1, SparseCsrPrivateUse1) into ``lib``."""
