"""The lowering table (NOTE [One lowering table] in _registry). Importing this package
fills it; each module holds one family of ops."""

from torch_jax.ops import (  # noqa: F401
    _activations,
    _conv,
    _core,
    _elementwise,
    _factories,
    _matmul,
    _nn,
    _reductions,
    _shape,
)
