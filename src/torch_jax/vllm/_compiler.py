"""vLLM's compilation on ``jax``: the compiler vLLM's piecewise backend calls for each
piece of the model's graph.

NOTE [vLLM's compilation on jax]: vLLM compiles a model's forward with its own Dynamo
backend (``VllmBackend``), which splits the graph at attention and hands each piece to a
``CompilerInterface`` (Inductor's on CUDA). On jax the pieces go to torch_jax's
``torch.compile`` backend (AOTAutograd, then one XLA computation a piece); attention
runs between them as vLLM's opaque custom ops, which call this platform's backend.

Under vLLM's AOT compile (its default) each piece is saved in vLLM's artifact as bytes:
vLLM calls ``serialize()`` on the piece, as on Inductor's ``AOTCompiledArtifact``; the
piece is AOTAutograd's, whose entry holds torch_jax's programs (NOTE [Compiled graphs in
AOTAutograd's cache] in compile/_graph), so it is wrapped in that class, which turns the
entry into bytes and back. A second start then loads the model's pieces, and the XLA
computations come from the persistent compilation cache. No handle for vLLM's older
per-piece cache (``load``)."""

from __future__ import annotations

from vllm.compilation.compiler_interface import CompilerInterface


class JaxCompiler(CompilerInterface):
    name = "jax"

    def compile(self, graph, example_inputs, compiler_config, compile_range, key=None):
        from torch_jax.compile import backend

        compiled = backend(graph, example_inputs)
        if getattr(compiled, "serialize", None) is not None:  # (under torch's AOT compile)
            from torch._inductor.standalone_compile import AOTCompiledArtifact

            compiled = AOTCompiledArtifact(compiled)
        return compiled, None
