"""Telling the user when an op or a fused graph keeps compiling for new shapes.

NOTE [Shapes that keep changing]: XLA compiles a computation for fixed shapes, so a
program whose shapes keep changing (variable-length batches, a growing KV cache)
compiles its ops again for every new size, at ~20 ms an op on XLA:CPU, where PyTorch's
CPU kernels take any shape. A fixed-shape program compiles everything in its first steps
and then nothing. So a compilation is noted by what it would share with the op's other
compilations if one size were not there: each size in the op's tensor shapes is masked
in turn (wherever the value appears, int arguments included), and when ``THRESHOLD`` compilations differ only in the
value at one mask (the same op, dtypes and other sizes), that op "keeps compiling" in
the dimension the mask marks. Only the sizes of tensors count: an op compiled again for
each value of an int argument (``select_backward``'s index, in a loop over a sequence)
compiles a fixed set of computations in a fixed-shape program, once. A fused graph keeps compiling when ``THRESHOLD`` graphs of
one structure (the same ops, connected the same way) differ in their shapes. The first
time either happens the process warns once (``RecompileWarning``), naming the op or
graph and the dimension, and what helps; ``torch_jax.stats()["shape_churn"]`` counts
the ops and graphs found. Compilations inside ``planned()`` are not noted: a warm-up over
sizes chosen on purpose (vLLM's token buckets, NOTE [Token buckets] in vllm/_worker.py)
is what the warning advises, not a program whose shapes keep changing.
"""

from __future__ import annotations

import collections
import contextlib
import warnings

from torch_jax._warnings import RecompileWarning

THRESHOLD = 8
MAX_NOTES = 1 << 16  # (the memory of what was compiled is cleared past this many)
_sizes: dict = {}  # masked key -> the size values seen at its mask
_shapes: dict = {}  # fused graph structure -> [graphs compiled, the last's input shapes, its compile seconds]
churn: collections.Counter = collections.Counter()  # op or graph -> compilations seen churning
_warned = False
_planned = 0  # (inside ``planned()``)

HELP = (
    "Each new shape compiles it again. Padding that dimension to a few sizes helps: to a "
    "multiple of 64 or a power of two (Hugging Face tokenizers and collators: "
    "pad_to_multiple_of=64), or for generation a static KV cache "
    "(generate(..., cache_implementation='static')). torch_jax.stats()['shape_churn'] counts "
    "the ops and graphs that keep compiling."
)


def _tensor(desc):
    """A tensor argument's (logical shape, dtype) from its key (runtime/_executor's
    _describe), or None for anything else."""
    if desc is None or desc.__class__ is not tuple or not desc:
        return None
    head = desc[0]
    if head.__class__ is tuple:  # (shape, dtype)
        return desc
    if head == "v":
        return (desc[4], desc[7])
    if head == "u":
        return (desc[1], desc[2])
    if head == "m":
        return _tensor(desc[1])
    return None


_TENSOR, _TENSOR_LIST = (0, 1), (2, 3)  # (runtime/_executor's kinds: T, OT and TL, OTL)


def _skeleton(spec, key):
    """The key without what does not name shapes: tensors as (shape, dtype)."""
    out = []
    for kind, arg in zip(spec.kinds, key[: len(spec.kinds)]):
        t = _tensor(arg) if kind in _TENSOR else None
        if t is not None:
            out.append(("T",) + t)
        elif kind in _TENSOR_LIST and arg is not None:
            out.append(("TL",) + tuple(x for x in map(_tensor, arg) if x is not None))
        else:
            out.append(arg)
    return tuple(out)


def _sizes_of(skeleton) -> set:
    """The sizes (over 1) of the tensor arguments' dims."""
    found = set()
    for arg in skeleton:
        if arg.__class__ is tuple and arg and arg[0] == "T":
            found.update(n for n in arg[1] if n > 1)
        elif arg.__class__ is tuple and arg and arg[0] == "TL":
            for shape, _ in arg[1:]:
                found.update(n for n in shape if n > 1)
    return found


def _mask(x, v):
    if x.__class__ is int and x == v:
        return "*"
    if x.__class__ is tuple:
        return tuple(_mask(y, v) for y in x)
    return x


def _where(skeleton, names, v) -> str:
    """Which argument and dimension hold ``v`` (the first place)."""
    for name, arg in zip(names, skeleton):
        if arg.__class__ is tuple and arg and arg[0] == "T" and v in arg[1]:
            return f"dimension {arg[1].index(v)} of argument {name!r}"
        if arg.__class__ is tuple and arg and arg[0] == "TL":
            for j, t in enumerate(arg[1:]):
                if v in t[0]:
                    return f"dimension {t[0].index(v)} of tensor {j} of argument {name!r}"
        if v in _flat(arg):
            return f"argument {name!r}"
    return "a size"


def _flat(x):
    return [y for z in x for y in _flat(z)] if x.__class__ is tuple else [x]


@contextlib.contextmanager
def planned():
    """Compilations for sizes chosen on purpose, a few each (NOTE [Shapes that keep
    changing]): not noted."""
    global _planned
    _planned += 1
    try:
        yield
    finally:
        _planned -= 1


def planned_now() -> bool:
    return _planned > 0


def note_op(spec, key) -> None:
    """An op compiled for ``key``: note it, and warn if it keeps compiling for new sizes."""
    if _planned:
        return
    skeleton = _skeleton(spec, key)
    found = _sizes_of(skeleton)
    if len(_sizes) > MAX_NOTES:
        _sizes.clear()
    name = _op_name(spec.op)
    for v in found:
        masked = (spec.op, _mask(skeleton, v))
        seen = _sizes.setdefault(masked, set())
        if len(seen) < THRESHOLD:
            seen.add(v)
            if len(seen) == THRESHOLD:
                churn[name] += 1
                _warn(f"{name} keeps compiling for new shapes: {_where(skeleton, spec.names, v)} has taken "
                      f"{THRESHOLD} sizes ({', '.join(map(str, sorted(seen)))}).")  # fmt: skip


def structure(nodes) -> tuple:
    """A fused graph's structure: its ops and how they connect, without shapes."""
    return tuple((entry.spec.op, refs) for entry, refs in nodes)


def note_graph(nodes, inputs, seconds: float) -> None:
    """A fused graph compiled, in ``seconds``: warn if graphs of its structure keep
    compiling for new shapes."""
    if _planned:
        return
    key = structure(nodes)
    shapes = [getattr(v, "shape", None) for v in inputs]
    if len(_shapes) > MAX_NOTES:
        _shapes.clear()
    seen = _shapes.get(key)
    if seen is None:
        _shapes[key] = [1, shapes, seconds]
        return
    before, seen[1], seen[2] = seen[1], shapes, seconds
    seen[0] += 1
    if seen[0] != THRESHOLD:
        return
    name = f"a fused graph of {len(nodes)} ops ({', '.join(_op_name(e.spec.op) for e, _ in nodes[:3])}, ...)"
    churn[name] += 1
    changed = [
        f"dimension {d} of input {i} ({a[d]} -> {b[d]})"
        for i, (a, b) in enumerate(zip(before, shapes))
        if a is not None and b is not None and len(a) == len(b)
        for d in range(len(a))
        if a[d] != b[d]
    ]
    where = "; ".join(changed[:3]) or "its inputs' shapes"
    _warn(f"{name} keeps compiling for new shapes ({THRESHOLD} shapes so far): {where}.")


def _op_name(op) -> str:
    name = op._schema.name.replace("::", ".")
    return name if op._overloadname == "default" else f"{name}.{op._overloadname}"


def note_bucketing(shape: tuple, dim: int, lengths) -> None:
    """Host tensors of ``shape`` but ``dim`` kept changing that dim's length and now go
    into buckets (NOTE [Padded rows] in runtime/_buckets): the ops that know buckets compile
    once a bucket from now on, and the others still once a length; say so, once."""
    shown = tuple("n" if d == dim else n for d, n in enumerate(shape))
    name = f"uploads of shape ({', '.join(map(str, shown))})"
    churn[name] += 1
    _warn(
        f"{name} keep changing dimension {dim} ({', '.join(map(str, sorted(lengths)))}); from now on they "
        "are padded to a power of two on the host, and the ops that know such buckets (matrix products, "
        "pointwise ops, softmax, embeddings, losses, sums) compile once per bucket instead of once per "
        "length; the other ops still compile for each length.",
        BUCKET_HELP,
    )


BUCKET_HELP = (
    "Padding that dimension yourself to a few sizes avoids even those compilations (Hugging Face "
    "tokenizers and collators: pad_to_multiple_of=64). torch_jax.config.bucketing='off' turns buckets "
    "off; torch_jax.stats()['shape_churn'] counts what kept changing."
)


def _warn(what: str, help: str = HELP) -> None:
    global _warned
    if _warned:
        return
    _warned = True
    warnings.warn(f"torch_jax: {what} {help}", RecompileWarning, stacklevel=2)


# NOTE [One-off graphs run op by op]: a fused graph compiles as a whole, so a graph whose
# shapes keep changing compiles every op of it again for each new shape, where strict
# mode compiles only the ops whose shapes changed: in generation with a growing KV cache
# the new token's projections, norms and MLPs keep their shapes and only attention's
# few ops see the cache's length (a 2-layer GPT-2: a 76-op graph a token, against a few
# ops). So once graphs of one structure have compiled for two shapes, a new shape
# of it runs op by op, each op through its strict-mode computation (compiled once per
# shape and cached like any strict op), whenever that is estimated cheaper: the ops not
# yet compiled, at the mean time an op's compilation has taken in this process, against
# the time the structure's last graph took to compile (before any op has compiled, op by
# op, which measures it); a graph whose shapes come back (the same key again) is no
# one-off, and compiles. A training step whose every op
# sees the new length compiles faster as one graph than as its ops (a 20-op step: one
# graph in ~0.35 s, its ops in ~0.7 s), and keeps doing so; generation runs its new
# tokens op by op. Either way fused mode spends no more on a graph it sees once than
# strict mode would, and results are the same ops' results (strict mode's).
_op_compiles = [0, 0.0]  # op compilations timed, their seconds


def note_op_compile(seconds: float) -> None:
    _op_compiles[0] += 1
    _op_compiles[1] += seconds


_once: set = set()  # the keys of the graphs run op by op (a key seen again compiles)
_OP_BY_OP_AFTER = 2  # graphs of one structure compiled for different shapes


def op_by_op(nodes, key) -> bool:
    """Whether a fused graph not compiled for its shapes (``key``) should run op by op
    (NOTE [One-off graphs run op by op])."""
    seen = _shapes.get(structure(nodes))
    if seen is None or seen[0] < _OP_BY_OP_AFTER or key in _once:
        return False
    if len(_once) > MAX_NOTES:
        _once.clear()
    _once.add(key)
    if not _op_compiles[0]:
        return True  # (no op compiled yet in this process: this run measures what one costs)
    new = len({id(entry) for entry, _ in nodes if entry.fn is None})
    return new * _op_compiles[1] / _op_compiles[0] < seen[2]
