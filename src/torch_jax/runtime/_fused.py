"""Fused eager: ops are recorded into a pending graph and run as one XLA computation
when a value is needed.

NOTE [Fused eager]: in fused mode the executor builds each op's cache key and argument
list exactly as in strict mode (NOTE [Strict eager]), so it raises the same errors at
the same op, but instead of running the op's compiled computation it appends the op's
traced function (the pure function strict mode compiles) and its arguments to the
device's pending graph. The op's results are ``Pending`` arrays (tensor/_storage) that
sit in the storage boxes like real arrays: later ops take them as inputs (a reference
to a node's output), views and in-place writes work on them the same way.

Anything that needs a value computes the graph (a *materialization*): a host transfer
(``.item()``, ``.cpu()``, ``print``, ``bool()``), an op with a data-dependent shape, the
CPU fallback, ``torch.jax.synchronize()``, the explicit step marker
``torch_jax.mark_step()`` (and the end of ``Optimizer.step()``: NOTE [Optimizer steps mark
steps]), leaving fused mode, and the size cap (``config.fused_max_ops``).
Value checks (an index out of range) run inside the graph and raise at the next call
that waits for it (NOTE [Deferred value checks]), as CUDA's device-side asserts surface
at a later synchronization; strict mode raises at the op. The graph runs as one
jitted function of its inputs (the storages' arrays, Python scalars, random keys)
whose outputs are the pending arrays some storage still holds (weak references tell).
Compiled graphs are cached by structure: the sequence of op entries (each keyed by op,
static arguments, shapes and dtypes) and how their arguments connect. Python scalars
(learning rates, step counts) and random keys are inputs, so a training loop reaches
a fixed set of graphs and compiles nothing after warm-up; random ops draw the same keys
as in strict mode, so a seed gives the same numbers in both modes.
"""

from __future__ import annotations

import collections
import contextlib
import sys
import threading
import time
import weakref

import jax
import jax.numpy as jnp
import numpy as np
from jax._src.array import ArrayImpl as _ArrayImpl  # (checked before isinstance(v, jax.Array), which is slower)
from torch.optim.optimizer import register_optimizer_step_post_hook

from torch_jax._config import config
from torch_jax.device import _state as _devices
from torch_jax.ffi import _cpu_blas
from torch_jax.runtime import _compile_cache, _profiler, _recompiles, _stats, _xla_options
from torch_jax.tensor._storage import Pending

_counters = _stats.counters
materializations: collections.Counter = collections.Counter()

pending = False  # some graph holds unrun ops (a module global: the executor reads it per op)
_graphs: dict[int, _Graph] = {}  # device index -> its pending graph
_compiled: dict = {}  # graph structure -> compiled computation
recent: collections.deque = collections.deque(maxlen=64)  # weak references to the graphs run last (benchmarks/profile)
_weakref = weakref.ref
_lock = threading.RLock()


class Outputs(list):
    """The pending results of one recorded op (what the executor's finish receives)."""


class _Graph:
    __slots__ = ("index", "nodes", "inputs", "input_ids", "outputs", "checked")

    def __init__(self, index: int):
        self.index = index
        self.nodes: list = []  # (entry, argument refs)
        self.inputs: list = []
        self.input_ids: dict = {}  # id(array) -> input position (each array passed once)
        self.outputs: list = []  # weak references to the Pending results
        self.checked: list = []  # nodes whose value checks (index bounds) run with the graph

    def flush(self, reason: str) -> None:
        with _lock:
            if self.nodes:
                _run(self, reason)


def _graph(index: int) -> _Graph:
    g = _graphs.get(index)
    if g is None:
        g = _graphs[index] = _Graph(index)
    return g


def record(entry, dyn) -> Outputs:
    """Append one op to its device's graph; its results, pending."""
    global pending
    with _lock:
        g = _graph(entry.index)
        inputs, input_ids = g.inputs, g.input_ids
        refs = []
        for v in dyn:
            cls = v.__class__
            if cls is Pending:
                if v.value is None and v.graph is g:
                    refs.append((v.node, v.out))
                    continue
                v = v.resolve("another device's graph")
                cls = v.__class__
            if cls is _ArrayImpl or isinstance(v, jax.Array):
                if v.is_deleted():  # (raised here, at the op, as strict mode does)
                    raise RuntimeError("Array has been deleted")
                i = input_ids.get(id(v))
                if i is None:
                    i = input_ids[id(v)] = len(inputs)
                    inputs.append(v)
            else:  # a Python scalar or a random key: always its own input (its value varies)
                i = len(inputs)
                inputs.append(v)
            refs.append(i)
        avals = entry.out_avals
        if avals is None:  # an entry compiled in strict mode
            avals = entry.out_avals = _compile_cache.outside_dynamo(
                jax.eval_shape, _compile_cache.fresh(entry.traced), *dyn
            )
        node = len(g.nodes)
        g.nodes.append((entry, tuple(refs)))
        if entry.checks:
            g.checked.append(node)
        outs = Outputs()
        weak = g.outputs
        for k, a in enumerate(avals):
            p = Pending(g, node, k, a.shape, a.dtype)
            outs.append(p)
            weak.append(_weakref(p))
        pending = True
        _counters["fused_ops"] += 1
        if node + 1 >= config.fused_max_ops:
            _run(g, "size cap")
        return outs


def concrete(v):
    """``v``, computed if it is pending."""
    return v.resolve("mode change") if v.__class__ is Pending else v


def _run(g: _Graph, reason: str) -> None:
    global pending
    alive = []
    for w in g.outputs:
        p = w()
        if p is not None and p.value is None:
            alive.append(p)
    nodes = tuple(g.nodes)
    checks = [
        (n, k)
        for n in g.checked
        for k in range(len(nodes[n][0].out_avals) - len(nodes[n][0].checks), len(nodes[n][0].out_avals))
    ]
    _devices.last.pop(g.index, None)  # (the results run here will stand for the device's work)
    donated = _donatable(g.inputs, alive)
    if donated:  # NOTE [Donation]: each storage's new value first, in the donated inputs' order
        rank = {i: n for n, i in enumerate(donated)}
        last = len(rank)
        alive.sort(key=lambda p: rank.get(p.replaced, last))
    wanted = tuple((p.node, p.out) for p in alive)
    # (each entry's key fixes its inputs' shapes, dtypes and kinds, and its value checks)
    key = (g.index, nodes, wanted, donated, config.cpu_blas)
    compiled = _compiled.get(key)
    if compiled is None and _recompiles.op_by_op(nodes, key):
        results, flags = _op_by_op(g.inputs, nodes, wanted, checks)
    else:
        if compiled is None:
            compiled = _compile_cache.outside_dynamo(_compile, g, nodes, wanted, checks, donated, key, reason)
        else:
            _counters["graph_cache_hits"] += 1
            compiled.used = True
        _counters["donated_buffers"] += len(donated)
        recent.append(_weakref(compiled.fn))
        if _profiler.recording:  # NOTE [Device time in torch.profiler]
            n = len(nodes)
            results = _profiler.graph(
                f"jax::fused_graph ({n} ops)", f"jit(fused graph of {n} ops)", g.index, compiled.fn, g.inputs
            )
        else:
            results = compiled.fn(*g.inputs)
        flags = results[-1] if checks else None
    for p, r in zip(alive, results):
        p.value = r
    _devices.last[g.index] = results
    materializations[reason] += 1
    _counters["graphs_run"] += 1
    _counters["graph_ops"] += len(nodes)
    del _graphs[g.index]
    pending = bool(_graphs)
    if config.launch_blocking:
        jax.block_until_ready(results)
    earlier = len(_deferred)  # (checks of the graphs before this one, which is dispatched now)
    if checks:
        _deferred.append(([c for n in g.checked for c in nodes[n][0].checks], flags))
    check_deferred(None if reason not in _ASYNC else earlier)


def _compile(g: _Graph, nodes, wanted, checks, donated, key, reason: str) -> _CompiledGraph:
    _counters["graphs_compiled"] += 1
    start, before = time.perf_counter(), _compile_cache.allocated()
    if config.debug >= 1:
        print(f"[torch_jax] compiling a fused graph of {len(nodes)} ops ({reason})")
    fn = jax.jit(
        _replay(nodes, wanted, checks),
        out_shardings=_devices.sharding(g.index),
        donate_argnums=donated,
    )
    with _cpu_blas.in_graph(), _xla_options.lowering():  # NOTE [One MLIR context for many lowerings]
        lowered = fn.lower(*g.inputs)
    # NOTE [Cheap compilation of small computations] (runtime/_xla_options)
    made = [a.shape for e, _ in nodes for a in e.out_avals]  # (every op result of the graph)
    fn = lowered.compile(compiler_options=_xla_options.compile_options(g.index, g.inputs, made, lowered))
    del lowered  # (what JAX kept of the trace goes with it, before the cost is read)
    compiled = _CompiledGraph(fn, _compile_cache.allocated() - before)
    _compile_cache.admit(_compiled, key, compiled, "graph")  # NOTE [Bounded compile cache]
    _recompiles.note_graph(nodes, g.inputs, time.perf_counter() - start)
    return compiled


def _op_by_op(inputs, nodes, wanted, checks):
    """Run a graph's ops one at a time through their own computations (NOTE [One-off
    graphs run op by op] in runtime/_recompiles): its wanted results, and the value
    checks' flags (a list, one pair per check)."""
    _counters["graphs_op_by_op"] += 1
    env = {}
    for n, (entry, refs) in enumerate(nodes):
        args = [inputs[r] if r.__class__ is int else env[r] for r in refs]
        for k, o in enumerate(entry.run(args)):
            env[(n, k)] = o
    return [env[w] for w in wanted], [env[c] for c in checks] if checks else None


class _CompiledGraph:
    """A graph's executable in the compile cache (NOTE [Bounded compile cache])."""

    __slots__ = ("fn", "used", "cost")

    def __init__(self, fn, cost: int):
        self.fn, self.used, self.cost = fn, True, cost


def _donatable(inputs, alive) -> tuple:
    """Positions of the input arrays the graph may overwrite.

    NOTE [Donation]: an array
    that only the graph's input list still references belonged to a storage that an
    in-place op of the graph has since rewritten (or to a temporary); nothing can read it
    after the graph, so XLA may write an output of the same shape and dtype into its
    buffer (an optimizer step updates its parameters and moments in place instead of
    holding two copies). The count is CPython's reference count: the input list, the local
    ``v`` and getrefcount's own argument; any storage box, view, saved tensor, event
    or cache holding the array adds to it and keeps the array.

    JAX gives each donated buffer to the first output of its shape and dtype, in the
    order of the donated inputs, so the outputs are ordered to put each storage's new
    value (``Pending.replaced``: the input its storage held, set when the op's result
    went into the storage box) where its old buffer goes. Otherwise a parameter's buffer
    went to a gradient of the same shape computed earlier in the graph, and XLA copied
    the parameter to keep reading it until its update (GPT-2's step: 52 parameter copies,
    25 now; the graph 2-3% faster)."""
    free = collections.Counter((tuple(p.shape), p.dtype) for p in alive)
    donated = []
    for i in range(len(inputs)):
        v = inputs[i]
        if isinstance(v, jax.Array) and sys.getrefcount(v) <= 3:  # (record resolves every Pending input)
            aval = (tuple(v.shape), v.dtype)
            if free[aval] > 0:
                free[aval] -= 1
                donated.append(i)
    return tuple(donated)


def _replay(nodes, wanted, checks):
    """The graph's function: its wanted results, then (if any op checks values) one
    array of all its checks' flags, read with one transfer (NOTE [Deferred value checks])."""

    def graph(*inputs):
        env = {}
        for n, (entry, refs) in enumerate(nodes):
            args = [inputs[r] if r.__class__ is int else env[r] for r in refs]
            for k, o in enumerate(entry.traced(*args)):
                env[(n, k)] = o
        outs = tuple(env[w] for w in wanted)
        return outs + (jnp.stack([env[c] for c in checks]),) if checks else outs

    return graph


# NOTE [Deferred value checks]: a graph's value checks (an index out of range) are one
# output of the graph, each check's (failed, value) pair stacked (one host transfer per
# graph: GPT-2 generation has 10 checks per token), and reading them waits for the
# graph. A step marker or the size cap only dispatches its graph and leaves the checks
# here; the next graph run reads them (after dispatching its own graph), and so does
# everything that waits anyway (a host transfer, synchronize, data-dependent shapes,
# the CPU fallback), raising the first error in program order. So the device runs a
# training step while Python records the next one, and an error in step N surfaces at
# the marker of step N + 1 or at the first wait before it, as CUDA's device-side
# asserts surface at a later call. A compiled graph's checks wait here too, and so do a
# strict op's under ``config.deferred_checks`` (vLLM's worker: its eager indexing ops
# would otherwise wait for the step in flight, NOTE [vLLM's asynchronous scheduling on
# jax]). An event's record dispatches and waits for nothing; a copy to the host without
# blocking reads its own array only (NOTE [Copies to the host without blocking]).
_ASYNC = frozenset({"step marker", "optimizer step", "size cap", "event"})
_deferred: list = []  # (checks, flags) of graphs run, in order


def check_deferred(count: int | None = None) -> None:
    """Raise the first failed value check of the graphs that ran (of the first ``count``
    of them), waiting for them."""
    for _ in range(len(_deferred) if count is None else count):
        checks, flags = _deferred.pop(0)
        raise_failed_checks(checks, flags)


def raise_failed_checks(checks, flags):
    """``flags``: each check's (failed, value) pair, as arrays (strict mode) or one
    stacked array (a fused graph's)."""
    rows = np.asarray(flags).tolist() if isinstance(flags, jax.Array) else [np.asarray(f).tolist() for f in flags]
    for (exc_type, message), (bad, value) in zip(checks, rows):
        if bad:
            raise exc_type(message.format(value=value))


def flush_all(reason: str) -> None:
    with _lock:
        for g in list(_graphs.values()):
            _run(g, reason)
        if reason not in _ASYNC:
            check_deferred()


def set_mode(mode: str) -> None:
    """``strict`` or ``fused`` (leaving fused mode computes what is pending; setting
    ``torch_jax.config.mode`` directly does the same at the next op)."""
    config.mode = mode
    if mode != "fused":
        flush_all("mode change")


@contextlib.contextmanager
def fused():
    """Run the block in fused mode, then return to the mode before it."""
    before = config.mode
    set_mode("fused")
    try:
        yield
    finally:
        set_mode(before)


def mark_step() -> None:
    """The end of a training step: run what is pending (asynchronously)."""
    flush_all("step marker")


_devices.before_synchronize.append(lambda: flush_all("synchronize"))
# (an event's record dispatches what is recorded and waits for nothing, checks included)
_devices.before_event.append(lambda: flush_all("event"))


def _after_optimizer_step(optimizer, args, kwargs) -> None:
    """NOTE [Optimizer steps mark steps]: the end of ``Optimizer.step()`` is the end of a
    training step, so in fused mode it dispatches what is pending, as
    ``torch_jax.mark_step()`` does. An unchanged training loop then runs one graph per
    step, with the same structure every step, instead of graphs cut wherever the size
    cap falls (a new structure, so a new compilation, nearly every time)."""
    if pending and config.mode == "fused":
        flush_all("optimizer step")


register_optimizer_step_post_hook(_after_optimizer_step)
