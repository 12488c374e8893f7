"""The ``"jax"`` backend of ``torch.compile``: Dynamo's graph -> AOTAutograd -> the
lowering table -> one XLA computation per graph (NOTE [Compiled graphs] in compile/_graph).

AOTAutograd traces the forward and backward aten graphs and decomposes only the ops that
neither the lowering table nor the compiled graphs' own rules (compile/_rules) run:
PyTorch's decompositions of those, chosen from ``torch._decomp``'s table, so an op that
eager mode lowers runs the same lowering compiled.
"""

from __future__ import annotations

import functools
import itertools

import torch

_names = itertools.count()


@functools.cache
def _decompositions() -> dict:
    from torch._decomp import decomposition_table

    from torch_jax.compile import _graph, _rules
    from torch_jax.ops._registry import LOWERINGS

    keep = set(LOWERINGS) | set(_rules.RULES) | set(_graph._RANDOM_FACTORIES) | set(_graph._EAGER_AS)
    table = {}
    for op, fn in decomposition_table.items():
        if op in keep or not isinstance(op, torch._ops.OpOverload):
            continue
        if _graph._functional_of(op) is not None or _graph._per_tensor(op) is not None:
            continue  # (run by the lowering of its in-place or per-tensor op)
        table[op] = fn
    return table


def _compiler(kind: str):
    def compile_graph(gm, example_inputs):
        from torch_jax.compile._graph import Program

        return Program(gm, example_inputs, f"{kind}{next(_names)}")

    return compile_graph


def backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """``torch.compile(model, backend="jax")``."""
    from torch._dynamo.backends.common import aot_autograd

    from torch_jax.device._start import start as initialize

    initialize()
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    compiler = aot_autograd(
        # (as Inductor partitions: the backward recomputes cheap values rather than saving
        # them; GPT-2's step held 533 MB instead of 606 at the same speed, measured)
        partition_fn=min_cut_rematerialization_partition,
        fw_compiler=_compiler("forward"),
        bw_compiler=_compiler("backward"),
        inference_compiler=_compiler("inference"),
        decompositions=_decompositions(),
        keep_inference_input_mutations=True,
    )
    return compiler(gm, example_inputs)
