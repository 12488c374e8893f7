"""XLA custom calls: C++ handlers (csrc/) built with the machine's compiler against jaxlib's
FFI headers the first time they are needed, and the JAX primitives that lower to them on
XLA:CPU (matrix products through PyTorch's BLAS, the fusion barrier). A layer of its own,
below the lowering table (ops/) that binds the primitives and above tensor/."""
