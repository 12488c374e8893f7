"""FlexAttention's higher-order ops in compiled graphs, blockwise.

NOTE [Blockwise flex attention]: under ``torch.compile`` ``flex_attention`` reaches
AOTAutograd as the higher-order op ``flex_attention`` (its score_mod and mask_mod traced
into small aten graphs, the BlockMask as its tensors and block sizes), and its gradient as
``flex_attention_backward``: AOTAutograd does not decompose either, so each is one node of
the graph the ``jax`` backend gets (NOTE [Compiled graphs] in compile/_graph), and here
each becomes a blockwise JAX computation inside the graph's one XLA computation. (PyTorch's
own dense implementation, the one eager mode runs and the one the graph ran op by op
before, builds the L x S scores; Inductor replaces it with a Triton or C++ template.)

The forward is FlashAttention's: the queries go in tiles of the mask's query block; for
each tile a loop visits only the KV blocks its BlockMask row lists (``kv_num_blocks`` /
``kv_indices``: score_mod then mask_mod; then ``full_kv_num_blocks`` / ``full_kv_indices``:
score_mod only, the mask is known to be all true there), one KV tile a step, keeping the
running maximum, sum and output of an online softmax; a block it does not list costs
nothing. A block wider than ``_KV_TILE`` columns or ``_Q_TILE`` rows (the single block of
the mask PyTorch makes when none is given is ``1 << 30`` wide) is split into tiles that
divide it, so no step holds more than ``_Q_TILE`` x ``_KV_TILE`` scores per head. Where the
mask's rows differ between batch elements or heads, a step loads each one's own block and
the loop runs for the longest row, the others' extra steps masked.

One tile a step, measured (L = 4096, 4 heads, head dim 64, XLA:CPU on one thread): a
causal mask of 128-blocks in 93 ms, where steps of four listed blocks side by side (fewer,
larger products) took 294 ms; the gathered tiles and the listed-but-empty tails of rows
cost more than the loop's steps save. Query tiles of a block taller than ``_Q_TILE``
(no mask) are large because larger products are what XLA:CPU spreads over its threads.

The backward walks the same tiles and blocks once more, recomputing each tile's scores
from the saved logsumexp (no softmax is stored): dQ accumulates per query tile, dK and dV
are added into their blocks, and the gradients of score_mod (for its score and for the
captured tensors that require grad) come from ``jax.vjp`` of score_mod's lowering on the
tile. PyTorch hands the op a joint graph of score_mod for this; it is not used: its
gradient of a captured tensor is a ``zeros_and_scatter`` of the tensor's full size per
score element, which vectorizes over the scores only in PyTorch's own vmap rule.

score_mod and mask_mod run through the lowering table (NOTE [One lowering table] in
ops/_registry), op by op as compile/_graph runs a node, vectorized with ``jax.vmap`` over
every score of the tile, as PyTorch's dense implementation vmaps them. A value check of
theirs (an index out of range) is or-ed over the loops and raised after the call as any
compiled graph's (NOTE [Compiled graphs]). Padded positions (a length that is not a
multiple of the block) reach them as the last real position, so a captured tensor indexed
by position is never read out of range there; their scores are masked.

Numbers follow PyTorch's dense implementation: scores in float32 (float64 for float64
inputs), ``score_mod`` on ``scale * q @ k^T``, rows with no allowed score give output 0
and logsumexp -inf, the logsumexp and maximum returned in base 2 as the op defines them.
Anything else (a random op in score_mod, a higher-order op inside it) makes the graph run
op by op (``Unsupported``), where PyTorch's dense implementation runs.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch
from jax import lax

from torch_jax.compile import _graph
from torch_jax.ops._matmul import _PRECISION
from torch_jax.runtime import _stats
from torch_jax.tensor import _dtypes

# the widest KV tile and the most query rows of a tile (NOTE [Blockwise flex attention])
_KV_TILE, _Q_TILE = 128, 1024
_LN2 = math.log(2.0)


def _hops() -> dict:
    from torch._higher_order_ops.flex_attention import flex_attention, flex_attention_backward

    return {flex_attention: _forward, flex_attention_backward: _backward}


def plan(node, gm) -> tuple:
    """How a higher-order op node of ``gm`` runs: ("hop", fn, mods), where fn(node, args,
    index, checks, mods) gives its value and mods are its score_mod and mask_mod as
    ``_Mod``s; raises ``_graph.Unsupported`` for any other higher-order op."""
    fn = _hops().get(node.target)
    if fn is None:
        raise _graph.Unsupported(f"the higher-order op {node.target.name()}")
    # score_mod's and mask_mod's graphs (the backward's joint graph is not used)
    score, mask = (node.args[3], node.args[4][-1]) if fn is _forward else (node.args[7], node.args[9][-1])
    return ("hop", fn, (_Mod(getattr(gm, score.target)), _Mod(getattr(gm, mask.target))))


# ------------------------------------------------------------ score_mod and mask_mod


class _Mod:
    """A score_mod or mask_mod graph (aten ops on 0-dim tensors) as a JAX function, each
    node run as compile/_graph runs it (``Program._node``, which reads only ``plans``)."""

    def __init__(self, gm: torch.fx.GraphModule):
        self.gm = gm
        self.nodes = list(gm.graph.nodes)
        self.plans = {}
        for n in self.nodes:
            if n.op == "get_attr" and not isinstance(getattr(gm, n.target), torch.Tensor):
                raise _graph.Unsupported(f"a score_mod or mask_mod holding {type(getattr(gm, n.target)).__name__}")
            if n.op != "call_function" or n.target in _graph._SIZE_OPS:
                continue
            if isinstance(n.target, torch._ops.HigherOrderOperator):
                raise _graph.Unsupported(f"the higher-order op {n.target.name()} inside a score_mod or mask_mod")
            if not isinstance(n.target, torch._ops.OpOverload):
                continue  # (operator.getitem)
            p = _graph.plan_node(n)
            if p[0] != "rule" and p[1].random:
                raise _graph.Unsupported(f"the random op {n.target} inside a score_mod or mask_mod")
            self.plans[n] = p

    def __call__(self, args, index: int, checks: list):
        env = {}
        it = iter(args)

        def value(x):
            if isinstance(x, torch.fx.Node):
                return env[x]
            if isinstance(x, (list, tuple)):
                return type(x)(value(y) for y in x)
            if isinstance(x, dict):
                return {k: value(y) for k, y in x.items()}
            return x

        for n in self.nodes:
            if n.op == "placeholder":
                env[n] = next(it)
            elif n.op == "get_attr":  # (a constant the mod made: a CPU tensor)
                env[n] = jnp.asarray(_dtypes.tensor_to_numpy(getattr(self.gm, n.target).cpu()))
            elif n.op == "call_function":
                args_, kwargs = value(n.args), value(n.kwargs)
                if n in self.plans:
                    env[n] = _graph.Program._node(self, n, args_, kwargs, index, checks, None)
                elif n.target in _graph._SIZE_OPS:
                    env[n] = _graph._SIZE_OPS[n.target](*args_)
                else:
                    env[n] = n.target(*args_, **kwargs)
            elif n.op == "output":
                out = value(n.args[0])
                return out[0] if isinstance(out, (list, tuple)) else out
        raise AssertionError("a graph without an output node")


def _each(mod, shape, batched, fixed, index: int, found: list):
    """``mod`` on every element of a tile of ``shape``: ``batched`` arrays broadcast to it
    (the score and the four positions), ``fixed`` the captured values, as they are. Its
    value checks join ``found``, reduced over the tile."""
    n = math.prod(shape)
    flat = [jnp.broadcast_to(a, shape).reshape(n) for a in batched]
    specs = []

    def one(*xs):
        checks: list = []
        r = mod(list(xs[: len(batched)]) + list(xs[len(batched) :]), index, checks)
        specs[:] = [(exc, msg) for _, _, exc, msg in checks]
        return r, [(bad, v) for bad, v, _, _ in checks]

    out, flags = jax.vmap(one, in_axes=(0,) * len(batched) + (None,) * len(fixed))(*flat, *fixed)
    for (bad, v), (exc, msg) in zip(flags, specs):
        found.append((jnp.any(bad), jnp.max(jnp.where(bad, v, jnp.iinfo(jnp.int64).min)), exc, msg))
    return out.reshape(shape)


def _loop(trip, body, state, found: list):
    """``lax.fori_loop(0, trip, ...)`` whose body, ``body(j, state, found)``, may record
    value checks: they are or-ed over the iterations (the first failing value kept)."""
    probe: list = []
    jax.eval_shape(lambda s: body(jnp.int32(0), s, probe), state)  # (how many checks)

    def step(j, carry):
        st, flags = carry
        mine: list = []
        st = body(j, st, mine)
        flags = [(f | b, jnp.where(f, v, w)) for (f, v), (b, w, _, _) in zip(flags, mine)]
        return st, flags

    init = [(jnp.bool_(False), jnp.int64(0)) for _ in probe]
    state, flags = lax.fori_loop(0, trip, step, (state, init))
    found.extend((f, v, exc, msg) for (f, v), (_, _, exc, msg) in zip(flags, probe))
    return state


def _scan(body, carry, count: int, found: list):
    """``lax.scan`` over ``range(count)`` whose body, ``body(carry, t, found)`` ->
    (carry, y), may record value checks (or-ed over the steps)."""
    probe: list = []
    jax.eval_shape(lambda c: body(c, jnp.int32(0), probe), carry)

    def step(c, t):
        c, flags = c
        mine: list = []
        c, y = body(c, t, mine)
        flags = [(f | b, jnp.where(f, v, w)) for (f, v), (b, w, _, _) in zip(flags, mine)]
        return (c, flags), y

    init = [(jnp.bool_(False), jnp.int64(0)) for _ in probe]
    (carry, flags), ys = lax.scan(step, (carry, init), jnp.arange(count, dtype=jnp.int32))
    found.extend((f, v, exc, msg) for (f, v), (_, _, exc, msg) in zip(flags, probe))
    return carry, ys


# ------------------------------------------------------------ the tiles


def _tile(block: int, length: int, cap: int) -> tuple[int, int]:
    """(tile width, tiles per block) for blocks of ``block`` positions over ``length``:
    a block wider than ``cap`` is split into tiles that divide it (or, where one block
    covers everything, into ``cap``-wide tiles over ``length``)."""
    if block >= length:
        width = min(cap, length)
        return width, -(-length // width)
    if block <= cap:
        return block, 1
    width = max(d for d in range(1, cap + 1) if block % d == 0)
    return width, block // width


class _Geometry:
    """Shapes, tiles and the BlockMask of one call. Heads are (Hkv, G): query head
    ``hkv * G + g`` reads KV head ``hkv`` (grouped-query attention)."""

    def __init__(self, q, k, v, block_mask, scale):
        self.B, self.Hq, self.L, self.E = q.shape
        self.Bkv, self.Hkv, self.S, _ = k.shape
        self.Ev = v.shape[-1]
        self.G = self.Hq // self.Hkv
        self.dtype = q.dtype
        self.work = jnp.float64 if q.dtype == jnp.float64 else jnp.float32  # (PyTorch's working precision)
        self.scale = scale
        # the BlockMask as ``as_tuple()`` gives it: (q_len, kv_len, kv_num_blocks, kv_indices,
        # full_kv_num_blocks, full_kv_indices, q_num_blocks, ...; torch 2.13 adds four
        # write-order entries before the sizes) ..., Q_BLOCK_SIZE, KV_BLOCK_SIZE, mask_mod
        self.kv_num, self.kv_idx, self.full_num, self.full_idx = block_mask[2:6]
        self.q_block, self.kv_block = int(block_mask[-3]), int(block_mask[-2])
        self.uniform = self.kv_num.shape[0] == 1 and self.kv_num.shape[1] == 1
        self.Tq, _ = _tile(self.q_block, self.L, _Q_TILE)
        self.nq = -(-self.L // self.Tq)
        self.Tk, self.nsub = _tile(self.kv_block, self.S, _KV_TILE)
        nkv = self.kv_idx.shape[-1]
        self.Sp = max(self.S, (nkv - 1) * self.kv_block + self.nsub * self.Tk)
        self.Lp = self.nq * self.Tq
        self.b = jnp.arange(self.B, dtype=jnp.int32).reshape(self.B, 1, 1, 1, 1)
        self.h = jnp.arange(self.Hq, dtype=jnp.int32).reshape(1, self.Hkv, self.G, 1, 1)
        self._bi = jnp.arange(self.B).reshape(self.B, 1, 1, 1)
        self._hi = jnp.arange(self.Hkv).reshape(1, self.Hkv, 1, 1)

    def pad(self, x, length: int, axis: int = 2):
        extra = length - x.shape[axis]
        if extra == 0:
            return x
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, extra)
        return jnp.pad(x, widths)

    def kv(self, x):
        """K or V as (B, Hkv, Sp, D): the batch broadcast (Bkv 1), the length padded."""
        x = jnp.broadcast_to(x, (self.B,) + x.shape[1:])
        return self.pad(x, self.Sp)

    def q_tile(self, x, t):
        """Rows ``t * Tq ...`` of a (B, Hq, Lp, ...) array, as (B, Hkv, G, Tq, ...)."""
        rows = lax.dynamic_slice_in_dim(x, t * self.Tq, self.Tq, axis=2)
        return rows.reshape((self.B, self.Hkv, self.G, self.Tq) + x.shape[3:])

    def q_pos(self, t):
        pos = t * self.Tq + jnp.arange(self.Tq, dtype=jnp.int32)
        return jnp.minimum(pos, self.L - 1).reshape(1, 1, 1, self.Tq, 1)

    def row(self, num, idx, t):
        """The mask row of query tile ``t``: its block count and block indices, as
        (B, Hkv, G) and (B, Hkv, G, n) (uniform masks: (1, 1, 1) and (1, 1, 1, n))."""
        r = (t * self.Tq) // self.q_block
        count = lax.dynamic_index_in_dim(num, r, axis=2, keepdims=False)
        blocks = lax.dynamic_index_in_dim(idx, r, axis=2, keepdims=False)
        if self.uniform:
            return count.reshape(1, 1, 1), blocks.reshape(1, 1, 1, -1)
        count = jnp.broadcast_to(count, (self.B, self.Hq)).reshape(self.B, self.Hkv, self.G)
        blocks = jnp.broadcast_to(blocks, (self.B, self.Hq, blocks.shape[-1]))
        return count, blocks.reshape(self.B, self.Hkv, self.G, -1)

    def trip(self, count):
        """Steps of a row's loop: the longest row's listed blocks, ``nsub`` tiles each."""
        return count.max() * self.nsub

    def step(self, count, blocks, j):
        """Step ``j`` of a row's loop: (the first KV position of its tile, whether the row
        lists the tile's block), each (1, 1, 1) or (B, Hkv, G)."""
        jb, sub = j // self.nsub, j % self.nsub
        listed = jb < count
        block = jnp.take(blocks, jnp.minimum(jb, blocks.shape[-1] - 1), axis=-1)
        start = jnp.clip(block * self.kv_block + sub * self.Tk, 0, self.Sp - self.Tk)
        return start, listed

    def _positions(self, start):
        return start[..., None] + jnp.arange(self.Tk, dtype=start.dtype)  # (..., Tk)

    def gather(self, x, start):
        """A step's KV tile: (B, Hkv, Tk, D) for a uniform mask, else (B, Hkv, G, Tk, D)."""
        if self.uniform:
            return lax.dynamic_slice_in_dim(x, start.reshape(()), self.Tk, axis=2)
        return x[self._bi, self._hi, self._positions(start)]

    def scatter_add(self, acc, start, grad):
        """``acc`` (B, Hkv, Sp, D) plus a step's gradient, (B, Hkv, G, Tk, D), at its tile."""
        if self.uniform:
            s = start.reshape(())
            old = lax.dynamic_slice_in_dim(acc, s, self.Tk, axis=2)
            grad = grad.sum(axis=2).astype(acc.dtype)  # (the G heads read one KV tile)
            return lax.dynamic_update_slice_in_dim(acc, old + grad, s, axis=2)
        return acc.at[self._bi, self._hi, self._positions(start)].add(grad.astype(acc.dtype))

    def k_pos(self, start, listed):
        """(KV positions, whether the tile is listed), each (..., 1, Tk or 1) to broadcast
        over a step's scores."""
        return self._positions(start)[..., None, :].astype(jnp.int32), listed[..., None, None]

    def dot(self, spec: str, a, b, dtype=None):
        return jnp.einsum(
            spec,
            a,
            b,
            precision=_PRECISION[torch.get_float32_matmul_precision()],
            preferred_element_type=dtype,
        )

    def scores(self, qt, kt):
        """scale * q @ k^T of a step, (B, Hkv, G, Tq, Tk), in the working precision."""
        spec = "bhgqe,bhke->bhgqk" if kt.ndim == 4 else "bhgqe,bhgke->bhgqk"
        return self.dot(spec, qt.astype(self.work), kt.astype(self.work)) * jnp.asarray(self.scale, self.work)


class _Mods:
    """The call's score_mod and mask_mod, applied on a tile."""

    def __init__(self, geo, score, mask, score_bufs, mask_bufs, index):
        self.geo, self.score, self.mask = geo, score, mask
        self.score_bufs, self.mask_bufs, self.index = list(score_bufs), list(mask_bufs), index

    def score_of(self, s, qpos, kpos, found, bufs=None):
        geo = self.geo
        bufs = self.score_bufs if bufs is None else bufs
        r = _each(self.score, s.shape, [s, geo.b, geo.h, qpos, jnp.minimum(kpos, geo.S - 1)], bufs, self.index, found)
        return r.astype(geo.work)

    def keep(self, shape, qpos, kpos, listed, partial: bool, found):
        """Which scores of the tile count: listed blocks, real KV positions, and mask_mod's
        verdict in the blocks that are not known to be full."""
        geo = self.geo
        keep = (kpos < geo.S) & listed
        if partial:
            m = _each(
                self.mask, shape, [geo.b, geo.h, qpos, jnp.minimum(kpos, geo.S - 1)], self.mask_bufs, self.index, found
            )
            keep = keep & m.astype(jnp.bool_)
        return jnp.broadcast_to(keep, shape)

    def rows(self, t):
        """The loops of query tile ``t``: (count, blocks, partial) for listed and full blocks."""
        geo = self.geo
        out = [(*geo.row(geo.kv_num, geo.kv_idx, t), True)]
        if geo.full_num is not None:
            out.append((*geo.row(geo.full_num, geo.full_idx, t), False))
        return out


# ------------------------------------------------------------ forward


def _forward(node, args, index: int, checks: list, mods: tuple):
    q, k, v, _score, block_mask, scale, _options, score_bufs, mask_bufs = args
    _stats.counters["flex_attention_blockwise"] += 1  # (each one traced: tests count them)
    geo = _Geometry(q, k, v, block_mask, scale)
    m = _Mods(geo, *mods, score_bufs, mask_bufs, index)
    qp, kp, vp = geo.pad(q, geo.Lp), geo.kv(k), geo.kv(v)
    work, shape = geo.work, (geo.B, geo.Hkv, geo.G, geo.Tq)

    def tile(_, t, found):
        qt = geo.q_tile(qp, t)
        qpos = geo.q_pos(t)
        state = (
            jnp.full(shape, -jnp.inf, work),  # running maximum
            jnp.zeros(shape, work),  # running sum of exp(score - maximum)
            jnp.zeros(shape + (geo.Ev,), work),  # running output
        )
        for count, blocks, partial in m.rows(t):

            def visit(j, state, found, count=count, blocks=blocks, partial=partial):
                mx, total, acc = state
                start, listed = geo.step(count, blocks, j)
                kt, vt = geo.gather(kp, start), geo.gather(vp, start)
                kpos, listed = geo.k_pos(start, listed)
                s = m.score_of(geo.scores(qt, kt), qpos, kpos, found)  # (B, Hkv, G, Tq, Tk)
                keep = m.keep(s.shape, qpos, kpos, listed, partial, found)
                s = jnp.where(keep, s, -jnp.inf)
                new = jnp.maximum(mx, s.max(axis=-1))
                base = jnp.where(jnp.isneginf(new), 0, new)  # (a row with nothing yet: exp(-inf) = 0)
                p = jnp.exp(s - base[..., None])
                fade = jnp.exp(mx - base)
                spec = "bhgqk,bhkd->bhgqd" if vt.ndim == 4 else "bhgqk,bhgkd->bhgqd"
                pv = geo.dot(spec, p.astype(geo.dtype), vt, work)
                return new, total * fade + p.sum(axis=-1), acc * fade[..., None] + pv

            state = _loop(geo.trip(count), visit, state, found)
        mx, total, acc = state
        some = total > 0
        out = jnp.where(some[..., None], acc / jnp.where(some, total, 1)[..., None], 0)
        lse = jnp.where(some, mx + jnp.log(jnp.where(some, total, 1)), -jnp.inf)
        return None, (out.astype(geo.dtype), lse, mx)

    _, (out, lse, mx) = _scan(tile, None, geo.nq, checks)
    out = _untile(geo, out)  # (B, Hq, L, Ev)
    lse, mx = _untile(geo, lse), _untile(geo, mx)
    results = (out, lse / _LN2, mx / _LN2)  # (the op's statistics are in base 2)
    val = node.meta["val"]
    return tuple(_graph._fit(r, fake, node.target) for r, fake in zip(results, val))


def _untile(geo, x):
    """(nq, B, Hkv, G, Tq, ...) per query tile -> (B, Hq, L, ...)."""
    rest = x.shape[5:]
    x = jnp.moveaxis(x, 0, 3)  # (B, Hkv, G, nq, Tq, ...)
    x = x.reshape((geo.B, geo.Hq, geo.Lp) + rest)
    return x[:, :, : geo.L]


# ------------------------------------------------------------ backward


def _backward(node, args, index: int, checks: list, mods: tuple):
    q, k, v, out, lse, dout, dlse, _score, _joint, block_mask, scale, _options, score_bufs, mask_bufs = args
    _stats.counters["flex_attention_backward_blockwise"] += 1
    geo = _Geometry(q, k, v, block_mask, scale)
    m = _Mods(geo, *mods, score_bufs, mask_bufs, index)
    val = node.meta["val"]
    work = geo.work
    # which captured tensors get a gradient (the op's result holds None for the others)
    wanted = [i for i, g in enumerate(val[3]) if isinstance(g, torch.Tensor)]
    qp, kp, vp = geo.pad(q, geo.Lp), geo.kv(k), geo.kv(v)
    dop = geo.pad(dout.astype(geo.dtype), geo.Lp)
    lse_n = geo.pad(lse.astype(work) * _LN2, geo.Lp)  # (natural log again)
    dlse_n = jnp.zeros(lse_n.shape, work) if dlse is None else geo.pad(dlse.astype(work) / _LN2, geo.Lp)
    delta = geo.pad((out.astype(work) * dout.astype(work)).sum(axis=-1), geo.Lp)  # (B, Hq, Lp)

    def tile(carry, t, found):
        qt, dot_ = geo.q_tile(qp, t), geo.q_tile(dop, t)
        lse_t, dlse_t, delta_t = geo.q_tile(lse_n, t), geo.q_tile(dlse_n, t), geo.q_tile(delta, t)
        finite = jnp.isfinite(lse_t)[..., None]
        lse_safe = jnp.where(jnp.isfinite(lse_t), lse_t, 0)
        qpos = geo.q_pos(t)
        state = (jnp.zeros((geo.B, geo.Hkv, geo.G, geo.Tq, geo.E), work),) + carry
        for count, blocks, partial in m.rows(t):

            def visit(j, state, found, count=count, blocks=blocks, partial=partial):
                dq, dk, dv, dbufs = state
                start, listed = geo.step(count, blocks, j)
                kt, vt = geo.gather(kp, start), geo.gather(vp, start)
                kpos, listed = geo.k_pos(start, listed)
                s = geo.scores(qt, kt)
                keep = m.keep(s.shape, qpos, kpos, listed, partial, found)

                def score(s, grads):
                    bufs = list(m.score_bufs)
                    for i, g in zip(wanted, grads):
                        bufs[i] = g
                    return m.score_of(s, qpos, kpos, found, bufs)

                post, pull = jax.vjp(score, s, [m.score_bufs[i] for i in wanted])
                p = jnp.where(keep & finite, jnp.exp(post - lse_safe[..., None]), 0)
                kg = "" if vt.ndim == 4 else "g"  # (a uniform mask: one KV tile for the G heads)
                dv_t = geo.dot("bhgqk,bhgqd->bhgkd", p.astype(geo.dtype), dot_, work)
                dp = geo.dot(f"bhgqd,bh{kg}kd->bhgqk", dot_.astype(work), vt.astype(work))
                ds = p * (dp - delta_t[..., None] + dlse_t[..., None])  # (d loss / d score_mod's output)
                ds = jnp.where(keep, ds, 0).astype(post.dtype)
                d_s, d_bufs = pull(ds)
                d_s = jnp.where(keep, d_s * jnp.asarray(geo.scale, work), 0).astype(work)
                dq = dq + geo.dot(f"bhgqk,bh{kg}ke->bhgqe", d_s, kt.astype(work))
                dk_t = geo.dot("bhgqk,bhgqe->bhgke", d_s, qt.astype(work))
                dk = geo.scatter_add(dk, start, dk_t)
                dv = geo.scatter_add(dv, start, dv_t)
                dbufs = [a + g.astype(a.dtype) for a, g in zip(dbufs, d_bufs)]
                return dq, dk, dv, dbufs

            state = _loop(geo.trip(count), visit, state, found)
        dq, *carry = state
        return tuple(carry), dq

    init = (
        jnp.zeros((geo.B, geo.Hkv, geo.Sp, geo.E), work),
        jnp.zeros((geo.B, geo.Hkv, geo.Sp, geo.Ev), work),
        [jnp.zeros(jnp.shape(score_bufs[i]), work) for i in wanted],
    )
    (dk, dv, dbufs), dq = _scan(tile, init, geo.nq, checks)
    dq = _untile(geo, dq)
    dk, dv = dk[:, :, : geo.S], dv[:, :, : geo.S]
    if geo.Bkv != geo.B:  # (K and V broadcast over the batch)
        dk, dv = dk.sum(axis=0, keepdims=True), dv.sum(axis=0, keepdims=True)
    grads = [None] * len(val[3])
    for i, g in zip(wanted, dbufs):
        grads[i] = _graph._fit(g, val[3][i], node.target)
    op = node.target
    return (_graph._fit(dq, val[0], op), _graph._fit(dk, val[1], op), _graph._fit(dv, val[2], op), tuple(grads))
