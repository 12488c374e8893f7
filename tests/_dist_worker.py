"""Run by tests/test_distributed.py under torchrun: the scenarios named (comma-separated)
one after another in one launch; each rank checks its own results and prints
``RANK ok SCENARIO`` after each (a failed check raises)."""

from __future__ import annotations

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

from torch_jax.report._sweep import DTYPES  # (the device's dtypes)


def _values(dtype, rank, shape=(3, 4)):
    g = torch.Generator().manual_seed(100 + rank)
    if dtype is torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(0, 7, shape, generator=g).to(dtype)


def _same(got, want, what):
    got = got.cpu()
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        raise AssertionError(f"{what}: got {got} want {want}")


def collectives(rank, size):
    """Every collective on jax tensors against gloo's on the same CPU tensors, every dtype."""
    ops = {
        "sum": dist.ReduceOp.SUM,
        "max": dist.ReduceOp.MAX,
        "min": dist.ReduceOp.MIN,
        "product": dist.ReduceOp.PRODUCT,
        "band": dist.ReduceOp.BAND,
        "bor": dist.ReduceOp.BOR,
        "bxor": dist.ReduceOp.BXOR,
    }
    for dtype in DTYPES:
        x = _values(dtype, rank)
        every = dtype in (torch.float32, torch.int64)  # (every collective; the others: the common ones)
        for name, op in ops.items():
            if not every and name != "sum":
                continue
            if name in ("band", "bor", "bxor") and (dtype.is_floating_point or dtype.is_complex):
                continue
            if name in ("max", "min") and dtype.is_complex:
                continue
            if dtype in (torch.bfloat16, torch.float16, torch.bool, torch.complex64) and name != "sum":
                if not (dtype is torch.bool and name in ("max", "min")):
                    continue  # (gloo has no such kernels)
            want = x.clone()
            dist.all_reduce(want, op)
            got = x.to("jax")
            dist.all_reduce(got, op)
            _same(got, want, f"all_reduce {name} {dtype}")
        want, got = x.clone(), x.to("jax")
        dist.broadcast(want, 1)
        dist.broadcast(got, 1)
        _same(got, want, f"broadcast {dtype}")
        wants = [torch.empty_like(x) for _ in range(size)]
        gots = [torch.empty_like(x, device="jax") for _ in range(size)]
        dist.all_gather(wants, x)
        dist.all_gather(gots, x.to("jax"))
        for g, w in zip(gots, wants):
            _same(g, w, f"all_gather {dtype}")
        want = torch.empty((size * 3, 4), dtype=dtype)
        got = torch.empty((size * 3, 4), dtype=dtype, device="jax")
        dist.all_gather_into_tensor(want, x)
        dist.all_gather_into_tensor(got, x.to("jax"))
        _same(got, want, f"all_gather_into_tensor {dtype}")
        if every:
            big = _values(dtype, rank, (size * 2, 4))
            want = torch.empty((2, 4), dtype=dtype)
            got = torch.empty((2, 4), dtype=dtype, device="jax")
            if True:
                dist.reduce_scatter_tensor(want, big)
                dist.reduce_scatter_tensor(got, big.to("jax"))
                _same(got, want, f"reduce_scatter_tensor {dtype}")
            if dtype is torch.float32:
                # PREMUL_SUM (FSDP2's gradient reduce-scatter with a divide factor; gloo has
                # none): the sum of each rank's tensor times the factor, a float or a tensor
                for factor in (0.25, torch.tensor(0.5)):
                    premul = dist._make_nccl_premul_sum(factor)
                    wants = [torch.empty_like(big) for _ in range(size)]
                    dist.all_gather(wants, big)
                    total = sum(w * factor for w in wants)
                    dist.reduce_scatter_tensor(got, big.to("jax"), op=premul)
                    torch.testing.assert_close(got.cpu(), total[2 * rank : 2 * rank + 2])
                    t = big.to("jax")
                    dist.all_reduce(t, op=premul)
                    torch.testing.assert_close(t.cpu(), total)
            want = torch.empty_like(big)
            got = torch.empty_like(big, device="jax")
            dist.all_to_all_single(want, big)
            dist.all_to_all_single(got, big.to("jax"))
            _same(got, want, f"all_to_all_single {dtype}")
            # uneven splits (as a mixture of experts sends tokens): rank r sends r + 1 + s rows
            # to rank s
            sends = [rank + 1 + s for s in range(size)]
            receives = [r + 1 + rank for r in range(size)]
            rows = _values(dtype, rank, (sum(sends), 2))
            want = torch.empty(sum(receives), 2, dtype=dtype)
            got = torch.empty(sum(receives), 2, dtype=dtype, device="jax")
            dist.all_to_all_single(want, rows, receives, sends)
            dist.all_to_all_single(got, rows.to("jax"), receives, sends)
            _same(got, want, f"all_to_all_single with uneven splits {dtype}")
            # uneven sends and even receives, given as no output splits: every rank sends s + 1
            # rows to rank s
            rows = _values(dtype, rank, (size * (size + 1) // 2, 2))
            want = torch.empty((rank + 1) * size, 2, dtype=dtype)
            got = torch.empty((rank + 1) * size, 2, dtype=dtype, device="jax")
            dist.all_to_all_single(want, rows, None, [s + 1 for s in range(size)])
            dist.all_to_all_single(got, rows.to("jax"), None, [s + 1 for s in range(size)])
            _same(got, want, f"all_to_all_single with uneven sends {dtype}")
        if dtype is torch.float32:
            want, got = x.clone(), x.to("jax")
            dist.reduce(want, 0)
            dist.reduce(got, 0)
            if rank == 0:  # (elsewhere the tensor's value after a reduce is unspecified)
                _same(got, want, "reduce")
            gathered = [torch.empty_like(x, device="jax") for _ in range(size)] if rank == 0 else None
            dist.gather(x.to("jax"), gathered, dst=0)
            if rank == 0:
                for r, g in enumerate(gathered):
                    _same(g, _values(dtype, r), "gather")
            out = torch.empty_like(x, device="jax")
            dist.scatter(out, [_values(dtype, r).to("jax") for r in range(size)] if rank == 1 else None, src=1)
            _same(out, _values(dtype, rank), "scatter")
            avg = x.to("jax")
            dist.all_reduce(avg, dist.ReduceOp.AVG)
            torch.testing.assert_close(avg.cpu(), sum(_values(dtype, r) for r in range(size)) / size)
    # async work, point to point, a subgroup, the barrier
    t = torch.full((5,), float(rank + 1), device="jax")
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    _same(t, torch.full((5,), float(sum(range(1, size + 1)))), "async all_reduce")
    if rank == 0:
        dist.send(torch.arange(6.0, device="jax"), 1)
    elif rank == 1:
        r = torch.empty(6, device="jax")
        dist.recv(r, 0)
        _same(r, torch.arange(6.0), "send/recv")
    group = dist.new_group([1, 0])
    t = torch.full((2,), float(rank), device="jax")
    dist.all_reduce(t, group=group)
    _same(t, torch.full((2,), float(sum(range(size)))), "subgroup all_reduce")
    from torch_jax.tensor import _storage

    big = torch.ones(1 << 20, device="jax")
    dist.all_reduce(big)
    torch.jax.synchronize()  # (waits for the collective, as for any op)
    assert _storage.box_of(big).arr.is_ready()
    param = nn.Parameter(torch.full((2,), float(rank), device="jax"))  # (written as data, as on the CPU)
    dist.broadcast(param, 1)
    dist.all_reduce(param)
    _same(param.detach(), torch.full((2,), 2.0), "a Parameter")
    dist.barrier()


VOCAB, WIDTH, HEADS, LENGTH = 32, 16, 4, 8


class _Block(nn.Module):
    """A pre-norm transformer block: causal self-attention and an MLP (q, k, v and up are
    the column-wise layers of tensor parallelism's plan, o and down the row-wise ones; the
    heads a rank holds are the columns it has)."""

    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.q, self.v, self.o = (nn.Linear(WIDTH, WIDTH) for _ in range(3))
        # (no bias for k: its gradient is zero but for rounding, since softmax ignores what
        # it adds to each query's scores; Adam's steps would scale that rounding up)
        self.k = nn.Linear(WIDTH, WIDTH, bias=False)
        self.up, self.down = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        b, t, _ = x.shape
        h = self.norm1(x)
        q, k, v = (f(h).view(b, t, -1, WIDTH // HEADS).transpose(1, 2) for f in (self.q, self.k, self.v))
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, -1))
        return x + self.down(nn.functional.gelu(self.up(self.norm2(x))))


TP_PLAN = ("q", "k", "v", "o", "up", "down")


def _tp_plan():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {name: RowwiseParallel() if name in ("o", "down") else ColwiseParallel() for name in TP_PLAN}


def _model():
    """A small transformer language model: embedding, two blocks, norm, head."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(VOCAB, WIDTH), _Block(), _Block(), nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB))


def _loss(logits, targets):
    return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _batch(rank, batch=4):
    g = torch.Generator().manual_seed(7 + rank)
    return torch.randint(0, VOCAB, (batch, LENGTH), generator=g), torch.randint(0, VOCAB, (batch, LENGTH), generator=g)


def _same_losses(losses, want, what):
    """The mean over the ranks of each step's loss (``losses``, on jax) against ``want``, one
    CPU process's losses of the same steps."""
    got = torch.stack(losses)
    dist.all_reduce(got, op=dist.ReduceOp.AVG)
    torch.testing.assert_close(got.cpu(), torch.tensor(want), rtol=1e-5, atol=1e-6, msg=f"{what}'s losses")


def ddp(rank, size):
    """DDP on jax against one process on the CPU training on every rank's batch: the
    losses of each step (the ranks' mean) and the final parameters."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_model().to("jax"), bucket_cap_mb=0.0001)  # (several buckets)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _batch(rank)
    losses = []
    for step in range(3):
        if step == 1:
            with model.no_sync():  # (gradients accumulate locally, then sync with the next step)
                _loss(model(x.to("jax")), y.to("jax")).backward()
        loss = _loss(model(x.to("jax")), y.to("jax"))
        loss.backward()
        losses.append(loss.detach())
        opt.step()
        opt.zero_grad()
    reference, want = _reference(size, 3, accumulated=(1,))
    _same_losses(losses, want, "DDP")
    for p, q in zip(model.module.parameters(), reference.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6)


class _Branches(nn.Module):
    """A trunk and three heads: each rank uses its own head, and no rank uses ``never``."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.trunk, self.heads, self.never = (
            nn.Linear(8, 8),
            nn.ModuleList(nn.Linear(8, 1) for _ in range(2)),
            nn.Linear(8, 1),
        )

    def forward(self, x, head):
        return self.heads[head](torch.tanh(self.trunk(x)))


def ddp_unused(rank, size):
    """DDP with ``find_unused_parameters=True``, then ``static_graph=True`` (NOTE [DDP's
    unused parameters on jax]): each rank uses its own head and no rank ``never``; AdamW
    (whose weight decay moves a parameter only where it has a gradient) against one CPU
    process training on both ranks' losses: a head one rank used gets half its gradient,
    ``never`` keeps ``grad`` None and its values."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    assert size == 2
    batches = [
        (torch.randn(6, 8, generator=g), torch.randn(6, 1, generator=g))
        for g in (torch.Generator().manual_seed(s) for s in (7, 8))
    ]
    for options in ({"find_unused_parameters": True}, {"static_graph": True}):
        model = DDP(_Branches().to("jax"), bucket_cap_mb=0.0001, **options)
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)
        x, y = batches[rank]
        for _ in range(3):
            nn.functional.mse_loss(model(x.to("jax"), rank), y.to("jax")).backward()
            assert model.module.never.weight.grad is None and model.module.heads[rank].weight.grad is not None
            opt.step()
            opt.zero_grad()
        reference = _Branches()
        ropt = torch.optim.AdamW(reference.parameters(), lr=0.1)
        for _ in range(3):
            for r, (bx, by) in enumerate(batches):
                (nn.functional.mse_loss(reference(bx, r), by) / size).backward()
            ropt.step()
            ropt.zero_grad()
        for (name, p), q in zip(model.module.named_parameters(), reference.parameters()):
            torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6, msg=f"{options} {name}")


def _reference(size, steps, accumulated=()):
    """One CPU process training ``_model()`` on every rank's batch (the mean of the ranks'
    losses), a second backward pass accumulated at the steps in ``accumulated`` (DDP's
    ``no_sync``): the model and each step's loss."""
    reference = _model()
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    batches = [_batch(r) for r in range(size)]
    losses = []
    for step in range(steps):
        for _ in range(2 if step in accumulated else 1):
            mean = sum(_loss(reference(bx), by) for bx, by in batches) / size
            mean.backward()
        losses.append(mean.item())
        opt.step()
        opt.zero_grad()
    return reference, losses


def fsdp(rank, size):
    """FSDP2 (fully_shard per layer and the root) on jax against one CPU process; and a
    model made on the meta device, sharded, then ``to_empty(device="jax")``."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("jax", (size,))
    model = _model().to("jax")
    for layer in model:
        if isinstance(layer, _Block):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _batch(rank)
    losses = []
    for _ in range(3):
        loss = _loss(model(x.to("jax")), y.to("jax"))
        loss.backward()
        losses.append(loss.detach())
        opt.step()
        opt.zero_grad()
    reference, want = _reference(size, 3)
    _same_losses(losses, want, "FSDP2")
    for p, q in zip(model.parameters(), reference.parameters()):
        assert p.to_local().device.type == "jax" and p.to_local().shape[0] <= -(-q.shape[0] // size)
        torch.testing.assert_close(p.full_tensor().cpu(), q.detach(), rtol=1e-5, atol=1e-6)

    with torch.device("meta"):
        lazy = _model()
    for layer in lazy:
        if isinstance(layer, _Block):
            fully_shard(layer, mesh=mesh)
    fully_shard(lazy, mesh=mesh)
    lazy.to_empty(device="jax")
    for p in lazy.parameters():
        nn.init.normal_(p.to_local(), std=0.1)  # (each rank its shard)
    _loss(lazy(x.to("jax")), y.to("jax")).backward()
    assert all(p.grad is not None and p.grad.to_local().device.type == "jax" for p in lazy.parameters())


def _sharded_model(mesh, lazy=False):
    """``_model()`` with fully_shard per layer and the root, on jax (made on the meta device
    and left unset, zeros, when ``lazy``)."""
    from torch.distributed.fsdp import fully_shard

    if lazy:
        with torch.device("meta"):
            model = _model()
    else:
        model = _model().to("jax")
    for layer in model:
        if isinstance(layer, _Block):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if lazy:
        model.to_empty(device="jax")
    return model


def _full_params(model):
    return [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu() for p in model.parameters()]


def _adam_step(model, opt, batches, size):
    """One Adam step on the mean of the batches' losses (each batch a rank's, or every rank's
    batch in one process: the mean over them)."""
    for bx, by in batches:
        (_loss(model(bx.to("jax")), by.to("jax")) / size).backward()
    opt.step()
    opt.zero_grad()


def checkpoint(rank, size, directory):
    """torch.distributed.checkpoint of FSDP2's sharded model and Adam's state on jax: saved
    after two steps, loaded into a fresh sharded model (made on the meta device), which then
    takes a third step as the original does. Rank 0 also writes the full parameters after
    the second and the third step for ``checkpoint_reload`` (another world size)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("jax", (size,))
    model = _sharded_model(mesh)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    batch = [_batch(rank)]
    for _ in range(2):
        _adam_step(model, opt, batch, 1)
    saved = _full_params(model)
    msd, osd = get_state_dict(model, opt)
    assert all(v.to_local().device.type == "jax" for v in msd.values())
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=directory)
    _adam_step(model, opt, batch, 1)
    continued = _full_params(model)
    if rank == 0:
        torch.save({"saved": saved, "continued": continued}, os.path.join(directory, "full.pt"))

    fresh = _sharded_model(mesh, lazy=True)
    fopt = torch.optim.Adam(fresh.parameters(), lr=0.01)
    msd, osd = get_state_dict(fresh, fopt)
    assert not any(torch.equal(p, q) for p, q in zip(_full_params(fresh), saved))
    dcp.load({"model": msd, "optim": osd}, checkpoint_id=directory)
    set_state_dict(fresh, fopt, model_state_dict=msd, optim_state_dict=osd)
    for p, q in zip(_full_params(fresh), saved):
        _same(p, q, "loaded parameter")
    _adam_step(fresh, fopt, batch, 1)
    for p, q in zip(_full_params(fresh), continued):
        _same(p, q, "a step after loading")


def checkpoint_reload(rank, size, directory):
    """``checkpoint``'s files (two ranks' shards) loaded by one process into a plain model on
    jax: the parameters saved, and a step on both ranks' batches as the two ranks took it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    assert size == 1
    full = torch.load(os.path.join(directory, "full.pt"))
    model = _model().to("jax")
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    msd, osd = get_state_dict(model, opt)
    assert not any(torch.equal(p, q) for p, q in zip(_full_params(model), full["saved"]))
    dcp.load({"model": msd, "optim": osd}, checkpoint_id=directory)
    set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)
    for p, q in zip(_full_params(model), full["saved"]):
        _same(p, q, "parameter loaded on one process")
    _adam_step(model, opt, [_batch(r) for r in range(2)], 2)
    for p, q in zip(_full_params(model), full["continued"]):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def _tp_block(mesh):
    """A ``_Block`` with tensor parallelism's plan over ``mesh``, and the same block on the CPU.
    (The norms' parameters stay plain tensors beside the others' DTensors: an optimizer
    step that takes them in one foreach kernel fails, on CUDA as here, with PyTorch's
    "mixed torch.Tensor and DTensor" error; the steps of these tests take ``foreach=False``.)"""
    from torch.distributed.tensor.parallel import parallelize_module

    torch.manual_seed(0)
    block, reference = _Block(), _Block()
    reference.load_state_dict(block.state_dict())
    return parallelize_module(block.to("jax"), mesh, _tp_plan()), reference


def _same_as_reference(block, reference):
    """The parallel block's parameters (the planned layers' DTensors, sharded but for the
    row-wise biases; the norms' plain tensors) against the CPU block's."""
    from torch.distributed.tensor import DTensor

    for (name, p), q in zip(block.named_parameters(), reference.parameters()):
        layer = name.split(".")[0]
        assert isinstance(p, DTensor) == (layer in TP_PLAN), name
        if layer in TP_PLAN and name not in ("o.bias", "down.bias"):
            assert p.to_local().numel() < q.numel(), name
        full = p.full_tensor() if isinstance(p, DTensor) else p
        torch.testing.assert_close(full.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6, msg=name)


def tensor_parallel(rank, size, compiled=False):
    """DTensor tensor parallelism on a transformer block (``_Block``, PyTorch's plan:
    q, k, v and up column-wise, o and down row-wise) on a mesh made with
    init_device_mesh("jax"), against one CPU process; ``compiled``: the block under
    torch.compile (its graphs hold the collectives)."""
    from torch.distributed.device_mesh import init_device_mesh

    block, reference = _tp_block(init_device_mesh("jax", (size,)))
    opt = torch.optim.SGD(block.parameters(), lr=0.1, foreach=False)  # (NOTE in _tp_block)
    ropt = torch.optim.SGD(reference.parameters(), lr=0.1)
    x = torch.randn(2, LENGTH, WIDTH, generator=torch.Generator().manual_seed(3))  # (the same batch on every rank)
    run = torch.compile(block, backend="jax") if compiled else block
    losses, want = [], []
    for _ in range(3):
        loss = run(x.to("jax")).pow(2).mean()
        loss.backward()
        losses.append(loss.detach())
        opt.step()
        opt.zero_grad()
        loss = reference(x).pow(2).mean()
        loss.backward()
        want.append(loss.item())
        ropt.step()
        ropt.zero_grad()
    _same_losses(losses, want, "tensor parallelism")
    _same_as_reference(block, reference)


def compiled(rank, size):
    """NOTE [Collectives in compiled graphs]: functional collectives in a compiled function
    give eager's results from one XLA computation a call; a compiled tensor-parallel block
    trains as one CPU process does, its forward and backward each one computation."""
    import warnings

    import torch.distributed._functional_collectives as funcol

    import torch_jax

    group = dist.group.WORLD

    def f(x, w):
        y = funcol.all_reduce(x @ w, "sum", group)
        # (their names before torch 2.13: all_gather_tensor, reduce_scatter_tensor)
        gathered = getattr(funcol, "all_gather_single", funcol.all_gather_tensor)(y, 0, group)
        scatter = getattr(funcol, "reduce_scatter_single", funcol.reduce_scatter_tensor)
        scattered = scatter(gathered * (rank + 1), "sum", 0, group)
        return y.sum() + 1, gathered, scattered, funcol.all_reduce(x, "max", group), funcol.all_reduce(x, "avg", group)

    x = torch.arange(8.0, device="jax").reshape(2, 4) * (rank + 1)
    w = torch.ones(4, 3, device="jax")
    eager = f(x, w)
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch_jax.FallbackWarning)  # (no graph runs op by op)
        got = torch.compile(f, backend="jax")(x, w)
    for a, b in zip(got, eager):
        torch.testing.assert_close(a.cpu(), b.cpu(), rtol=0, atol=0)
    # (one graph on torch 2.13 and 2.14; Dynamo breaks it in three on 2.11): each graph ran
    # once as one computation, none op by op
    stats = {k: v for k, v in torch_jax.stats().items() if "compiled_graph" in k}
    made = stats.get("compiled_graph_compiles", 0) + stats.get("compiled_graph_loads", 0)
    assert stats["compiled_graph_calls"] == made and "compiled_graphs_eager" not in stats, stats
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch_jax.FallbackWarning)
        tensor_parallel(rank, size, compiled=True)
    stats = torch_jax.stats()
    assert stats["compiled_graph_calls"] >= made + 6 and "compiled_graphs_eager" not in stats  # (3 steps)


def two_d(rank, size):
    """A 2-D mesh of 4 processes (2 x 2, "dp" x "tp"): tensor parallelism of a transformer
    block over "tp" and FSDP2 over "dp", as PyTorch's 2-D recipe; each "dp" pair trains on
    its own batch, against one CPU process training on both."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("jax", (2, size // 2), mesh_dim_names=("dp", "tp"))
    block, reference = _tp_block(mesh["tp"])
    fully_shard(block, mesh=mesh["dp"])
    opt = torch.optim.SGD(block.parameters(), lr=0.1)
    ropt = torch.optim.SGD(reference.parameters(), lr=0.1)
    batches = [torch.randn(2, LENGTH, WIDTH, generator=torch.Generator().manual_seed(3 + d)) for d in range(2)]
    mine = batches[mesh.get_local_rank("dp")]
    losses, want = [], []
    for _ in range(3):
        loss = block(mine.to("jax")).pow(2).mean()
        loss.backward()
        losses.append(loss.detach())
        opt.step()
        opt.zero_grad()
        mean = sum(reference(b).pow(2).mean() for b in batches) / 2
        mean.backward()
        want.append(mean.item())
        ropt.step()
        ropt.zero_grad()
    _same_losses(losses, want, "the 2-D mesh")  # (the mean over both pairs: each pair's ranks have the same loss)
    for p, q in zip(block.parameters(), reference.parameters()):
        torch.testing.assert_close(p.full_tensor().cpu(), q.detach(), rtol=1e-5, atol=1e-6)


def pipeline(rank, size):
    """torch.distributed.pipelining: the transformer (``_model()``) cut in two stages, one a rank on jax (the
    activations and their gradients sent between them through the group), GPipe over four
    microbatches, three SGD steps; against one CPU process training the whole model on the
    same microbatches (GPipe's loss is per microbatch, and it divides the gradients by the
    number of microbatches: ``scale_grads``)."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    assert size == 2
    chunks, steps = 4, 3
    halves = [lambda m: m[:2], lambda m: m[2:]]  # (embedding, block | block, norm, head)
    part = halves[rank](_model()).to("jax")
    stage = PipelineStage(part, rank, size, torch.device("jax"))
    schedule = ScheduleGPipe(stage, chunks, loss_fn=_loss)
    opt = torch.optim.SGD(part.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(11)
    batches = [tuple(torch.randint(0, VOCAB, (8, LENGTH), generator=g) for _ in range(2)) for _ in range(steps)]
    losses = []
    for x, y in batches:
        mine = []
        if rank == 0:
            schedule.step(x.to("jax"))
        else:
            schedule.step(target=y.to("jax"), losses=mine)
        opt.step()
        opt.zero_grad()
        losses.append(mine)

    reference = _model()
    ropt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for (x, y), got in zip(batches, losses):
        want = []
        for bx, by in zip(x.chunk(chunks), y.chunk(chunks)):
            loss = _loss(reference(bx), by)
            loss.backward()
            want.append(loss.detach())
        for p in reference.parameters():
            p.grad.div_(chunks)
        ropt.step()
        ropt.zero_grad()
        if rank == size - 1:
            assert len(got) == chunks and all(loss.device.type == "jax" for loss in got)
            torch.testing.assert_close(torch.stack(got).cpu(), torch.stack(want), rtol=1e-5, atol=1e-6)
    for p, q in zip(part.parameters(), halves[rank](reference).parameters()):
        assert p.device.type == "jax"
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6)


def cpu_only(rank, size):
    """A CPU program under torchrun: ``init_process_group()`` without a backend works with the
    jax device installed (gloo for CPU tensors), and JAX never starts."""
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    _same(t, torch.full((3,), float(sum(range(1, size + 1)))), "cpu all_reduce")
    from torch_jax import _registration

    assert not _registration.is_initialized() and "jax" not in sys.modules


_before_group = {}  # what a device-first script made before init_process_group


def _device_first() -> None:
    """The order of PyTorch's DDP tutorial and most scripts (NOTE [Any order under a
    launcher]): the device chosen, a model and a tensor on it, and only then the group."""
    local = int(os.environ["LOCAL_RANK"])
    torch.accelerator.set_device_index(local)
    model = _model().to(torch.accelerator.current_accelerator())  # (jax, the current device: jax:LOCAL_RANK)
    _before_group.update(local=local, model=model, t=torch.full((3,), float(local + 1), device=f"jax:{local}"))


def device_first(rank, size, *args):
    """The device was used before init_process_group: each rank owns jax:LOCAL_RANK, the
    tensor made before the group takes part in its collectives, and DDP of the model moved
    before it (with ``device_ids``, as the tutorial writes it) trains as one CPU process
    on every rank's batch does."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    local, model, t = _before_group["local"], _before_group["model"], _before_group["t"]
    assert torch.accelerator.current_device_index() == local and t.device == torch.device("jax", local)
    assert next(model.parameters()).device == torch.device("jax", local)
    dist.all_reduce(t)
    _same(t, torch.full((3,), float(sum(range(1, size + 1)))), "all_reduce of a tensor made before the group")
    model = DDP(model, device_ids=[local])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _batch(rank)
    device = torch.device("jax", local)
    losses = []
    for _ in range(2):
        loss = _loss(model(x.to(device)), y.to(device))
        loss.backward()
        losses.append(loss.detach())
        opt.step()
        opt.zero_grad()
    reference, want = _reference(size, 2)
    _same_losses(losses, want, "DDP, device first")
    for p, q in zip(model.module.parameters(), reference.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6)


def early(rank, size):
    """Outside a launcher's environment (the ranks given to init_process_group, no RANK
    variable), the device used before init_process_group: the first collective on jax says
    why it cannot run."""
    t = torch.ones(2, device="jax")
    try:
        dist.all_reduce(t)
    except RuntimeError as e:
        assert "before torch.distributed.init_process_group()" in str(e), e
    else:
        raise AssertionError("no error")


def dead_rank(rank, size):
    """Rank 1 dies after a first collective (outside torchrun, which would stop the others
    itself): the others' next collective raises within the group's timeout, saying why."""
    t = torch.ones(3, device="jax")
    dist.all_reduce(t)
    if rank == 1:
        os._exit(3)
    start = time.monotonic()
    try:
        dist.all_reduce(t)
    except RuntimeError as e:
        assert "did not all come within the group's timeout" in str(e), e
        assert time.monotonic() - start < 20, time.monotonic() - start
    else:
        raise AssertionError("no error")
    print(f"{rank} ok dead_rank", flush=True)
    os._exit(0)  # (else JAX's runtime waits at exit for the rank that died, up to the timeout, then aborts)


def raises(rank, size):
    """Rank 1 raises after a collective on jax while rank 0 goes on without collectives:
    rank 1 exits at once (not waiting at exit for JAX's runtime), and torchrun stops rank 0."""
    t = torch.ones(3, device="jax")
    dist.all_reduce(t)
    if rank == 1:
        raise AssertionError("rank 1 fails on purpose")
    time.sleep(200)


def mismatched(rank, size):
    """Ranks that call a collective with different shapes get an error naming both."""
    t = torch.ones(3 + rank, device="jax")
    try:
        dist.all_reduce(t)
    except RuntimeError as e:
        assert "rank 0: allreduce sum float32[3]; rank 1: allreduce sum float32[4]" in str(e), e
    else:
        raise AssertionError("no error")


def main():
    scenario = sys.argv[1]
    if scenario.startswith("device_first"):
        _device_first()
    kwargs = {}
    if scenario == "early":
        # (no launcher's variables: the ranks come as arguments, as mp.spawn scripts pass them)
        kwargs = {"rank": int(os.environ.pop("RANK")), "world_size": int(os.environ.pop("WORLD_SIZE"))}
        kwargs["init_method"] = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        torch.ones(1, device="jax")  # (the device starts here, JAX with it)
    dist.init_process_group(timeout=datetime.timedelta(seconds=15) if scenario == "dead_rank" else None, **kwargs)
    rank, size = dist.get_rank(), dist.get_world_size()
    scenarios = {
        "collectives": collectives,
        "ddp": ddp,
        "ddp_unused": ddp_unused,
        "fsdp": fsdp,
        "tensor_parallel": tensor_parallel,
    }
    scenarios.update(
        cpu_only=cpu_only, early=early, device_first=device_first, dead_rank=dead_rank, mismatched=mismatched
    )
    scenarios.update(checkpoint=checkpoint, checkpoint_reload=checkpoint_reload, pipeline=pipeline, compiled=compiled)
    scenarios.update(two_d=two_d, raises=raises)
    for name in scenario.split(","):  # (several a launch: one start of torchrun, torch and JAX)
        scenarios[name](rank, size, *sys.argv[2:])
        print(f"{rank} ok {name}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.pop("XLA_FLAGS", None)
    main()
