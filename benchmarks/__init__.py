"""Benchmarks of torch_jax against PyTorch, side by side: ``python -m benchmarks``."""
