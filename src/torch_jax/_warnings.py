"""Warning categories (importable without initializing the device)."""


class FallbackWarning(UserWarning):
    """An aten op ran on the CPU because it has no JAX lowering."""
