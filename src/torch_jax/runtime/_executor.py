"""The strict eager executor: each aten op runs at once as one cached XLA computation.

NOTE [Strict eager]: a kernel call builds a key from the op's static arguments and a
descriptor per tensor (shape and dtype for a tensor that is its whole storage; the
full view for any other), looks up the compiled computation, and calls it with the
storage arrays. The computation reads views, runs the lowering, casts to the dtypes
PyTorch computes, and writes in-place results back through views, all in one XLA
program. JAX dispatch is asynchronous, so the host does not wait for results until
something reads them; ``TORCH_JAX_LAUNCH_BLOCKING=1`` waits after every op.

On a cache miss the op's Meta kernel runs first, on meta tensors with the same sizes,
strides and dtypes: it raises PyTorch's own errors for bad shapes and dtypes, and
gives the output sizes, strides and dtypes the result must have.
"""

from __future__ import annotations

import keyword
import math
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax._src.array import ArrayImpl as _ArrayImpl  # (a class check: isinstance(v, jax.Array) is slower)

from torch_jax._config import config
from torch_jax.device import _accelerator, _patches
from torch_jax.device import _state as _devices
from torch_jax.ops import _context
from torch_jax.ops._promote import cast
from torch_jax.runtime import _buckets, _compile_cache, _fused, _profiler, _recompiles, _stats, _xla_options
from torch_jax.tensor import _dtypes, _storage, _strided

_counters = _stats.counters
_last = _devices.last
_patches.defer_dynamo_in_meta_kernels()  # NOTE [Meta kernels without importing dynamo]
Tensor = torch.Tensor
_Pending = _storage.Pending
_Padded = _storage.Padded
_Generator = torch._C.Generator
_TO_NP = _dtypes.TO_NP

# argument kinds (SL: a Scalar[], each number a run-time input like a Scalar's)
T, OT, TL, OTL, S, OS, X, SL = range(8)  # (runtime/_recompiles reads T, OT, TL, OTL as 0-3)
_KIND_OF_TYPE = {
    "Tensor": T,
    "Optional[Tensor]": OT,
    "List[Tensor]": TL,
    "List[Optional[Tensor]]": OTL,
    "number": S,
    "Optional[number]": OS,
    "List[number]": SL,
}


SPECS: dict = {}  # op overload -> OpSpec, filled by _install


class OpSpec:
    """What the executor needs to know about one registered op overload.

    ``writes`` are the positions of arguments the op mutates (``Tensor(a!)``). For an
    in-place variant derived from a functional lowering (``inplace=True``) the
    lowering's result is written into argument 0. Otherwise a lowering of a mutating op
    returns its fresh outputs followed by the new values of the written arguments, in
    schema order (a list for a ``Tensor[]`` argument, None to leave one unwritten).
    """

    __slots__ = (
        "op",
        "lowering",
        "kinds",
        "names",
        "kwarg_only",
        "inplace",
        "writes",
        "returns",
        "n_fresh",
        "returns_list",
        "random",
        "cache",
        "multi_write",
        "defaults",
        "bucket",
        "tensor_args",
        "rows_rule",
        "fast",
    )

    def __init__(self, op, lowering, inplace: bool):
        self.op = op
        self.lowering = lowering
        schema = op._schema
        args = schema.arguments
        self.names = [a.name for a in args]
        self.kwarg_only = [a.kwarg_only for a in args]
        kinds = []
        for a in args:
            kind = _KIND_OF_TYPE.get(str(a.type), X)
            if kind in (S, OS) and a.name in lowering.static:
                kind = X
            elif kind == X and a.name in lowering.traced and str(a.type) == "float":
                kind = S
            kinds.append(kind)
        self.kinds = kinds
        # NOTE [Default scalars are constants]: a Scalar argument equal to its schema
        # default (add's alpha=1) is compiled in as a constant, not passed at run time.
        self.defaults = [
            a.default_value if a.has_default_value() and kinds[i] == S else _NO_DEFAULT for i, a in enumerate(args)
        ]
        self.inplace = inplace
        self.writes = [i for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write]
        if inplace and self.writes != [0]:
            raise RuntimeError(f"torch_jax: {op} is not an in-place op of its first argument")
        # each return: None (a fresh tensor) or the position of the argument it aliases
        self.returns = []
        for r in schema.returns:
            alias = None
            if r.alias_info is not None and r.alias_info.is_write:
                for i in self.writes:
                    if args[i].alias_info.before_set == r.alias_info.before_set:
                        alias = i
            self.returns.append(alias)
        self.n_fresh = sum(1 for r in self.returns if r is None)
        self.returns_list = len(schema.returns) == 1 and str(schema.returns[0].type) == "List[Tensor]"
        self.random = lowering.random
        self.cache = {}
        self.multi_write = len(self.writes) > 1 or any(kinds[i] == TL for i in self.writes)
        self.bucket = op in _buckets.PLANS  # NOTE [Buckets] (runtime/_buckets)
        self.tensor_args = [i for i, k in enumerate(kinds) if k == T or k == OT]
        functional = not inplace and not self.writes and self.returns == [None] and not lowering.random
        # NOTE [Padded rows] (runtime/_buckets)
        self.rows_rule = _buckets.rule_of(op) if functional or op in _buckets.RULES else None
        self.fast = False  # (made at the first compile: NOTE [The fast path of a cache hit])


_NO_DEFAULT = object()


def _freeze(v):
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    return v


def _device_mismatch(a: str, b: str) -> RuntimeError:
    return RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, {a} and {b}!")


# NOTE [Dynamic storage offsets]: a view's storage offset is a run-time input of the
# computation when it is not 0 (x[i], the chunks of a split): a loop over the rows of
# a tensor reuses one compiled computation instead of compiling one per row. The key
# keeps whether the view is a slice of the storage's nested shape at that offset
# (NOTE [Views as slices of the storage's nested shape] in tensor/_strided): _SLICES.
_SLICES = "slices"


def host_copy(t: Tensor) -> np.ndarray:
    """The values of a CPU tensor an op or a graph reads, copied: the CPU tensor may change
    before the computation reads it (JAX may alias host memory, and runs asynchronously;
    fused eager runs the op later still)."""
    return np.array(_dtypes.tensor_to_numpy(t), copy=True)


def _describe(t, dyn: list, index: int, padded: bool = False, read_only: bool = False):
    """The key of one tensor argument (appending its array, if any, to ``dyn``) and the
    device index it pins the op to. ``padded``: the op takes this argument in its bucket
    (NOTE [Buckets] in runtime/_buckets) if its storage is in one; ``read_only``: the
    op does not write it, so it may read a view of such a storage in the bucket."""
    if t.__class__ is not Tensor and not isinstance(t, Tensor):
        # a Python scalar where the schema says Tensor: PyTorch's wrapped number
        dyn.append(t)
        return ("s", type(t)), index
    if t.is_cpu:
        if t.dim() != 0:
            raise _device_mismatch(f"jax:{max(index, 0)}", "cpu")
        dyn.append(host_copy(t))
        return ("c", t.dtype), index
    try:
        box = t.untyped_storage()._box
    except AttributeError:
        raise _device_mismatch(f"jax:{max(index, 0)}", str(t.device)) from None
    if box.index != index:
        if index >= 0:
            raise _device_mismatch(f"jax:{index}", f"jax:{box.index}")
        index = box.index
    if t.is_conj() or t.is_neg():
        # NOTE [Conjugate and negative views]: ops that PyTorch lets see these lazy
        # views directly (copy_, clone, mm, ...) apply the bit when they read or write
        desc, index = _describe(t.conj() if t.is_conj() else t._neg_view(), dyn, index)
        return ("m", desc, t.is_conj(), t.is_neg()), index
    arr = box.arr
    if arr.__class__ is _Padded:
        view = None if padded or not read_only else _buckets.view_in_bucket(t, arr, box.dtype)
        if padded or view is not None:
            inner = arr.arr
            if inner.__class__ is _Pending and (inner.value is not None or config.mode != "fused"):
                inner = arr.arr = inner.resolve("read")
            dyn.append(inner)
            if padded.__class__ is _buckets.Layout:  # NOTE [Padded rows]: the plan's reading of it
                dyn.append(arr.length)
                lay = padded
                return (
                    "Q",
                    tuple(inner.shape),
                    box.dtype,
                    lay.size,
                    lay.stride,
                    lay.shape,
                    lay.dim,
                    lay.period,
                    lay.inner,
                    t.dtype,
                ), index
            if padded:  # (the plan checked that t is the whole storage)
                dyn.append(arr.length)
                return ("P", tuple(inner.shape), t.dtype, arr.dim), index
            stride, offset = view
            units = math.prod(inner.shape)
            if offset:  # NOTE [Dynamic storage offsets]
                dyn.append(offset)
                offset = _SLICES if _strided.slices_at(units, t.shape, stride, offset) else None
            return ("v", tuple(inner.shape), box.dtype, units, tuple(t.shape), tuple(stride), offset, t.dtype), index
        arr = _storage.array(box)
    elif arr.__class__ is _Pending and (arr.value is not None or config.mode != "fused"):
        arr = _storage.array(box)
    dtype = t.dtype
    if arr is not None:
        shape = arr.shape
        if dtype is box.dtype and shape == t.shape and t.is_contiguous():
            dyn.append(arr)
            return (shape, dtype), index
        dyn.append(arr)
    elif dtype is box.dtype and t.numel() == box.numel and t.is_contiguous():
        return ("u", tuple(t.shape), dtype), index  # a never-written storage: reads as zeros
    else:
        shape = None
    offset = t.storage_offset()
    stride = t.stride()
    if offset:  # NOTE [Dynamic storage offsets]
        dyn.append(offset)
        units = box.numel * box.dtype.itemsize // dtype.itemsize
        offset = _SLICES if _strided.slices_at(units, t.shape, stride, offset) else None
    return ("v", shape, box.dtype, box.numel, tuple(t.shape), stride, offset, dtype), index


def _key_contiguous(k) -> bool:
    """Whether the tensor a key describes is contiguous (what ``Tensor.is_contiguous()``
    said when the key was made); the key holds the strides of every other layout."""
    if k is None or k[0] in ("s", "c", "u", "P", "Q") or k[0].__class__ is not str:
        return True
    if k[0] == "m":
        return _key_contiguous(k[1])
    shape, stride = k[4], k[5]
    expected = 1
    for size, st in zip(reversed(shape), reversed(stride)):
        if size != 1 and st != expected:
            return False
        expected *= size
    return True


# NOTE [The fast path of a cache hit]: most op calls are hits on plain operands: device
# tensors that are their storage's whole array (contiguous, of the storage's dtype and
# shape), Python scalars and constants. For such calls ``run``'s general loop over the
# schema's kinds, ``_describe`` and the checks of buckets cost more than the computation's
# own call (3-5 us of an ``add``'s 13, benchmarks/dispatch.py). So each spec whose schema
# allows it gets a function, generated from its schema when the op is registered, that
# builds the same key with straight-line code for exactly that case (a Python number or a
# 0-dim CPU tensor where the schema says Tensor included, as ``_describe`` takes them), and
# returns ``_MISS`` as soon as an argument is anything else (a view, a CPU tensor of more
# dims, a bucketed or pending array, a tensor-valued Scalar, a device mismatch; any
# operand of an op over padded rows once an upload went into a bucket, NOTE [Padded
# rows]), or the key is not in the cache: ``run``'s general path then handles the call, errors
# included, as before. Both paths make the same key for a call both handle, so they share
# the cache. Ops planned with buckets, ops that write several arguments or draw random
# numbers, and ops with tensor or scalar lists have no fast path (None); an op's is made
# at its first compile (False until then), not at start-up, where making all ~760 took
# 0.2 s.

_MISS = object()


def _fast_path(spec: OpSpec):
    """The generated fast path of ``spec`` (NOTE [The fast path of a cache hit]), or None."""
    if spec.bucket or spec.multi_write or spec.random or any(k in (TL, OTL, SL) for k in spec.kinds):
        return None
    if not any(k == T or k == OT for k in spec.kinds):
        return None
    n = len(spec.kinds)
    lines = ["def fast(spec, args):", f"    {''.join(f'a{i}, ' for i in range(n))}= args"]
    if spec.rows_rule is not None:
        lines.append("    if _buckets.active: return _MISS")
    lines += ['    fused = config.mode == "fused" and not config.launch_blocking', "    dyn = []", "    index = -1"]
    for i, kind in enumerate(spec.kinds):
        a = f"a{i}"
        if kind == T or kind == OT:
            body = [
                f"c = {a}.__class__",
                "if c is float or c is int or c is bool:",  # (a Python number where the schema says Tensor)
                f"    dyn.append({a})",
                f"    k{i} = ('s', c)",
                f"elif c is not Tensor and not isinstance({a}, Tensor): return _MISS",
                "else:",
                f" try: b = {a}.untyped_storage()._box",
                " except AttributeError:",  # (a CPU scalar, as PyTorch wraps a Python number: as _describe)
                f"    if not {a}.is_cpu or {a}.dim() != 0: return _MISS",
                f"    dyn.append(_host_copy({a}))",
                f"    k{i} = ('c', {a}.dtype)",
                " else:",
                "  x = b.arr",
                "  if x.__class__ is not _Array and (x.__class__ is not _Pending or x.value is not None or not fused): "
                "return _MISS",
                "  shape = x.shape",
                f"  if {a}.dtype is not b.dtype or shape != {a}.shape or {a}.is_conj() or {a}.is_neg() "
                f"or not {a}.is_contiguous(): return _MISS",
                "  if index < 0: index = b.index",
                "  elif b.index != index: return _MISS",
                "  dyn.append(x)",
                f"  k{i} = (shape, {a}.dtype)",
            ]
            if kind == OT:
                lines += [f"    if {a} is None: k{i} = None", "    else:"] + [f"        {line}" for line in body]
            else:
                lines += [f"    {line}" for line in body]
        elif kind == S or kind == OS:
            lines += [
                f"    if {a} is None: k{i} = None",
                f"    elif {a}.__class__ is not int and {a}.__class__ is not float and {a}.__class__ is not bool: "
                "return _MISS",
                f"    elif {a} is d{i} or ({a} == d{i} and {a}.__class__ is d{i}.__class__): k{i} = _DEFAULT",
                "    else:",
                f"        k{i} = {a}.__class__",
                f"        dyn.append({a})",
            ]
        else:  # X
            lines += [
                f"    if {a}.__class__ is _Generator: return _MISS",
                f"    k{i} = _freeze({a}) if {a}.__class__ is list else {a}",
            ]
    lines += [
        "    if index < 0: return _MISS",
        # (the spec's cache read at each call: torch_jax.override swaps it for the override's)
        f"    entry = spec.cache.get(({''.join(f'k{i}, ' for i in range(n))}index))",
        "    if entry is None or (not fused and _fused.pending): return _MISS",
        '    _counters["ops"] += 1',
        '    _counters["cache_hits"] += 1',
        "    entry.used = True",
        "    try:",
        "        if fused: results = _fused.record(entry, dyn)",
        "        elif entry.fn is None or _profiler.recording: results = entry.run(dyn)",
        "        else: results = entry.fn(*dyn)",
        "    except RuntimeError as e:",
        "        raise _freed(spec, e) or e from None",
        "    return entry.finish(args, results)",
    ]
    namespace = {
        "_buckets": _buckets,
        "_MISS": _MISS,
        "config": config,
        "Tensor": Tensor,
        "_Array": _ArrayImpl,
        "_Pending": _Pending,
        "_Generator": _Generator,
        "_freeze": _freeze,
        "_DEFAULT": ("d",),
        "_fused": _fused,
        "_profiler": _profiler,
        "_counters": _counters,
        "_freed": _freed,
        "_host_copy": host_copy,
        **{f"d{i}": d for i, d in enumerate(spec.defaults)},
    }
    exec(compile("\n".join(lines) + "\n", f"<torch_jax fast path {spec.op}>", "exec"), namespace)
    return namespace["fast"]


def run(spec: OpSpec, args):
    """Run one op call; ``args`` are the schema's arguments in order."""
    fast = spec.fast
    if fast:  # NOTE [The fast path of a cache hit]
        out = fast(spec, args)
        if out is not _MISS:
            return out
    key = []
    dyn = []
    index = -1
    generator = None
    plan = accepts = length = None
    if spec.bucket:  # NOTE [Buckets] (runtime/_buckets)
        planned = _buckets.plan(spec, args)
        if planned is not None:
            plan, accepts = planned
            _counters["bucketed_ops"] += 1
    elif spec.rows_rule is not None and _buckets.active:  # NOTE [Padded rows] (runtime/_buckets)
        planned = _buckets.plan_rows(spec, args)
        if planned is not None:
            plan, accepts = planned
            length = next(iter(accepts.values())).length
            _counters["bucketed_ops"] += 1
    for pos, (kind, a, default) in enumerate(zip(spec.kinds, args, spec.defaults)):
        if kind == T or kind == OT:
            if a is None:
                key.append(None)
            else:
                desc, index = _describe(
                    a, dyn, index, accepts.get((pos, None), False) if accepts else False, pos not in spec.writes
                )
                key.append(desc)
        elif kind == X:
            if a.__class__ is _Generator:  # drawn from below, never part of the key
                generator, a = a, None
            key.append(a if a.__class__ is not list else _freeze(a))
        elif kind == S or kind == OS:
            if a is None:
                key.append(None)
            else:
                if isinstance(a, Tensor):  # a Scalar argument given as a 0-dim tensor
                    a = a.item()
                if a is default or (a == default and a.__class__ is default.__class__):
                    key.append(("d",))
                else:
                    key.append(a.__class__)
                    dyn.append(a)
        elif kind == SL:  # (the foreach ops' per-tensor scalars: step sizes that change every step)
            key.append(tuple(x.__class__ for x in a))
            dyn.extend(a)
        else:  # TL, OTL
            descs = []
            for j, x in enumerate(a):
                if x is None:
                    descs.append(None)
                else:
                    desc, index = _describe(
                        x, dyn, index, accepts.get((pos, j), False) if accepts else False, pos not in spec.writes
                    )
                    descs.append(desc)
            key.append(tuple(descs))
    if index < 0:
        index = _index_without_tensors(spec, args)
    key.append(index)
    if spec.multi_write:
        key.append(_write_groups(spec, args))
    if plan is not None:
        key.append(plan)
    if spec.random:
        # NOTE [jax generators] in device/_accelerator
        dyn.append(_devices.next_key(index) if generator is None else _accelerator.generator_key(generator, index))
    key = tuple(key)
    entry = spec.cache.get(key)
    _counters["ops"] += 1
    fused = config.mode == "fused" and not config.launch_blocking  # (launch blocking: every op at once)
    if not fused and _fused.pending:
        _fused.flush_all("mode change")
        dyn = [_fused.concrete(v) for v in dyn]
    if entry is None:
        try:
            entry = _compile_cache.outside_dynamo(_compile, spec, args, key, index, dyn, plan)
            results = _fused.record(entry, dyn) if fused else entry.run(dyn)
        except _PyTorchError as e:
            raise e.error from None
        except _dtypes.UnsupportedDtype:  # (a result of a dtype JAX lacks: complex32)
            raise
        except Exception as e:  # noqa: BLE001
            if not spec.lowering.oracle:  # (a user's JAX function: its own error)
                raise
            error = _cpu_error(spec, args) or _freed(spec, e)
            if error is not None:
                raise error from None
            raise RuntimeError(
                f"torch_jax: the JAX lowering of {spec.op} failed for these arguments ({type(e).__name__}: "
                f"{e}); PyTorch's CPU kernel accepts them, so this is a torch_jax bug: please report it"
            ) from e
        _compile_cache.admit(spec.cache, key, entry, "op")
        if spec.fast is False:
            spec.fast = _fast_path(spec)
        _recompiles.note_op(spec, key)
        return entry.finish(args, results, length)
    _counters["cache_hits"] += 1
    entry.used = True
    if fused:
        try:
            results = _fused.record(entry, dyn)
        except RuntimeError as e:
            raise _freed(spec, e) or e from None
        return entry.finish(args, results, length)
    try:
        results = entry.run(dyn)
    except RuntimeError as e:
        raise _freed(spec, e) or e from None
    return entry.finish(args, results, length)


def _freed(spec: OpSpec, e: Exception):
    if "has been deleted" in str(e):
        return RuntimeError(
            f"torch_jax: {spec.op} read a tensor whose device buffer was freed (deleted or donated to "
            "another computation); the tensor's storage is no longer usable"
        )
    return None


def _write_targets(spec: OpSpec, args):
    """The tensors an op writes, one per write slot (None for an absent optional)."""
    for i in spec.writes:
        a = args[i]
        if isinstance(a, (list, tuple)):
            yield from a
        else:
            yield a


def _write_groups(spec: OpSpec, args):
    """For each write slot, the first slot writing the same storage: writes to one
    storage must be applied one after the other."""
    seen = {}
    groups = []
    for t in _write_targets(spec, args):
        if t is None:
            groups.append(None)
        else:
            groups.append(seen.setdefault(id(_storage.box_of(t)), len(groups)))
    return tuple(groups)


def _index_without_tensors(spec: OpSpec, args) -> int:
    """The device of an op without device tensor arguments: its ``device`` argument, or
    the box of the tensor it writes (an uninitialized storage)."""
    for name, a in zip(spec.names, args):
        if name == "device" and a is not None:
            return _devices.index_of(a)
    for a in args:
        if isinstance(a, Tensor) and not a.is_cpu:
            return _storage.box_of(a).index
    return _devices.current()


# ---------------------------------------------------------------- compilation


def _meta_of(x):
    if isinstance(x, Tensor) and not x.is_cpu:
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    if x.__class__ is _Generator:  # meta kernels draw nothing; some refs assert on a generator
        return None
    if isinstance(x, (list, tuple)):
        return type(x)(_meta_of(y) for y in x)
    return x


def _meta_key(args):
    """The key of NOTE [Meta outputs of a planned call], or None where a call is not kept."""
    key = []
    for a in args:
        if isinstance(a, Tensor):
            if a.is_cpu:
                return None
            key.append((a.shape, a.stride(), a.dtype))
        elif isinstance(a, (list, tuple)):
            inner = _meta_key(a)
            if inner is None:
                return None
            key.append((a.__class__, inner))
        elif a is None or a.__class__ in _META_KEY_TYPES:
            key.append((a.__class__, a))
        else:
            return None
    return tuple(key)


_META_KEY_TYPES = frozenset(
    {bool, int, float, complex, str, torch.dtype, torch.device, torch.memory_format, torch.layout}
)


def _meta_outputs(spec: OpSpec, args):
    """Run the op's Meta kernel: PyTorch's errors, and the fresh outputs' size, stride
    and dtype (None for an undefined output). Returns None when there is no meta kernel."""
    meta_args, meta_kwargs = [], {}
    for name, kw, a in zip(spec.names, spec.kwarg_only, args):
        if name == "device" and a is not None:
            a = torch.device("meta")
        if kw:
            meta_kwargs[name] = _meta_of(a)
        else:
            meta_args.append(_meta_of(a))
    try:
        out = spec.op(*meta_args, **meta_kwargs)
    except NotImplementedError:
        return None
    except RuntimeError as e:
        if "meta" in str(e) and ("not implemented" in str(e) or "Could not run" in str(e)):
            return None
        raise
    outs = [out] if isinstance(out, Tensor) or out is None else list(out)
    if spec.returns_list:
        return outs
    return [o for o, alias in zip(outs, spec.returns) if alias is None]


_PyTorchError = _context.PyTorchError


_CPU_REPLAY_LIMIT = 1 << 28  # bytes of stand-in tensors we are willing to allocate


def _cpu_error(spec: OpSpec, args, limit: int = _CPU_REPLAY_LIMIT):
    """The exception the CPU kernel raises for these arguments, if any (None as well
    when the inputs are over ``limit`` bytes and were not replayed, and for the ops that
    exist for PrivateUse1 backends only: the CPU's "not implemented" says nothing of
    the arguments, and would hide a failing lowering)."""
    if not spec.lowering.oracle:
        return None
    error = _cpu_replay(spec, args, limit)[1]
    if isinstance(error, NotImplementedError) and "operator for privateuse1 backends" in str(error):
        return None
    return error


def _cpu_replay(spec: OpSpec, args, limit: int):
    """(whether the op was replayed on CPU, the exception it raised or None).

    NOTE [Errors from the CPU oracle]: many Meta kernels are Python reimplementations
    whose messages differ from the CPU kernels' (``a and b must have same reduction
    dim`` for ``mat1 and mat2 shapes cannot be multiplied``). When the Meta kernel
    rejects a call, the op is replayed on CPU tensors of the same sizes, strides and
    dtypes (zeros) so that the user sees the error PyTorch gives on CPU and CUDA."""
    total = 0

    def stand_in(x):
        nonlocal total
        if isinstance(x, Tensor) and not x.is_cpu:
            n = _storage.storage_numel(x.shape, x.stride(), x.storage_offset())
            total += n * x.element_size()
            if total > limit:
                raise OverflowError
            return torch.zeros(n, dtype=x.dtype).as_strided(x.shape, x.stride(), x.storage_offset())
        if isinstance(x, (list, tuple)):
            return type(x)(stand_in(y) for y in x)
        if isinstance(x, torch.device) and x.type != "cpu":
            return torch.device("cpu")
        return x

    try:
        cargs, ckwargs = [], {}
        for name, kw, a in zip(spec.names, spec.kwarg_only, args):
            (ckwargs.__setitem__(name, stand_in(a)) if kw else cargs.append(stand_in(a)))
    except OverflowError:
        return False, None
    try:
        spec.op(*cargs, **ckwargs)
    except Exception as e:  # noqa: BLE001
        return True, e
    return True, None


_DTYPE_PROBE_LIMIT = 1 << 20


def _unsupported_dtype(spec: OpSpec, args):
    """The CPU's error when its kernel does not support these dtypes, if it does not.

    NOTE [Dtypes the CPU does not support]: XLA computes ``abs`` of a bool tensor happily,
    PyTorch raises ``"abs_cpu" not implemented for 'Bool'`` (CUDA: ``"abs_cuda"``). Meta
    kernels do not check dtypes, so on a cache miss the op is replayed on CPU zeros of the
    same sizes (inputs up to 1 MiB; random ops are not replayed, they would advance the
    CPU generator) and only this kind of error is kept: zeros may well raise other
    errors (integer division by zero) that the real values do not."""
    if spec.random or not spec.lowering.oracle:
        return None
    # a combination of dtypes (and option values) the CPU accepted once is not replayed
    # for new shapes: generation with a growing KV cache compiles every op per length
    memo = (spec.op, tuple(_dtype_signature(a) for a in args))
    if memo in _DTYPES_OK:
        return None
    replayed, e = _cpu_replay(spec, args, _DTYPE_PROBE_LIMIT)
    if isinstance(e, (NotImplementedError, RuntimeError)) and _DTYPE_ERROR.search(str(e)):
        return e
    if replayed:  # (inputs over the limit were not asked about: a smaller call still is)
        _DTYPES_OK.add(memo)
    return None


_DTYPES_OK: set = set()


def _dtype_signature(a):
    """What of an argument can decide whether a CPU kernel supports the call: a tensor's
    dtype, a number's type, the value of a string, bool or dtype option."""
    if isinstance(a, Tensor):
        return a.dtype
    if isinstance(a, (list, tuple)):
        return tuple(_dtype_signature(x) for x in a)
    if a is None or isinstance(a, (str, bool, torch.dtype)):
        return a
    return a.__class__


# the CPU's messages for dtypes a kernel refuses ("abs_cpu" not implemented for 'Bool',
# maximum not implemented for complex tensors, argmax(): does not support complex input)
_DTYPE_ERROR = re.compile(r"not implemented for|does not support|not supported for|is not supported")


def _layout(size, stride):
    """How an output is stored: (physical permutation or None, strides).

    Outputs keep PyTorch's strides when they are dense (a permutation of a contiguous
    layout, e.g. an elementwise op on a transposed input); the box then holds the
    array in memory order. Other layouts become contiguous."""
    contiguous = _storage.contiguous_strides(size)
    if list(stride) == contiguous or math.prod(size) <= 1:
        return None, contiguous
    perm = _storage.dense_perm(size, stride)
    if perm is None:
        return None, contiguous
    return perm, list(stride)


def _check(checks, flags) -> None:
    """An op's value checks: read now (waiting for the op), or with the graphs' at the next
    wait under ``config.deferred_checks`` (NOTE [Deferred value checks] in runtime/_fused)."""
    if config.deferred_checks and not config.launch_blocking:
        _fused._deferred.append((checks, flags))
        if len(_fused._deferred) > 1024:  # (a program that never waits: the oldest, long done)
            _fused.check_deferred(512)
    else:
        _fused.raise_failed_checks(checks, flags)


class _Entry:
    """One compiled computation and how to turn its results into tensors."""

    __slots__ = (
        "fn",
        "jitted",
        "traced",
        "out_avals",
        "spec",
        "outs",
        "index",
        "checks",
        "n_groups",
        "single",
        "used",
        "cost",
        "write_order",
        "planned",
        "metas",
        "padded",
    )

    def run(self, dyn):
        """Run the compiled computation (compiled on first use: an entry made while fused
        eager records is only traced)."""
        if self.fn is None:
            before = _compile_cache.allocated()
            self.fn = _compile_cache.outside_dynamo(_compile_op, self.jitted, dyn, self.index)
            self.jitted = None
            _compile_cache.charge(self, _compile_cache.allocated() - before)
        if _profiler.recording:  # NOTE [Device time in torch.profiler]
            return _profiler.timed(f"jit({_stats.op_name(self.spec.op)})", self.index, self.fn, dyn)
        return self.fn(*dyn)

    def finish(self, args, results, length=None):
        if self.planned:
            return self._finish_planned(args, results, length)
        if results.__class__ is not _fused.Outputs:
            if config.launch_blocking:
                jax.block_until_ready(results)
            if self.checks:
                _check(self.checks, results[-len(self.checks) :])
            _last[self.index] = results
        single = self.single
        if single is not None:
            return single.tensor(results[0])
        spec = self.spec
        if spec.inplace:
            self_t = args[0]
            _storage.replace(self_t.untyped_storage()._box, results[0])
            return self_t
        fresh = []
        arrays = iter(results)
        for out in self.outs:
            if out is None:
                fresh.append(None)
            elif out.__class__ is tuple:  # ("value", v): a non-tensor return
                fresh.append(out[1])
            else:
                fresh.append(out.tensor(next(arrays)))
        if spec.writes:
            self._write_back(args, arrays)
        return self._returns(args, fresh)

    def _finish_planned(self, args, results, length=None):
        """``finish`` for a call planned with buckets (NOTE [Buckets]): one computation
        serves many logical shapes, so this call's Meta outputs give the results' shapes
        and int returns; a result in its bucket goes into its storage as ``Padded``.
        With ``length``, the length of the padded rows of every operand (NOTE [Padded
        rows]), the results' shapes are the compiled ones with that length instead."""
        if results.__class__ is not _fused.Outputs:
            if config.launch_blocking:
                jax.block_until_ready(results)
            _last[self.index] = results
            if self.checks:
                _check(self.checks, results[-len(self.checks) :])
        if length is not None:
            return self._finish_rows(args, results, length)
        fresh = []
        arrays = iter(results)
        for i, (out, meta) in enumerate(zip(self.outs, self._metas(args))):
            if out is None:
                fresh.append(None)
            elif out.__class__ is tuple:
                fresh.append(meta)
            elif i in self.padded:
                fresh.append(self._padded_result(i, next(arrays), tuple(meta.shape), meta.stride(), meta.dtype))
            else:
                fresh.append(out.tensor(next(arrays)))
        return self._returns(args, fresh)

    def _metas(self, args):
        """NOTE [Meta outputs of a planned call]: the Meta kernel's outputs for these
        arguments (``_meta_outputs``), kept by the operands' sizes, strides and dtypes and
        the other arguments' values: a Meta dispatch costs about 250 us, and a generation
        loop's bucketed ops (a growing KV cache's ``cat``) call it every token with the
        arguments of a few calls before. Meta kernels read nothing else (a CPU tensor's
        values might be: such calls are not kept). A kernel that raises is not kept either:
        it raises again."""
        key = _meta_key(args)
        if key is None:
            return _meta_outputs(self.spec, args)
        metas = self.metas.get(key)
        if metas is None:
            metas = _meta_outputs(self.spec, args)
            if len(self.metas) >= 256:
                self.metas.clear()
            self.metas[key] = metas
        return metas

    def _finish_rows(self, args, results, length: int):
        fresh = []
        arrays = iter(results)
        for i, out in enumerate(self.outs):
            if out is None:
                fresh.append(None)
            elif i in self.padded:
                d, outer, inner = self.padded[i]
                shape = list(out.size)
                shape[d] = outer * length * inner
                stride = _storage.contiguous_strides(shape)  # (a padded result is contiguous)
                fresh.append(self._padded_result(i, next(arrays), tuple(shape), stride, out.dtype))
            else:
                fresh.append(out.tensor(next(arrays)))
        return self._returns(args, fresh)

    def _padded_result(self, i: int, arr, shape: tuple, stride, dtype):
        """Result ``i``, of logical ``shape``, in its bucket's ``arr`` (stored as blocks
        where a view merged the padded dim with others, NOTE [Padded rows])."""
        d, outer, inner = self.padded[i]
        length = shape[d] // (outer * inner)
        padded = _storage.Padded(arr, shape[:d] + _blocks(outer, length, inner) + shape[d + 1 :], d + (outer > 1))
        return _storage.template(shape, stride, dtype, self.index).tensor(padded)

    def _returns(self, args, fresh):
        spec = self.spec
        if spec.returns_list:
            return fresh
        rets = []
        it = iter(fresh)
        for alias in spec.returns:
            rets.append(next(it) if alias is None else args[alias])
        if len(rets) == 1:
            return rets[0]
        return tuple(rets) if rets else None

    def _write_back(self, args, arrays):
        targets = list(_write_targets(self.spec, args))
        for slot, arr in zip(self.write_order, arrays):
            _storage.replace(_storage.box_of(targets[slot]), arr)


# writes the CPU allows through overlapping (expanded) views: every element gets one value
_OVERLAP_OK = {torch.ops.aten.fill_.Scalar, torch.ops.aten.fill_.Tensor, torch.ops.aten.zero_.default}


def _compile(spec: OpSpec, args, key, index: int, dyn, plan=None) -> _Entry:
    _counters["compiles"] += 1
    if config.debug >= 1:
        print(f"[torch_jax] compiling {spec.op}")
    # what the computation needs of the written tensors (never the tensors themselves:
    # the compiled entry outlives this call)
    targets = [None if t is None else (_TO_NP[t.dtype], tuple(t.shape)) for t in _write_targets(spec, args)]
    for t in _write_targets(spec, args):
        if t is not None and spec.op not in _OVERLAP_OK and _strided.has_internal_overlap(t.shape, t.stride()):
            raise RuntimeError(
                "unsupported operation: more than one element of the written-to tensor refers to a "
                "single memory location. Please clone() the tensor before performing the operation."
            )
    kinds = spec.kinds
    arg_keys = key[: len(kinds)]
    groups = key[len(kinds) + 1] if spec.multi_write else None
    lowering = spec.lowering.fn
    entry = _Entry()
    entry.spec = spec
    entry.index = index
    entry.checks = []
    entry.n_groups = groups

    # where each tensor argument's storage array sits in dyn (for writes)
    positions = {}
    traced_info = {}  # what tracing found: the write order and the value checks

    def call_lowering(dyn, out_dtypes):
        it = _Counting(dyn)
        contiguous = {}
        vals = []
        for pos, (kind, k) in enumerate(zip(kinds, arg_keys)):
            if kind == X:
                vals.append(k)
            elif kind == S or kind == OS:
                vals.append(None if k is None else spec.defaults[pos] if k == ("d",) else next(it))
            elif kind == SL:
                vals.append([next(it) for _ in k])
            elif kind == T or kind == OT:
                positions[pos] = it.i
                vals.append(_read(k, it))
                contiguous[pos] = _key_contiguous(k)
            else:
                items = []
                for j, x in enumerate(k):
                    positions[(pos, j)] = it.i
                    items.append(_read(x, it))
                vals.append(items)
        ctx = _context.TraceContext(spec.op, out_dtypes, index, contiguous=contiguous, bucket=plan)
        if spec.random:
            ctx.rng = next(it)
        with _context.tracing(ctx):
            if plan is not None and plan[0] == "padded":  # NOTE [Padded rows] (runtime/_buckets)
                result = _buckets.run_padded(lowering, vals, plan)
            else:
                result = lowering(*vals)
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        return results, ctx

    # fresh outputs: metadata from the Meta kernel, or from JAX where there is none
    try:
        metas = _meta_outputs(spec, args) if spec.lowering.meta else None
    except Exception as e:  # noqa: BLE001 (re-raised as the CPU's own error)
        raise _PyTorchError(_cpu_error(spec, args) or e) from None
    unsupported = _unsupported_dtype(spec, args)
    if unsupported is not None:
        raise _PyTorchError(unsupported)
    if not spec.lowering.trust_meta:
        metas = None  # the Meta kernel checked the arguments; its output shapes differ from CPU's
    if spec.inplace:
        fresh = []
        # the Meta kernels of some derived in-place ops (logit_) accept a result dtype that
        # cannot be cast back to self; the CPU raises
        natural = jax.eval_shape(lambda *d: call_lowering(d, [targets[0][0]])[0][0], *dyn)
        if not torch.can_cast(_dtypes.to_torch(natural.dtype), args[0].dtype):
            raise _PyTorchError(
                _cpu_error(spec, args)
                or RuntimeError(f"result type {_dtypes.to_torch(natural.dtype)} can't be cast to {args[0].dtype}")
            )
    elif metas is None:
        shaped = jax.eval_shape(
            lambda *d: call_lowering(d, None)[0][: None if spec.returns_list else spec.n_fresh], *dyn
        )
        fresh = [
            None if a is None else (tuple(a.shape), _storage.contiguous_strides(a.shape), _dtypes.to_torch(a.dtype))
            for a in shaped
        ]
    else:
        # None: an undefined tensor; ("value", v): a non-tensor return (an int)
        fresh = [
            m if m is None else (tuple(m.shape), m.stride(), m.dtype) if isinstance(m, Tensor) else ("value", m)
            for m in metas
        ]
    layouts = [None if f is None or f[0] == "value" else _layout(f[0], f[1]) for f in fresh]
    entry.outs = [f if lay is None else _storage.template(f[0], lay[1], f[2], index) for f, lay in zip(fresh, layouts)]
    plain = not spec.inplace and not spec.writes and not spec.returns_list and spec.returns == [None]
    entry.single = entry.outs[0] if plain and len(entry.outs) == 1 and layouts[0] is not None else None
    out_dtypes = [None if lay is None else _TO_NP[f[2]] for f, lay in zip(fresh, layouts)]
    write_slots = _slots(spec, arg_keys)  # (arg position key, tensor key, target tensor)

    def traced(*dyn):
        results, ctx = call_lowering(dyn, out_dtypes if not spec.inplace else [targets[0][0]])
        outs = []
        padded = traced_info["padded"] = {}
        for i, f in enumerate(fresh):
            if layouts[i] is None:
                continue
            r = results[i]
            if r.__class__ is _context.PaddedValue:  # NOTE [Buckets]: a result in its bucket
                d, n = r.dim, r.arr.shape[r.dim]
                if layouts[i][0] is not None:
                    raise RuntimeError(f"torch_jax internal error: {spec.op} gave a padded result in a permuted layout")
                # (rows merged by a view, NOTE [Padded rows]: stored as blocks of ``period``)
                period, inner = (n if r.period is None else r.period), r.inner
                outer = n // (period * inner)
                padded[i] = (d, outer, inner)
                r = _cast(r.arr, out_dtypes[i], f[0][:d] + (n,) + f[0][d + 1 :], spec.op)
                r = r.reshape(f[0][:d] + _blocks(outer, period, inner) + f[0][d + 1 :])
                outs.append(r)
                continue
            else:
                r = _cast(r, out_dtypes[i], f[0], spec.op)
            perm = layouts[i][0]
            outs.append(r if perm is None else jnp.transpose(r, perm))
        if spec.inplace:
            values = results[:1]
        else:
            values = []
            for i, r in zip(spec.writes, results[len(fresh) :]):
                if kinds[i] != TL:
                    values.append(r)
                else:  # a Tensor[] written, or left as it is (None)
                    values.extend([None] * len(arg_keys[i]) if r is None else r)
        current = {}
        order = []
        for slot, ((pos, k), t, v) in enumerate(zip(write_slots, targets, values)):
            if t is None or v is None:
                continue
            g = slot if groups is None else groups[slot]
            if g not in current:
                order.append(g)
                current[g] = dyn[positions[pos]] if _has_array(k) else None
            v = _cast(v, t[0], t[1], spec.op)
            current[g] = _write(current[g], k, v, _offset(k, dyn, positions[pos]))
        outs.extend(current[g] for g in order)
        traced_info["write_order"] = order  # the write slot (of each storage) whose box takes each array
        traced_info["checks"] = [(exc, msg) for _, _, exc, msg in ctx.checks]
        for flag, value, _, _ in ctx.checks:
            outs.append(jnp.stack([flag.astype(jnp.int64), value]))
        return tuple(outs)

    # NOTE [Compiled, not jitted]: the entry holds the AOT-compiled executable itself,
    # so that dropping the entry (NOTE [Bounded compile cache]) frees it. JAX's tracing
    # and lowering caches are keyed (weakly) by the function traced, and they hold its
    # jaxpr and lowered module for as long as it lives: with ``traced`` itself, which the
    # entry keeps for fused graphs, that was 0.9 MB for each entry (a relu compiled for
    # 200 shapes: 1.57 MB an entry, 0.26 with a throwaway function; jax.clear_caches()
    # freed the difference). So JAX only ever sees throwaway wrappers (``_compile_cache.fresh``).
    # (what tracing finds goes through traced_info, not onto the entry: ``traced`` holding
    # the entry would make a reference cycle, which only the garbage collector frees,
    # at 0.1-0.2 s a collection in a large process, so every eviction would wait for one)
    entry.traced = traced
    entry.jitted = jax.jit(_compile_cache.fresh(traced), out_shardings=_devices.sharding(index))
    entry.fn = None
    entry.cost = 0
    if config.mode == "fused":
        # NOTE [Fused eager]: tracing gives the outputs' shapes and the write order and
        # value checks; XLA compiles the whole graph later, not this op
        entry.out_avals = jax.eval_shape(_compile_cache.fresh(traced), *dyn)
    else:
        entry.out_avals = None
        before = _compile_cache.allocated()
        entry.fn = _compile_op(entry.jitted, dyn, index)
        entry.jitted = None  # (and with it what JAX kept of its trace, before the cost is read)
        entry.cost = _compile_cache.allocated() - before
    entry.write_order, entry.checks = traced_info["write_order"], traced_info["checks"]
    entry.planned, entry.padded = plan is not None, traced_info["padded"]
    entry.metas = {} if entry.planned else None
    return entry


def _compile_op(jitted, dyn, index: int):
    """The executable of one op's computation (NOTE [Cheap compilation of small
    computations] in runtime/_xla_options)."""
    start = time.perf_counter()
    with _xla_options.lowering():  # NOTE [One MLIR context for many lowerings]
        lowered = jitted.lower(*dyn)
    outs = [o.shape for o in jax.tree.leaves(lowered.out_info)]
    compiled = lowered.compile(compiler_options=_xla_options.compile_options(index, dyn, outs, lowered))
    _recompiles.note_op_compile(time.perf_counter() - start)
    return cpp_call(compiled)


def cpp_call(compiled):
    """``compiled``'s C++ call path, which ``Compiled.__call__`` makes on its first call and
    then reaches through a Python frame (0.3 of an op's 3.4 us with JAX 0.10); the
    executable itself where JAX has no such path for it."""
    try:
        return compiled._executable.create_cpp_call(compiled._params) or compiled
    except AttributeError:  # (JAX internals: where they move, the public call)
        return compiled


class _Counting:
    """An iterator over dyn that knows its position."""

    __slots__ = ("dyn", "i")

    def __init__(self, dyn):
        self.dyn = dyn
        self.i = 0

    def __iter__(self):
        return self

    def __next__(self):
        v = self.dyn[self.i]
        self.i += 1
        return v


def _slots(spec: OpSpec, arg_keys):
    slots = []
    for i in spec.writes:
        if spec.kinds[i] == TL:
            slots.extend(((i, j), k) for j, k in enumerate(arg_keys[i]))
        else:
            slots.append((i, arg_keys[i]))
    return slots


def _has_array(k) -> bool:
    tag = k[0]
    if tag == "m":
        return _has_array(k[1])
    return not (tag == "u" or (tag == "v" and k[1] is None))


def _math_bits(value, conj: bool, neg: bool):
    if conj:
        value = jnp.conj(value)
    if neg:
        value = -value
    return value


def _write(arr, k, value, offset):
    """The storage array after writing ``value`` through the tensor described by ``k``."""
    if k[0] == "m":  # storing v through a conjugate (negative) view stores conj(v) (-v)
        return _write(arr, k[1], _math_bits(value, k[2], k[3]), offset)
    if k[0] == "v":
        _, _, box_dtype, numel, size, stride, static, dtype = k
        view = (size, stride, offset, _TO_NP[dtype])
        return _strided.write(arr, _TO_NP[box_dtype], numel, view, value, static == _SLICES)
    return value  # the tensor is its whole storage, in the array's shape


def _blocks(outer: int, length: int, inner: int) -> tuple:
    """The dims a padded dim of ``outer`` blocks of ``length`` steps of ``inner`` is stored as
    (NOTE [Padded rows] in runtime/_buckets)."""
    return ((outer,) if outer > 1 else ()) + (length,) + ((inner,) if inner > 1 else ())


def _read(k, it):
    """The JAX value of one tensor argument inside the computation."""
    if k is None:
        return None
    tag = k[0]
    if tag == "s" or tag == "c":
        return next(it)
    if tag == "u":
        return jnp.zeros(k[1], _TO_NP[k[2]])
    if tag == "m":
        return _math_bits(_read(k[1], it), k[2], k[3])
    if tag == "P":  # NOTE [Buckets] (runtime/_buckets): the bucket's array and the length
        arr = next(it)
        return _context.PaddedValue(arr, k[3], next(it))
    if tag == "Q":  # NOTE [Padded rows] (runtime/_buckets): a view of the bucket's array
        _, bucket, box_dtype, size, stride, shape, dim, period, inner, dtype = k
        arr = next(it)
        view = _strided.read(arr, _TO_NP[box_dtype], math.prod(bucket), (size, stride, 0, _TO_NP[dtype]))
        return _context.PaddedValue(view.reshape(shape), dim, next(it), period, inner)
    if tag == "v":
        _, shape, box_dtype, numel, size, stride, offset, dtype = k
        arr = next(it) if shape is not None else None
        aligned = offset == _SLICES
        if offset is None or aligned:
            offset = next(it)
        return _strided.read(arr, _TO_NP[box_dtype], numel, (size, stride, offset, _TO_NP[dtype]), aligned)
    return next(it)


def _offset(k, dyn, p):
    """The storage offset of a written view: static, or its traced dyn entry."""
    if k[0] == "m":
        return _offset(k[1], dyn, p)
    if k[0] != "v":
        return 0
    if k[6] is not None and k[6] != _SLICES:
        return k[6]
    return dyn[p + 1] if k[1] is not None else dyn[p]


def _cast(r, dtype: np.dtype, shape: tuple, op):
    """A lowering's result of ``op`` in ``dtype``, a value for every element broadcast to
    ``shape`` (compile/_graph casts compiled graphs' results here too)."""
    r = cast(jnp.asarray(r), dtype)
    if tuple(r.shape) != tuple(shape):
        try:
            if r.size != 1:  # a value for every element may be broadcast; anything else is a bug
                raise ValueError
            return jnp.broadcast_to(r, shape)
        except ValueError:
            raise RuntimeError(
                f"torch_jax internal error: the lowering of {op} returned shape {tuple(r.shape)}, "
                f"PyTorch expects {tuple(shape)}"
            ) from None
    return r


def safe_name(name: str) -> str:
    return name + "_" if keyword.iskeyword(name) else name
