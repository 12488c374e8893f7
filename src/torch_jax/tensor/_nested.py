"""Strided nested tensors on the jax device."""


def install(lib) -> None:
    """Register the strided nested tensor kernels (NestedTensorPrivateUse1) into ``lib``."""
