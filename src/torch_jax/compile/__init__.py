"""``torch.compile`` on the ``jax`` device: the ``"jax"`` backend (NOTE [Compiled graphs]
in compile/_graph) and the route that sends the default backend's graphs on ``jax``
there (compile/_backend)."""

from torch_jax.compile._backend import backend

__all__ = ["backend"]
