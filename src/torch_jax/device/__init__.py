"""The device layer: PrivateUse1 registration as ``jax`` and the ``torch.jax`` module."""
