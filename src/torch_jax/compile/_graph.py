"""One AOTAutograd graph (a forward, a backward or an inference graph) as XLA computations.

NOTE [Compiled graphs]: ``torch.compile(backend="jax")`` hands each aten graph that
AOTAutograd makes to :class:`Program`. A call builds the key of its inputs exactly as an
eager op does (runtime/_executor's ``_describe``: shape and dtype of a tensor that is its
whole storage, the full view of any other, the value of each int), looks up the
computation compiled for that key, and calls it with the storages' arrays, so inputs are
read in place and outputs come back as the device's own arrays: no copies in or out. A
new key traces the graph once into one ``jax.jit`` computation: each node runs the
eager executor's lowering of its op (NOTE [One lowering table] in ops/_registry), with
its output dtypes from the node's fake value as the Meta kernel gives them in eager mode;
views and the few graph-only ops come from compile/_rules. Each distinct set of input
shapes compiles once (XLA specializes shapes; Dynamo's symbolic sizes arrive as ints),
so dynamic shapes are never wrong, only compiled again per shape.

NOTE [Input mutations in compiled graphs]: the backend asks AOTAutograd to keep input
mutations in the graph (``keep_inference_input_mutations``), as Inductor does: a
mutation that autograd does not need to see (an optimizer's parameter and state updates
under ``no_grad``, BatchNorm's running statistics) is a ``copy_`` of the new value into
the input at the end of the graph. Here that is one more output: the storage's new
array, written through the input's view inside the computation (as an eager in-place
op writes, NOTE [Strict eager]), and put into the storage box after the call, so every
view of that storage sees it. Other mutations AOTAutograd applies itself after the call.

NOTE [Random ops in compiled graphs]: a random node takes the next key of the device's
generator at each call, in graph order, as the eager op would at that point; so
``torch.manual_seed`` makes compiled runs repeatable, and a graph with the same random
ops as eager code draws the same numbers.

NOTE [Compiled graphs in AOTAutograd's cache]: torch's AOT compile
(``torch.compile(fn, fullgraph=True).aot_compile(...)`` under
``torch._dynamo.config.enable_aot_compile``, ``save_compiled_function`` and
``torch.compiler.load_compiled_function``; vLLM's default) and AOTAutograd's cache in its
bundled form (``bundled_autograd_cache``) pickle what AOTAutograd made: its wrappers'
metadata and the compiler's forward and backward, which must be Inductor's ``OutputCode``
(AOTAutograd asserts it). So a :class:`Program` is one, as ``RegionalOutputCode`` is for
a graph module. ``prepare_for_serialization``, on AOTAutograd's copy of it (the live
program runs on), keeps the name and the aten graph, pickled with torch's
``GraphPickler`` (its nodes' values are fake tensors, which the lowerings read); nothing
compiled: an executable is for one input key and does not pickle. ``post_compile``,
which AOTAutograd calls on the loaded entry, unpickles the graph into the loading fake
mode and builds the program again, so a call compiles as a new program's first call
does, or loads the same computation from the persistent cache (NOTE [Persistent
compilation cache]): same graph, same module name and HLO. The aten graph, not the HLO,
is what is kept, so a saved program lowers again with the torch_jax that loads it.

Anything the table cannot run (an op with no lowering or rule, a graph that mixes
devices) runs the graph op by op through the eager executor instead, where the CPU
fallback catches what is missing: that warns once per graph with the reason, is counted
(``compiled_graphs_eager``) and is an error under ``TORCH_JAX_FALLBACK=error``.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import sys
import time
import warnings
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax._src.array import ArrayImpl as _ArrayImpl
from torch._inductor.output_code import OutputCode

from torch_jax._config import config
from torch_jax._warnings import FallbackWarning
from torch_jax.compile import _cache, _collectives, _rules
from torch_jax.device import _state as _devices
from torch_jax.ffi import _cpu_blas
from torch_jax.ops import _context, _registry
from torch_jax.ops._promote import cast
from torch_jax.ops._registry import LOWERINGS
from torch_jax.runtime import _compile_cache, _executor, _fused, _profiler, _recompiles, _stats, _xla_options
from torch_jax.tensor import _dtypes, _storage

_counters = _stats.counters
recent: collections.deque = collections.deque(
    maxlen=64
)  # weak references to the executables run last (benchmarks/profile)
aten = torch.ops.aten
Tensor = torch.Tensor
_TO_NP = _dtypes.TO_NP


class Unsupported(Exception):
    """A graph the XLA route cannot run (its message names the op or construct)."""


# ------------------------------------------------------------ how each node runs


def _schema_args(op, args, kwargs) -> list:
    """The node's arguments in schema order, defaults filled in."""
    out = []
    positional = iter(args)
    n = len(args)
    for i, a in enumerate(op._schema.arguments):
        if not a.kwarg_only and i < n:
            out.append(next(positional))
        elif a.name in kwargs:
            out.append(kwargs[a.name])
        elif a.has_default_value():
            out.append(a.default_value)
        else:
            out.append(None)
    return out


def _functional_of(op):
    """The in-place op whose lowering computes ``op``, a functional op AOTAutograd made
    by functionalizing an in-place one (``uniform`` from ``uniform_``), or None."""
    packet = getattr(aten, op._schema.name.split("::")[1] + "_", None)
    inplace = getattr(packet, op._overloadname, None) if packet is not None else None
    spec = _executor.SPECS.get(inplace) if inplace is not None else None
    return inplace if spec is not None and spec.inplace else None


# factories that eager mode reaches as ``empty`` then an in-place random op
_RANDOM_FACTORIES = {
    aten.rand_like.default: (aten.uniform_.default, (0.0, 1.0)),
    aten.randn_like.default: (aten.normal_.default, (0.0, 1.0)),
    aten.rand.default: (aten.uniform_.default, (0.0, 1.0)),
    aten.randn.default: (aten.normal_.default, (0.0, 1.0)),
}


# ops that reach a PrivateUse1 device's kernel as another op in eager mode: the graph's
# op -> (the op eager mode lowers, its arguments from the graph op's)
_EAGER_AS = {
    aten.convolution.default: (aten.convolution_overrideable.default, lambda a: a),
    aten.convolution_backward.default: (aten.convolution_backward_overrideable.default, lambda a: a[:3] + a[4:]),
    # (a graph's values are arrays, not views with a conjugate bit: the conjugate is made;
    # a complex rotary embedding's backward holds it, TorchTitan's)
    aten._conj.default: (aten._conj_physical.default, lambda a: a),
}


# NOTE [Ops that read their context]: some libraries' ops read state that is not among
# their arguments: vLLM's attention and KV-cache write take a layer's name and find the
# layer's cache and the step's batch metadata in vLLM's forward context. Such an op
# registers a ContextLowering here. At each call of a graph holding it, ``gather`` turns
# the op's arguments that the call knows (its graph inputs and constants; None for a value
# computed inside the graph) into the tensors and ints it reads: the tensors are described
# and passed as the graph's inputs are (one input for a tensor gathered twice, so a write
# is seen by a later read), and the ints as run-time values, outside the computation's key.
# ``lower`` computes the op from its arguments' and the gathered values' JAX values and
# returns the new values of the gathered tensors it writes (their positions in ``writes``),
# which go into their storages after the call, as input mutations do (NOTE [Input mutations
# in compiled graphs]); a written storage that nothing else holds is donated, so a cache
# is updated in place. ``gather`` returning None runs that call op by op (the op's eager
# kernel then reads the context itself: vLLM's profiling run, which has no metadata).
CONTEXT_OPS: dict = {}


class ContextLowering:
    """How a compiled graph runs an op that reads its context (NOTE [Ops that read their
    context]): ``gather(arguments) -> [tensor | int] | None``; ``lower(arguments, gathered)
    -> (result, {index: new value})``, with ``arguments`` a dict by the op's argument names
    (for a mutating op, its result is a dict of its mutated arguments' new values)."""

    def __init__(self, gather, lower, writes: tuple = ()):
        self.gather, self.lower, self.writes = gather, lower, tuple(writes)


def plan_node(node):
    """How ``node`` runs: ("lower", spec), ("rule", fn), ("as", spec, arguments),
    ("random_factory", spec, arguments), ("functional", spec), ("foreach", spec), or
    raises Unsupported naming the op."""
    op = node.target
    if op in _EAGER_AS:
        other, arrange = _EAGER_AS[op]
        return ("as", _executor.SPECS[other], arrange)
    if op in LOWERINGS:
        spec = _executor.SPECS.get(op)
        if spec is not None and not spec.writes:
            return ("lower", spec)
    if op in _rules.RULES:
        return ("rule", _rules.RULES[op])
    if op in _RANDOM_FACTORIES:
        inplace, args = _RANDOM_FACTORIES[op]
        return ("random_factory", _executor.SPECS[inplace], args)
    inplace = _functional_of(op) if isinstance(op, torch._ops.OpOverload) else None
    if inplace is not None:
        return ("functional", _executor.SPECS[inplace])
    per_op = _per_tensor(op)
    if per_op is not None:
        return ("foreach", _executor.SPECS[per_op])
    raise Unsupported(f"{op} has no JAX lowering")


# a foreach overload -> the overloads of the per-tensor op that take one element's arguments
_PER_TENSOR_OVERLOADS = {
    "List": ("Tensor",),
    "Tensor": ("Tensor",),
    "Scalar": ("Scalar", "Tensor"),
    "ScalarList": ("Scalar", "Tensor"),
    "ScalarAndTensor": ("Scalar",),
    "default": ("default",),
}


def _per_tensor(op):
    """The lowered per-tensor op of a functional foreach op that the table lacks
    (``_foreach_pow.ScalarAndTensor`` -> ``pow.Scalar``): PyTorch's CPU runs every foreach
    op as that loop (NOTE [Foreach ops] in ops/_foreach)."""
    name = op._schema.name.split("::")[1]
    if not name.startswith("_foreach_") or name.endswith("_"):
        return None
    packet = getattr(aten, name[len("_foreach_") :], None)
    for overload in _PER_TENSOR_OVERLOADS.get(op._overloadname, ()):
        per_op = getattr(packet, overload, None) if packet is not None else None
        spec = _executor.SPECS.get(per_op) if per_op is not None else None
        if spec is not None and per_op in LOWERINGS and not spec.writes:
            return per_op
    return None


def _value_dtypes(val) -> list:
    vals = val if isinstance(val, (list, tuple)) else [val]
    return [None if not isinstance(v, Tensor) else _TO_NP[v.dtype] for v in vals]


def _fit(r, val, op, exact: bool = True):
    """A lowering's result as the node's fake value says: its dtype, and a value for
    every element broadcast to its shape. ``exact`` False: an op whose Meta kernel's
    shapes differ from the CPU's (``Lowering.trust_meta``) keeps the lowering's, as in
    eager mode (batch norm's saved statistics in eval mode are empty on the CPU)."""
    if r is None or not isinstance(val, Tensor):
        return r
    r = jnp.asarray(r)
    shape = tuple(val.shape)
    if not exact or not all(isinstance(s, int) for s in shape):
        shape = tuple(r.shape)
    return _executor._cast(r, _TO_NP[val.dtype], shape, op)


def _call_lowering(spec, vals, node, index: int, checks: list, rng=None, dtypes=None, contiguous=None):
    ctx = _context.TraceContext(
        spec.op, dtypes if dtypes is not None else _value_dtypes(node.meta.get("val")), index, checks=checks
    )
    ctx.contiguous = contiguous or {}
    ctx.rng = rng
    with _context.tracing(ctx):
        result = spec.lowering.fn(*vals)
    return result


# ------------------------------------------------------------ the program


class _Entry:
    """One computation of a program, for one input key."""

    __slots__ = ("fn", "compiled", "outs", "writes", "host_writes", "checks", "used", "cost")


class Program(OutputCode):
    """A graph from AOTAutograd, called with its inputs as one list (AOTAutograd's boxed
    calling convention, which lets go of the inputs early) or as arguments (the backward,
    which AOTAutograd calls through a wrapper). Saved and loaded as NOTE [Compiled graphs
    in AOTAutograd's cache] says."""

    # (identity, as before it was an OutputCode: the dataclass's equality compares cache keys,
    # None in every program, and leaves the object unhashable)
    __eq__ = object.__eq__
    __hash__ = object.__hash__

    def __init__(self, gm: torch.fx.GraphModule, example_inputs, name: str):
        super().__init__()
        self._boxed_call = True  # (an attribute of the object: Dynamo's wrapper of the backward copies its __dict__)
        self._time_taken_ns = 0  # (AOTAutograd's cache records it; XLA compiles at the first call)
        self.name = name
        self._build(gm)

    def _build(self, gm: torch.fx.GraphModule) -> None:
        self.gm = gm
        # the XLA module's name (jit_forward_<hash>), which profiler traces show: named by the
        # graph's code, not by the process's counter, so that JAX's persistent cache, whose key
        # holds the module's name, finds the same graph whatever was compiled before it
        digest = hashlib.sha1(gm.code.encode()).hexdigest()[:10]
        self.module = f"{self.name.rstrip('0123456789')}_{digest}"
        self.graph = gm.graph
        self.nodes = list(gm.graph.nodes)
        self.placeholders = [n for n in self.nodes if n.op == "placeholder"]
        self.output = next(n for n in self.nodes if n.op == "output")
        # (tensors; a get_attr of a graph, a higher-order op's score_mod, is no input)
        self.constants = [
            n for n in self.nodes if n.op == "get_attr" and not isinstance(getattr(gm, n.target), torch.fx.GraphModule)
        ]
        self.entries: dict = {}
        self.reshaped = 0  # compilations for new input shapes (NOTE [Shapes that keep changing])
        self.eager = None  # the reason this graph runs op by op, once known
        self.mutated = {}  # placeholder position -> the copy_ node writing it
        position = {n: i for i, n in enumerate(self.placeholders)}
        self.plans = {}
        self.random = []
        self.group = None  # the process group of the graph's collectives, if it has any
        self.context = []  # the nodes of ops that read their context (NOTE [Ops that read their context])
        self.position = position
        try:
            for n in self.nodes:
                if n.op != "call_function":
                    continue
                context = n.args[0] if n.target is _AUTO_FUNCTIONALIZED else n.target
                if isinstance(context, torch._ops.OpOverload) and context in CONTEXT_OPS:
                    self.plans[n] = ("context", CONTEXT_OPS[context], context)
                    self.context.append(n)
                    continue
                if n.target is aten.copy_.default and n.args[0] in position:
                    self.mutated[position[n.args[0]]] = n
                    continue
                if n.target is _AUTO_FUNCTIONALIZED and n.args[0] in _executor.SPECS and n.args[0] in LOWERINGS:
                    self.plans[n] = ("auto_functionalized", _executor.SPECS[n.args[0]])
                    if self.plans[n][1].random:
                        self.random.append(n)
                    continue
                if isinstance(n.target, torch._ops.HigherOrderOperator):
                    from torch_jax.compile import _flex

                    self.plans[n] = _flex.plan(n, gm)  # NOTE [Blockwise flex attention]
                    continue
                if not isinstance(n.target, torch._ops.OpOverload):
                    continue  # (operator.getitem, SymInt arithmetic)
                if n.target in _SIZE_OPS:
                    continue
                if n.target in _collectives.LOWERINGS:  # NOTE [Collectives in compiled graphs]
                    self.plans[n] = ("collective", _collectives.LOWERINGS[n.target])
                    name = _collectives.group_of(n)
                    if name is not None and self.group not in (None, name):
                        raise Unsupported("collectives over more than one process group")
                    self.group = name if name is not None else self.group
                    continue
                plan = plan_node(n)
                self.plans[n] = plan
                if plan[0] != "rule" and plan[1].random:
                    self.random.append(n)
        except (Unsupported, _collectives.Unsupported) as e:
            self._go_eager(str(e))

    # -------------------------------------------------------- saved and loaded

    def prepare_for_serialization(self) -> None:
        """Keep only what pickles: the name and the aten graph (on AOTAutograd's copy)."""
        from torch._subclasses.fake_tensor import unset_fake_temporarily
        from torch.fx._graph_pickler import GraphPickler, Options

        # (any op: an op of another library is found by name again when the graph loads; out of
        # the fake mode AOTAutograd saves in: the graph's constants are real tensors)
        with unset_fake_temporarily():
            graph = GraphPickler.dumps(self.gm, Options(ops_filter=None))
        name = self.name
        self.__dict__ = {}  # (the copy's own: the live program keeps its state)
        OutputCode.__init__(self)
        self._boxed_call, self._time_taken_ns, self.name, self._saved_graph = True, 0, name, graph

    def post_compile(self, example_inputs, constants, graph_kwargs) -> None:
        """Build the program again from the saved graph, once loaded."""
        graph = self.__dict__.pop("_saved_graph", None)
        if graph is None:
            return  # (a live program: nothing to load)
        from torch._guards import detect_fake_mode
        from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
        from torch.fx._graph_pickler import GraphPickler
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        from torch_jax.device._start import start as initialize

        initialize()  # (the persistent cache, and the device the graph's values are on)
        fake_mode = detect_fake_mode(example_inputs) or FakeTensorMode(shape_env=ShapeEnv())
        # (the graph's constants are real tensors, which torch.load makes meta ones under a fake
        # mode or a tracing context's)
        with unset_fake_temporarily(), torch._guards.tracing(None):
            gm = GraphPickler.loads(graph, fake_mode)
            for n in gm.graph.find_nodes(op="get_attr"):
                # an unpickled tensor is a view of a byte storage (NOTE [Pickling storages] in
                # device/_patches): a copy of its own, as the saving process had, traces the same
                # computation, which the persistent cache then finds
                value = getattr(gm, n.target)
                if isinstance(value, Tensor) and value.device.type != "cpu":
                    setattr(gm, n.target, value.clone())
        gm.recompile()
        self._build(gm)

    def set_triton_bundle(self, triton_bundle) -> None:
        pass

    def _go_eager(self, reason: str) -> None:
        self.eager = reason
        _counters["compiled_graphs_eager"] += 1
        message = (
            f"torch_jax: torch.compile's graph {self.name} runs op by op on the device, not as one XLA "
            f"computation: {reason}"
        )
        if config.fallback == "error":
            raise NotImplementedError(message + " (TORCH_JAX_FALLBACK=error)")
        if config.fallback == "warn":
            warnings.warn(message, FallbackWarning, stacklevel=3)

    # -------------------------------------------------------- calls

    def __call__(self, *args):
        if len(args) == 1 and args[0].__class__ is list:  # (boxed: the list is ours to empty)
            boxed = args[0]
            args = list(boxed)
            boxed.clear()
        else:
            args = list(args)
        if self.eager is not None:
            return self._run_eager(args)
        if _stats.census is not None:  # config.census: the graph's ops, once a call
            _stats.census.update(
                ("compiled", _stats.op_name(n.target))
                for n in self.nodes
                if isinstance(n.target, torch._ops.OpOverload)
            )
        if _fused.pending:
            _fused.flush_all("torch.compile graph")
        inputs = args + [getattr(self.gm, n.target) for n in self.constants]
        written, slots, fixed = self.mutated, (), len(inputs)
        if self.context:
            gathered = self._gather(args)
            if gathered is None:
                return self._run_eager(args)
            items, slots, written = gathered
            inputs += items
        key, dyn, index, starts = [], [], -1, []
        try:
            for pos, a in enumerate(inputs):
                starts.append(len(dyn))
                if isinstance(a, Tensor) and a.is_cpu:
                    # a CPU tensor the graph reads (a constant made on the CPU, a mask): its
                    # value, copied (the host may change the tensor before the call runs)
                    if a.dim() and pos in written:
                        raise Unsupported("a CPU tensor input that the graph updates")
                    key.append(("c", a.dtype, tuple(a.shape)))
                    dyn.append(_executor.host_copy(a))
                elif isinstance(a, Tensor):
                    desc, index = _executor._describe(a, dyn, index, read_only=pos not in written)
                    key.append(desc)
                elif pos >= fixed:  # (a context op's run-time int: a value of the computation, not of its key)
                    key.append(("n",))
                    dyn.append(np.int32(a))
                elif isinstance(a, (bool, int)) or a is None:
                    key.append(("i", a))
                elif isinstance(a, float):
                    key.append(("f",))
                    dyn.append(a)
                elif isinstance(a, _OPAQUE):  # (a DTensor's mesh, which the graph passes through)
                    key.append(("o", id(a)))
                elif isinstance(a, _VALUE_OPAQUE):  # (an opaque value Dynamo lifts to an input: vLLM's layer names)
                    key.append(("v", a) if a.__hash__ is not None else ("o", id(a)))
                else:
                    raise Unsupported(f"an input of type {type(a).__name__}")
        except RuntimeError as e:
            if "Expected all tensors to be on the same device" not in str(e):
                raise
            self._go_eager(f"its inputs are on more than one jax device ({e})")
            return self._run_eager(args)
        except Unsupported as e:
            self._go_eager(str(e))
            return self._run_eager(args)
        if index < 0:
            index = _devices.current()
        key.append(index)
        key.append(_registry.overrides)  # NOTE [Overriding a lowering] (kernels/_override)
        if self.group is not None and ("f",) in key:
            self._go_eager("a float input beside collectives")  # (its weak type would be lost)
            return self._run_eager(args)
        # (an SPMD program's inputs are global arrays: nothing is donated)
        key.append(slots)
        key.append(self._donated(inputs, dyn, starts, index, written) if written and self.group is None else ())
        key = tuple(key)
        for _ in self.random:
            dyn.append(_devices.next_key(index))
        entry = self.entries.get(key)
        if entry is None:
            try:
                entry = self._compile(key, inputs, dyn, starts, index)
            except (Unsupported, _collectives.Unsupported) as e:
                self._go_eager(str(e))
                return self._run_eager(args)
        else:
            entry.used = True
            _counters["compiled_graph_hits"] += 1
        recent.append(weakref.ref(entry.compiled))
        if _profiler.recording:  # NOTE [Device time in torch.profiler]
            results = _profiler.graph(f"jax::{self.module}", f"jit_{self.module}", index, entry.fn, dyn)
        else:
            results = entry.fn(*dyn)
        del dyn  # (donated arrays are gone)
        _counters["compiled_graph_calls"] += 1
        _devices.last[index] = results
        if config.launch_blocking:
            jax.block_until_ready(results)
        it = iter(results)
        for pos in entry.writes:
            _storage.replace(_storage.box_of(inputs[pos]), next(it))
        if entry.host_writes:  # (CPU scalars, an optimizer's step counts: read back at once, waiting for the graph)
            _counters["host_transfers"] += 1
            values = np.asarray(next(it))
            for pos, v in zip(entry.host_writes, values):
                inputs[pos].fill_(v.item())
        outs = []
        for kind, value in entry.outs:
            if kind == "tensor":
                outs.append(value.tensor(next(it)))
            elif kind == "host":  # (a CPU result of the graph: waits for it)
                _counters["host_transfers"] += 1
                outs.append(_dtypes.numpy_to_tensor(np.array(next(it))).to(value))
            elif kind == "input":
                outs.append(args[value])
            else:
                outs.append(value)
        if entry.checks:
            _fused._deferred.append((entry.checks, next(it)))
            if config.launch_blocking:
                _fused.check_deferred()
        return outs

    def _donated(self, inputs, dyn, starts, index: int, written) -> tuple:
        """The dyn positions of the storage arrays of mutated inputs that nothing but their
        storage box holds: the computation may write their new values over them (NOTE
        [Donation] in runtime/_fused), as an eager in-place op updates in place."""
        _devices.last.pop(index, None)  # (the device's last results: this call's stand for them)
        donated = []
        for pos in written:
            v = dyn[starts[pos]] if isinstance(inputs[pos], Tensor) and not inputs[pos].is_cpu else None
            # (references: dyn, the storage box, ``v`` and getrefcount's argument)
            if v.__class__ is _ArrayImpl and sys.getrefcount(v) <= 4:
                donated.append(starts[pos])
        return tuple(donated)

    def _gather(self, args):
        """What the graph's context ops read at this call (NOTE [Ops that read their
        context]): (the gathered tensors and ints, each node's positions among them, the
        input positions written: the graph's mutated inputs and the gathered tensors the
        ops write), or None where an op cannot run compiled at this call."""
        fixed = len(self.placeholders) + len(self.constants)
        items, seen, slots, written, storages = [], {}, [], set(self.mutated), {}
        for n in self.context:
            _, context, op = self.plans[n]
            got = context.gather(self._known_arguments(n, op, args))
            if got is None:
                return None
            mine = []
            for i, v in enumerate(got):
                slot = seen.get(id(v)) if isinstance(v, Tensor) else None
                if slot is None:
                    slot = len(items)
                    items.append(v if isinstance(v, Tensor) else int(v))
                    if isinstance(v, Tensor):
                        seen[id(v)] = slot
                mine.append(slot)
                if i in context.writes and fixed + slot not in written:
                    written.add(fixed + slot)
                    box = id(_storage.box_of(v))
                    if storages.setdefault(box, slot) != slot:
                        # (two tensors of one storage, each written: the second's write would
                        # be made from the storage's old value)
                        self._go_eager(f"{_stats.op_name(op)} writes one storage through two tensors")
                        return None
            slots.append(tuple(mine))
        return items, tuple(slots), written

    def _known_arguments(self, n, op, args) -> dict:
        """A context node's arguments by name, as far as the call knows them: its graph
        inputs' values and its constants (None for values the graph computes)."""

        def known(x):
            if isinstance(x, torch.fx.Node):
                pos = self.position.get(x)
                return args[pos] if pos is not None else None
            if isinstance(x, (list, tuple)):
                return type(x)(known(y) for y in x)
            return x

        if n.target is _AUTO_FUNCTIONALIZED:
            return {k: known(v) for k, v in n.kwargs.items() if not k.startswith("_")}
        names = [a.name for a in op._schema.arguments]
        return dict(zip(names, (known(v) for v in _schema_args(op, n.args, n.kwargs))))

    def _run_eager(self, args):
        _counters["compiled_graph_eager_calls"] += 1
        with torch.fx.traceback.preserve_node_meta():
            return list(self.gm(*args))

    # -------------------------------------------------------- compilation

    def _compile(self, key, inputs, dyn, starts, index: int) -> _Entry:
        start = time.perf_counter()
        before = _compile_cache.allocated()
        reason = self._reason(key)
        _stats.compile_reasons[reason] += 1
        if reason.startswith("new input shapes") and not _recompiles.planned_now():
            self.reshaped += 1
            if self.reshaped == _recompiles.THRESHOLD:  # NOTE [Shapes that keep changing]
                _recompiles.churn[f"torch.compile graph {self.name}"] = self.reshaped
                _recompiles._warn(
                    f"torch.compile's graph {self.name} has compiled for {self.reshaped + 1} input shapes "
                    f"(the last: {reason[len('new input shapes or layout ') :]}).",
                    _recompiles.HELP,
                )
        if config.debug >= 1:
            print(f"[torch_jax] compiling torch.compile graph {self.name} ({len(self.nodes)} nodes): {reason}")
        descs = key[: len(inputs)]
        found = {}

        def traced(*dyn):
            outs, writes, flags, layouts = self._trace(descs, inputs, dyn, starts, index, key[-2])
            device = [(pos, w) for pos, w in writes if not inputs[pos].is_cpu]
            host = [(pos, w) for pos, w in writes if inputs[pos].is_cpu]
            found["layouts"], found["writes"], found["host"] = layouts, device, [pos for pos, _ in host]
            found["checks"] = [(exc, msg) for _, _, exc, msg in flags]
            # the storages' new values first: a donated buffer goes to the first output of its
            # shape and dtype (NOTE [Donation] in runtime/_fused)
            head = [w for _, w in device]
            if host:  # one array, one transfer (float64 holds every step count exactly)
                head.append(jnp.stack([jnp.asarray(w, jnp.float64).reshape(()) for _, w in host]))
            tail = [jnp.stack([jnp.stack([f.astype(jnp.int64), v]) for f, v, _, _ in flags])] if flags else []
            return tuple(head) + tuple(outs) + tuple(tail)

        if self.group is None:
            jitted = jax.jit(
                _compile_cache.fresh(traced, self.module),
                out_shardings=_devices.sharding(index),
                donate_argnums=key[-1],
            )
        else:  # NOTE [Collectives in compiled graphs]
            backend = _collectives.backend_of(self.group)
            mesh = backend._mesh(index)
            found["scalar_ins"] = [np.ndim(v) == 0 for v in dyn]
            jitted = _collectives.spmd(_compile_cache.fresh(traced, self.module), mesh, len(dyn), found)
            dyn = _collectives.globalize(dyn, mesh, _devices.device(index))
        with _cpu_blas.in_graph(), _xla_options.lowering():  # NOTE [One MLIR context for many lowerings]
            lowered = jitted.lower(*dyn)
        loads = _cache.hits()
        with _cache.keep():  # NOTE [Persistent compilation cache]
            compiled = lowered.compile()
        del lowered, jitted
        loaded = _cache.hits() > loads
        entry = _Entry()
        entry.fn = _executor.cpp_call(compiled)
        if self.group is not None:
            ops = " ".join(_stats.op_name(n.target) for n in self.plans if self.plans[n][0] == "collective")
            what = f"a torch.compile graph with {ops}"
            entry.fn = functools.partial(
                _collectives.call, compiled, backend, mesh, _devices.device(index), found["scalars"], what
            )
        entry.compiled = compiled  # (its HLO: benchmarks/profile)
        entry.outs = found["layouts"]
        entry.writes = [pos for pos, _ in found["writes"]]
        entry.host_writes = found["host"]
        entry.checks = found["checks"]
        entry.used = True
        entry.cost = _compile_cache.allocated() - before
        _compile_cache.admit(self.entries, key, entry, "compiled")
        seconds = time.perf_counter() - start
        _counters["compiled_graph_loads" if loaded else "compiled_graph_compiles"] += 1
        _counters["compiled_graph_compile_ms"] += int(seconds * 1000)
        if config.debug >= 1:
            how = "loaded from the persistent cache" if loaded else "compiled"
            print(f"[torch_jax] {self.name} {how} in {seconds:.2f} s")
        return entry

    def _reason(self, key) -> str:
        if not self.entries:
            return "new graph"
        # the input whose description differs from the closest compiled key
        best = None
        for other in self.entries:
            diff = [i for i, (a, b) in enumerate(zip(key, other)) if a != b]
            if best is None or len(diff) < len(best):
                best = diff
        if not best:
            return "recompiled after eviction"
        i = best[0]
        if i < len(self.placeholders):
            return f"new input shapes or layout ({self.placeholders[i].name})"
        return "new input"

    def _trace(self, descs, inputs, dyn, starts, index: int, slots=()):
        """The graph as JAX values: (outputs, [(input position, storage array)], checks,
        how each output becomes a tensor); ``slots``: each context node's positions among
        the gathered values (NOTE [Ops that read their context])."""
        it = _executor._Counting(dyn)
        env = {}
        position = {}
        for pos, (n, desc, a) in enumerate(zip(self.placeholders + self.constants, descs, inputs)):
            position[n] = pos
            if isinstance(a, Tensor):
                env[n] = _executor._read(desc, it)
            elif isinstance(a, float):
                env[n] = next(it)
            else:
                env[n] = a
        fixed = len(self.placeholders) + len(self.constants)
        sides = [
            _executor._read(d, it) if isinstance(a, Tensor) else next(it) for d, a in zip(descs[fixed:], inputs[fixed:])
        ]
        side_writes: set = set()
        context = dict(zip(self.context, slots))
        keys = {n: next(it) for n in self.random}
        checks: list = []
        new_values = {}

        def value(x):
            if isinstance(x, torch.fx.Node):
                return env[x]
            if isinstance(x, (list, tuple)):
                return type(x)(value(y) for y in x)
            if isinstance(x, dict):  # (keyword arguments: a user op's keyword-only tensors)
                return {k: value(y) for k, y in x.items()}
            return x

        for n in self.nodes:
            if n.op == "get_attr" and n not in position:  # (a higher-order op's graph)
                env[n] = getattr(self.gm, n.target)
            if n.op != "call_function":
                continue
            op = n.target
            args, kwargs = value(n.args), value(n.kwargs)
            if op is aten.copy_.default and n.args[0] in position and position[n.args[0]] in self.mutated:
                dst = n.args[0].meta["val"]
                src = jnp.broadcast_to(cast(jnp.asarray(args[1]), _TO_NP[dst.dtype]), tuple(args[0].shape))
                new_values[position[n.args[0]]] = src
                env[n] = src
            elif n in context:
                env[n] = self._context(n, args, kwargs, sides, context[n], side_writes, index, checks)
            elif not isinstance(op, torch._ops.OpOverload) and n not in self.plans:
                env[n] = op(*args, **kwargs)
            elif op in _SIZE_OPS:
                env[n] = _SIZE_OPS[op](*args)
            else:
                env[n] = self._node(n, args, kwargs, index, checks, keys.get(n))
        for slot in side_writes:
            new_values[fixed + slot] = sides[slot]
        outs, layouts = [], []
        for r in self.output.args[0]:
            if isinstance(r, torch.fx.Node) and r in position and position[r] < len(self.placeholders):
                layouts.append(("input", position[r]))
            elif isinstance(r, torch.fx.Node) and isinstance(r.meta.get("val"), Tensor) and r.meta["val"].is_cpu:
                outs.append(env[r])
                layouts.append(("host", r.meta["val"].dtype))
            elif isinstance(r, torch.fx.Node) and isinstance(r.meta.get("val"), Tensor):
                arr = env[r]
                val = r.meta["val"]
                shape = tuple(arr.shape)
                stride = [int(s) for s in val.stride()] if _static(val) else _storage.contiguous_strides(shape)
                perm, stride = _executor._layout(shape, stride)
                outs.append(arr if perm is None else jnp.transpose(arr, perm))
                layouts.append(("tensor", _storage.template(shape, stride, val.dtype, index)))
            else:
                layouts.append(("value", _concrete(value(r))))
        writes = []
        for pos in sorted(new_values):
            desc = descs[pos]
            base = dyn[starts[pos]] if _executor._has_array(desc) else None
            writes.append(
                (pos, _executor._write(base, desc, new_values[pos], _executor._offset(desc, dyn, starts[pos])))
            )
        return outs, writes, checks, layouts

    def _context(self, n, args, kwargs, sides: list, mine: tuple, side_writes: set, index: int, checks: list):
        """A context op's node (NOTE [Ops that read their context]): its lowering, given the
        current values of what it gathered; the values it writes replace them."""
        _, context, op = self.plans[n]
        gathered = [sides[s] for s in mine]
        updates = {}

        def lower(named: dict):
            result, new = context.lower(named, gathered)
            updates.update(new)
            return result

        if n.target is _AUTO_FUNCTIONALIZED:
            mutable = [a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write]

            def run(vals):
                result = lower({a.name: v for a, v in zip(op._schema.arguments, vals)})
                return [result.get(name) for name in mutable]

            out = _auto_functionalized(None, args, kwargs, n, index, checks, None, run=run)
        else:
            names = [a.name for a in op._schema.arguments]
            out = _fit(lower(dict(zip(names, _schema_args(op, args, kwargs)))), n.meta.get("val"), op)
        for i, v in updates.items():
            sides[mine[i]] = v
            side_writes.add(mine[i])
        return out

    def _node(self, n, args, kwargs, index: int, checks: list, rng):
        op = n.target
        plan = self.plans[n]
        val = n.meta.get("val")
        kind = plan[0]
        if kind == "collective":
            return plan[1](*args, **kwargs)
        if kind == "hop":
            return plan[1](n, args, index, checks, plan[2])
        if kind == "rule":
            return plan[1](val, *_schema_args(op, args, kwargs))
        if kind == "random_factory":
            spec, (a, b) = plan[1], plan[2]
            zeros = jnp.zeros(tuple(_concrete(val.shape)), _TO_NP[val.dtype])
            vals = _schema_args(spec.op, (zeros, a, b), {})
            return _fit(_call_lowering(spec, vals, n, index, checks, rng, dtypes=[_TO_NP[val.dtype]]), val, op)
        spec = plan[1]
        if kind == "auto_functionalized":
            return _auto_functionalized(spec, args, kwargs, n, index, checks, rng)
        vals = _schema_args(op, args, kwargs)
        if kind == "as":
            vals = plan[2](vals)
        contiguous = {}
        for pos, a in enumerate(n.args):
            if isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), Tensor):
                fake = a.meta["val"]
                contiguous[pos] = bool(fake.is_contiguous()) if _static(fake) else True
        if kind == "foreach":  # one element at a time: lists give their i-th item
            count = len(val)
            out = []
            for i in range(count):
                each = [a[i] if isinstance(a, (list, tuple)) else a for a in vals]
                r = _call_lowering(spec, each, n, index, checks, rng, dtypes=[_TO_NP[val[i].dtype]])
                out.append(_fit(r[0] if isinstance(r, (list, tuple)) else r, val[i], op))
            return out
        if kind == "functional":
            self_val = vals[0]
            dtypes = [self_val.dtype]
            result = _call_lowering(spec, vals, n, index, checks, rng, dtypes=dtypes, contiguous=contiguous)
            result = result[0] if isinstance(result, (list, tuple)) else result
            return _fit(result, val, op)
        result = _call_lowering(spec, vals, n, index, checks, rng, contiguous=contiguous)
        exact = spec.lowering.trust_meta
        if isinstance(val, (list, tuple)):
            results = list(result) if isinstance(result, (list, tuple)) else [result]
            return [_fit(r, v, op, exact) for r, v in zip(results, val)]
        if isinstance(result, (list, tuple)):
            result = result[0]
        return _fit(result, val, op, exact)


_AUTO_FUNCTIONALIZED = getattr(torch.ops.higher_order, "auto_functionalized_v2", None)


def _auto_functionalized(spec, args, kwargs, node, index: int, checks: list, rng, run=None):
    """A mutating op as AOTAutograd functionalizes it (``auto_functionalized_v2``: the op's
    mutated arguments given as indices into ``_all_bases``; the result is the op's outputs,
    then every base's new value): the lowering's written values become the bases' new
    values. NOTE [Input mutations in compiled graphs] writes them into the caller's
    tensors. Only arguments that are whole bases, not views of them. ``run``: the op's
    computation from its arguments in schema order, returning its mutated arguments' new
    values (a context op's, which returns nothing else), instead of ``spec``'s lowering."""
    op = args[0]
    kwargs = dict(kwargs)
    bases = list(kwargs.pop("_all_bases", []))
    fakes = [b.meta.get("val") for b in node.kwargs["_all_bases"]]
    new_bases = list(bases)
    vals, targets = [], []
    for a in op._schema.arguments:
        if not (a.alias_info is not None and a.alias_info.is_write):
            vals.append(kwargs[a.name] if a.name in kwargs else a.default_value if a.has_default_value() else None)
            continue
        if str(a.type).startswith("List"):
            length = kwargs.get(f"_{a.name}_length")
            where = None if length is None else [_view_of_base(kwargs, f"_{a.name}_{i}", fakes) for i in range(length)]
            vals.append(None if where is None else [None if w is None else w.read(bases) for w in where])
        else:
            where = _view_of_base(kwargs, f"_{a.name}", fakes)
            vals.append(None if where is None else where.read(bases))
        targets.append(where)
    val = node.meta.get("val")
    outs = list(val[: len(val) - len(bases)]) if isinstance(val, (list, tuple)) else []
    if run is not None:
        result = run(vals)
    else:
        result = _call_lowering(spec, vals, node, index, checks, rng, dtypes=_value_dtypes(outs))
    results = list(result) if isinstance(result, (list, tuple)) else [result]
    fresh_count = spec.n_fresh if spec is not None else 0
    fresh, written = results[:fresh_count], results[fresh_count:]
    for where, value in zip(targets, written):
        for w, v in zip(where if isinstance(where, list) else [where], value if isinstance(where, list) else [value]):
            if w is not None and v is not None:
                w.write(new_bases, v, op)
    fitted = [_fit(r, v, op) for r, v in zip(fresh, outs)] + [None] * (len(outs) - len(fresh))
    return (*fitted, *new_bases)


class _BaseView:
    """A mutated argument of ``auto_functionalized_v2``: the base it is (or a view of),
    read from and written into the bases' values (arrays in the bases' logical shapes)."""

    def __init__(self, base: int, fake, slice_=None, strided=None):
        self.base, self.fake, self.slice, self.strided = base, fake, slice_, strided

    def _flat_index(self):
        """The view's elements as positions in the base's logical elements (a contiguous base)."""
        size, stride, offset = self.strided
        if list(self.fake.stride()) != _storage.contiguous_strides(self.fake.shape):
            raise Unsupported("a mutating op's argument that is a strided view of a non-contiguous tensor")
        idx = np.full(tuple(size), offset - self.fake.storage_offset(), np.int64)
        for d, (n, s) in enumerate(zip(size, stride)):
            shape = [1] * len(size)
            shape[d] = n
            idx = idx + (np.arange(n) * s).reshape(shape)
        return idx

    def _where(self):
        d, start, end = self.slice
        return (slice(None),) * d + (slice(start, end),)

    def read(self, bases):
        b = bases[self.base]
        if self.slice is not None:
            return b[self._where()]
        if self.strided is not None:
            return b.reshape(-1)[self._flat_index()]
        return b

    def write(self, bases, value, op) -> None:
        b = bases[self.base]
        if self.slice is not None:
            value = _executor._cast(value, b.dtype, b[self._where()].shape, op)
            bases[self.base] = b.at[self._where()].set(value)
        elif self.strided is not None:
            idx = self._flat_index()
            value = _executor._cast(value, b.dtype, idx.shape, op)
            bases[self.base] = b.reshape(-1).at[idx.reshape(-1)].set(value.reshape(-1)).reshape(b.shape)
        else:
            bases[self.base] = _fit(value, self.fake, op)


def _view_of_base(kwargs: dict, prefix: str, fakes: list):
    """A mutated argument's base and view, from auto_functionalized_v2's view information."""
    base = kwargs.get(f"{prefix}_base_index")
    if base is None:
        return None
    if f"{prefix}_slice_dim" in kwargs:
        where = tuple(kwargs[f"{prefix}_slice_{k}"] for k in ("dim", "start", "end"))
        return _BaseView(base, fakes[base], slice_=where)
    if f"{prefix}_storage_offset" in kwargs:
        where = tuple(kwargs[f"{prefix}_{k}"] for k in ("size", "stride", "storage_offset"))
        if not all(isinstance(x, int) for x in (*where[0], *where[1], where[2])):
            raise Unsupported("a mutating op's argument that is a view of symbolic size")
        return _BaseView(base, fakes[base], strided=where)
    return _BaseView(base, fakes[base])


def _opaque() -> tuple:
    try:
        from torch.distributed.device_mesh import DeviceMesh
    except ImportError:  # (a torch built without distributed)
        return ()
    return (DeviceMesh,)


_OPAQUE = _opaque()


def _value_opaque() -> tuple:
    try:
        from torch._opaque_base import OpaqueBase
    except ImportError:  # (torch before 2.11)
        return ()
    return (OpaqueBase,)


_VALUE_OPAQUE = _value_opaque()


def _static(val) -> bool:
    return all(isinstance(s, int) for s in val.shape) and all(isinstance(s, int) for s in val.stride())


def _concrete(v):
    if isinstance(v, torch.SymInt):
        raise Unsupported("a symbolic size the graph returns")
    if isinstance(v, (list, tuple, torch.Size)):
        return type(v)(_concrete(x) for x in v) if not isinstance(v, torch.Size) else tuple(_concrete(x) for x in v)
    return v


_SIZE_OPS = {
    aten.sym_size.int: lambda x, d: x.shape[d],
    aten.sym_stride.int: lambda x, d: _storage.contiguous_strides(x.shape)[d],
    aten.sym_numel.default: lambda x: int(np.prod(x.shape)),
    aten.sym_storage_offset.default: lambda x: 0,
}
