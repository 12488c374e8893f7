"""Command-line reports: ``python -m torch_jax.report coverage``."""
