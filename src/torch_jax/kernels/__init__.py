"""Custom kernels and JAX interop: JAX (and Pallas) functions as PyTorch operators on
``jax`` (NOTE [JAX functions as operators]), a user's function in place of an aten op's
lowering (NOTE [Overriding a lowering]), and tensors and JAX arrays each as the other
(NOTE [Tensors and JAX arrays share buffers])."""

from torch_jax.device import _start

# (the device's kernels are registered before any user op joins the lowering table: the
# registration walks the table once, registering aten kernels)
_start.start()

from torch_jax.kernels._interop import call_jax, from_jax, to_jax  # noqa: E402
from torch_jax.kernels._jax_op import infer_schema, jax_op  # noqa: E402
from torch_jax.kernels._override import check_override, override  # noqa: E402

__all__ = ["call_jax", "check_override", "from_jax", "infer_schema", "jax_op", "override", "to_jax"]
