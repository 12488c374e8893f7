"""Warning categories (importable without initializing the device)."""


class FallbackWarning(UserWarning):
    """An aten op ran on the CPU because it has no JAX lowering."""


class RecompileWarning(UserWarning):
    """An op or fused graph keeps compiling for new shapes (NOTE [Shapes that keep
    changing] in runtime/_recompiles)."""


class RegistrationWarning(UserWarning):
    """torch_jax could not register the jax device, or runs beside an untested torch or
    jax (NOTE [Autoload never breaks torch] in _compat)."""


class CompileWarning(UserWarning):
    """About ``torch.compile`` on the jax device: the default backend's graphs on ``jax`` go
    to the ``jax`` backend (NOTE [The default torch.compile on jax] in compile/_route)."""
