"""vLLM's compilation on ``jax``: the compiler vLLM's piecewise backend calls for each
piece of the model's graph.

NOTE [vLLM's compilation on jax]: vLLM compiles a model's forward with its own Dynamo
backend (``VllmBackend``), which splits the graph at attention and hands each piece to a
``CompilerInterface`` (Inductor's on CUDA). On jax the pieces go to torch_jax's
``torch.compile`` backend (AOTAutograd, then one XLA computation a piece); attention
runs between them as vLLM's opaque custom ops, which call this platform's backend. No
artifact handle: vLLM's own compile cache is not used (the persistent compilation cache
holds the XLA computations)."""

from __future__ import annotations

from vllm.compilation.compiler_interface import CompilerInterface


class JaxCompiler(CompilerInterface):
    name = "jax"

    def compile(self, graph, example_inputs, compiler_config, compile_range, key=None):
        from torch_jax.compile import backend

        return backend(graph, example_inputs), None
