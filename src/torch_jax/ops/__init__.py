"""The lowering table (NOTE [One lowering table] in _registry). Importing this package
fills it; each module holds one family of ops."""

from torch_jax.ops import (  # noqa: F401
    _activations,
    _amp,
    _conv,
    _core,
    _elementwise,
    _factories,
    _fft,
    _foreach,
    _grid_sample,
    _indexing,
    _interp,
    _linalg,
    _losses,
    _matmul,
    _nn,
    _optim,
    _pad,
    _pool,
    _reductions,
    _rnn,
    _shape,
    _sort,
    _special,
    _transformer,
)
