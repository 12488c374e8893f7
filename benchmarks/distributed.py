"""The ``jax`` process group (NOTE [The jax process group] in distributed/_backend) against
PyTorch's gloo, side by side in one two-process run on this host: all-reduce (sum, float32)
over message sizes, gloo on CPU tensors against ours on jax tensors, with and without the
fingerprint check before each jax collective (NOTE [Mismatched collectives]; the check is
turned off for its column by setting ``_backend._CHECK``, as ``TORCH_JAX_DIST_CHECK=0``
does at import); and a training step (forward, backward, optimizer step) of a small MLP
under DDP and under FSDP2 (``fully_shard`` per block and the root), on jax (strict eager,
strict without the check, and fused eager) against the same on the CPU with gloo, beside
the bare model's step without collectives (what the step costs without the distributed part).

    python -m benchmarks.distributed [--quick] [--repeats 7] [--out DIR | --no-write]

This process launches itself under ``python -m torch.distributed.run --standalone
--nproc-per-node=2`` (``XLA_FLAGS`` is taken out of the workers' environment, so that each
gets the JAX CPU devices the backend gives it, one per local process, and uses its local
rank's, as a GPU program would). Rank 0 gathers every rank's times and writes them to a
file this process reads, which then prints the table and writes ``distributed.md`` and
``distributed.json`` to ``--out`` (``docs/benchmarks`` by default). A time is the median
of repeats after a warm-up; each repeat starts after a barrier, waits for its tensors'
values at its end (the all-reduced tensor; the loss and the updated parameters), and
counts as its slowest rank's time (a collective ends when its last rank does). The
variants are timed in rounds, one repeat of each a round, so that a slow spell of a
shared machine falls on all of them alike. Ratios are ours / gloo's: below 1 is faster.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks import machine, write_report

KIB = 1024
SIZES = [4 * KIB, 64 * KIB, 1024 * KIB, 16384 * KIB]
QUICK_SIZES = [4 * KIB, 256 * KIB]
ALLREDUCE = {
    "gloo": "gloo group, CPU tensors",
    "default_cpu": "default group, CPU tensors",
    "jax": "default group, jax tensors",
    "jax_nocheck": "jax tensors, check off",
}
KINDS = {"local": "no wrapper, no collectives", "ddp": "DDP", "fsdp": "FSDP2"}
FLAVOURS = {"cpu": "CPU (gloo)", "jax": "jax strict", "jax_nocheck": "jax strict, check off", "jax_fused": "jax fused"}
TRAINING = [f"{k}_{f}" for k in KINDS for f in FLAVOURS if not (k == "local" and f == "jax_nocheck")]
WIDTH, BLOCKS, BATCH = 512, 4, 128  # the MLP: BLOCKS x (Linear(WIDTH, WIDTH), GELU), then Linear(WIDTH, 16)


# ------------------------------------------------------------------ in each worker


def _wait(tensors) -> None:
    """Wait until ``tensors`` (jax ones; CPU ones are ready) hold their values: the
    device's queue and the tensors' own arrays (before a fix, ``torch.jax.synchronize()``
    returned before a collective had ended: a 16 MiB all-reduce "took" 0.4 ms)."""
    jax_tensors = [t for t in tensors if t.device.type == "jax"]
    if not jax_tensors:
        return
    import jax
    import torch

    from torch_jax.tensor import _storage

    torch.jax.synchronize()
    jax.block_until_ready([_storage.array(_storage.box_of(t)) for t in jax_tensors])


def _slowest(times: list[float]) -> list[float]:
    """Each repeat's time on its slowest rank (a MAX all-reduce of the ranks' times, via gloo)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, dist.ReduceOp.MAX)
    return t.tolist()


def _allreduce_repeat(t, group, n: int) -> float:
    """Seconds per all-reduce of ``t``, over ``n`` of them after a barrier."""
    import torch.distributed as dist

    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(n):
        dist.all_reduce(t, group=group)
        _wait([t])
    return (time.perf_counter() - t0) / n


def allreduce(sizes: list[int], repeats: int, gloo, emit) -> dict:
    """Seconds per all-reduce (sum, float32) of each size: PyTorch's gloo group on CPU
    tensors; the default group (ours) on CPU tensors, which it hands to the gloo group it
    holds; ours on jax tensors, with the fingerprint check and without."""
    import torch

    from torch_jax.distributed import _backend

    check_at_start = _backend._CHECK
    results = {}
    for nbytes in sizes:
        numel = nbytes // 4
        inner = max(2, min(100, (2 * 2**20) // nbytes))  # (all-reduces a repeat: ~2 MiB moved, at least 2)
        tensors = {
            "gloo": torch.zeros(numel),
            "default_cpu": torch.zeros(numel),
            "jax": torch.zeros(numel).to("jax"),
            "jax_nocheck": torch.zeros(numel).to("jax"),
        }
        # (zeros stay zeros: no overflow to inf however many sums)

        def repeat(variant: str, n: int, tensors=tensors) -> float:
            _backend._CHECK = variant != "jax_nocheck" and check_at_start
            return _allreduce_repeat(tensors[variant], gloo if variant == "gloo" else None, n)

        times = {v: [] for v in tensors}
        try:
            for v in tensors:
                repeat(v, inner)  # (warm-up: JAX compiles the collective for this shape)
            for _ in range(repeats):
                for v in tensors:
                    times[v].append(repeat(v, inner))
        finally:
            _backend._CHECK = check_at_start
        row = {"bytes": nbytes, "inner": inner}
        for v, ts in times.items():
            ts = _slowest(ts)
            s = statistics.median(ts)
            row[v] = {"seconds": s, "repeats": [round(x, 9) for x in ts], "algbw_gbps": nbytes / s / 1e9}
        for v in ("default_cpu", "jax", "jax_nocheck"):
            row[v]["ratio"] = row[v]["seconds"] / row["gloo"]["seconds"]
        if not check_at_start:
            row["jax"]["note"] = "TORCH_JAX_DIST_CHECK=0 in the environment: the check was off in both columns"
        results[_size_name(nbytes)] = row
        emit(f"all-reduce {_size_name(nbytes):>7s}: " + "  ".join(f"{v} {_fmt(row[v]['seconds'])}" for v in times))
    return results


def _mlp():
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU()) for _ in range(BLOCKS)]
    return nn.Sequential(*blocks, nn.Linear(WIDTH, 16))


class _Trainer:
    """One variant's model, optimizer and batch; ``step`` runs one timed training step. A
    variant is ``KIND_DEVICE[_FLAVOUR]``: ``nocheck`` turns the fingerprint check off for
    its steps, ``fused`` runs them in fused eager mode (``torch_jax.set_mode``)."""

    def __init__(self, variant: str, rank: int, size: int, gloo):
        import torch
        import torch.nn as nn

        kind, self.device, *flavour = variant.split("_")
        self.mode = "fused" if flavour == ["fused"] else "strict"
        self.check = flavour != ["nocheck"]
        with self._setting():
            model = _mlp().to(self.device)
            cpu = self.device == "cpu"
            if kind == "ddp":  # (on the CPU through PyTorch's gloo group; on jax the default group)
                from torch.nn.parallel import DistributedDataParallel as DDP

                model = DDP(model, process_group=gloo if cpu else None)
            elif kind == "fsdp":
                from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
                from torch.distributed.fsdp import fully_shard

                mesh = DeviceMesh.from_group(gloo, "cpu") if cpu else init_device_mesh("jax", (size,))
                for block in model:
                    fully_shard(block, mesh=mesh)
                fully_shard(model, mesh=mesh)
            self.model = model
            self.opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            g = torch.Generator().manual_seed(7 + rank)
            self.x = torch.randn(BATCH, WIDTH, generator=g).to(self.device)
            self.y = torch.randn(BATCH, 16, generator=g).to(self.device)
            # (what a step ends with: every parameter's (local shard's) update)
            self.params = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
        self.loss_fn, self.loss = nn.functional.mse_loss, None

    @contextlib.contextmanager
    def _setting(self):
        import torch_jax
        from torch_jax.distributed import _backend

        mode, check = torch_jax.config.mode, _backend._CHECK
        torch_jax.set_mode(self.mode)
        _backend._CHECK = check and self.check
        try:
            yield
        finally:
            torch_jax.set_mode(mode)
            _backend._CHECK = check

    def step(self) -> float:
        import torch.distributed as dist

        import torch_jax

        with self._setting():
            dist.barrier()
            t0 = time.perf_counter()
            loss = self.loss_fn(self.model(self.x), self.y)
            loss.backward()
            self.opt.step()
            self.opt.zero_grad()
            if self.mode == "fused":
                torch_jax.mark_step()
            _wait([loss.detach(), *self.params])
            seconds = time.perf_counter() - t0
        self.loss = loss
        return seconds


def training(variants: list[str], warmup: int, rounds: int, steps: int, gloo, emit) -> dict:
    """Seconds per training step of each variant: built and warmed up in turn, then timed
    in rounds of ``steps`` steps each; rank 0's last loss beside."""
    import torch.distributed as dist

    rank, size = dist.get_rank(), dist.get_world_size()
    built, results = {}, {}
    for v in variants:
        t0 = time.perf_counter()
        try:
            built[v] = _Trainer(v, rank, size, gloo)
            for _ in range(warmup):
                built[v].step()
        except Exception as e:  # (reported; but a rank that fails alone leaves the other waiting)
            results[v] = {"error": f"{type(e).__name__}: {e}"[:300]}
            built.pop(v, None)
            emit(f"{v}: {results[v]['error']}")
            continue
        results[v] = {"warmup_seconds": time.perf_counter() - t0}
        emit(f"{v}: built and warmed up ({warmup} steps) in {results[v]['warmup_seconds']:.1f} s")
    times = {v: [] for v in built}
    for _ in range(rounds):
        for v, trainer in built.items():
            times[v] += [trainer.step() for _ in range(steps)]
    for v, ts in times.items():
        ts = _slowest(ts)
        results[v].update(
            seconds=statistics.median(ts), steps=[round(x, 6) for x in ts], last_loss=built[v].loss.item()
        )
    for v in variants:
        base = results.get(v.split("_")[0] + "_cpu", {})
        if "seconds" in results[v] and "seconds" in base and not v.endswith("_cpu"):
            results[v]["ratio"] = results[v]["seconds"] / base["seconds"]
        if "seconds" in results[v]:
            emit(f"{v}: {_fmt(results[v]['seconds'])} a step, last loss {results[v]['last_loss']:.6f}")
    return results


def worker(result_path: str, quick: bool, repeats: int) -> None:
    """One rank of the benchmark, under torchrun; rank 0 writes the results (after each part)."""
    import jax
    import torch
    import torch.distributed as dist

    import torch_jax

    # (a bound on every wait: a rank that fails leaves the others waiting at their next collective)
    dist.init_process_group(timeout=datetime.timedelta(seconds=300))
    with open(f"{result_path}.{dist.get_rank()}.pid", "w") as f:
        f.write(str(os.getpid()))  # (for launch() to stop this process with)
    rank, size = dist.get_rank(), dist.get_world_size()
    # (as a GPU program picks cuda:LOCAL_RANK: each process has a JAX CPU device per local rank)
    torch.accelerator.set_device_index(int(os.environ.get("LOCAL_RANK", "0")))
    torch.ones(1, device="jax")  # (the device starts here, JAX's distributed runtime with it)
    devices = [None] * size
    dist.all_gather_object(devices, str(torch.jax.current_device()))

    def emit(line: str) -> None:
        if rank == 0:
            print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)

    from torch_jax.distributed import _backend

    report = {
        "meta": {
            **machine(),
            "world_size": size,
            "torch_threads": torch.get_num_threads(),
            "jax_devices": [str(d) for d in jax.devices()],
            "rank_devices": [f"jax:{d}" for d in devices],
            "mode": torch_jax.config.mode,
            "check_at_start": _backend._CHECK,
            "default_backend": dist.get_backend_config(),
            "quick": quick,
            "repeats": repeats,
            "model": f"MLP: {BLOCKS} x (Linear({WIDTH}, {WIDTH}), GELU), Linear({WIDTH}, 16); batch {BATCH} a rank; "
            "MSE loss; AdamW",
        },
    }

    def save() -> None:
        if rank == 0:
            with open(result_path, "w") as f:
                json.dump(report, f, indent=1)

    save()
    emit(f"{size} ranks on {report['meta']['rank_devices']}, default group {report['meta']['default_backend']}")
    gloo = dist.new_group(backend="gloo")  # (PyTorch's own, for the CPU baselines)
    report["allreduce"] = allreduce(QUICK_SIZES if quick else SIZES, repeats, gloo, emit)
    save()
    # (as many warm-up steps for every variant, so that their last losses compare; fused mode
    # compiles its graphs over the first 3)
    warmup, rounds, steps = (2, 2, 3) if quick else (4, max(repeats, 1), 4)
    variants = [v for v in TRAINING if not quick or v.endswith(("_cpu", "_jax"))]  # (--quick: strict only)
    report["meta"]["training_steps"] = {"warmup": warmup, "rounds": rounds, "steps_a_round": steps}
    report["training"] = training(variants, warmup, rounds, steps, gloo, emit)
    save()
    dist.barrier()
    dist.destroy_process_group()


# ------------------------------------------------------------------ the report


def _size_name(nbytes: int) -> str:
    return f"{nbytes // 2**20} MiB" if nbytes >= 2**20 else f"{nbytes // KIB} KiB"


def _fmt(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    return f"{seconds * 1e3:.2f} ms"


def _bw(gbps: float) -> str:
    return f"{gbps * 1e3:.0f} MB/s" if gbps < 1 else f"{gbps:.2f} GB/s"


def _cell(r: dict) -> str:
    if "error" in r:
        return f"error: {r['error']}"
    return _fmt(r["seconds"]) if "seconds" in r else "-"


def markdown(report: dict) -> str:
    meta = report["meta"]
    lines = [
        "# torch.distributed: the jax process group against gloo",
        "",
        f"Generated by `python -m benchmarks.distributed{' --quick' if meta.get('quick') else ''}` ({meta['date']}, "
        f"torch {meta['torch']}, jax {meta['jax']}, torch_jax {meta['torch_jax']}, {meta['cpus']} CPU cores "
        f"({meta['cpu_model']}); {meta.get('wall_seconds', 0):.0f} s in all). {meta['world_size']} processes on "
        f"this host under torchrun, {meta['torch_threads']} PyTorch thread(s) each; each has a JAX CPU device per "
        f"local process and uses its local rank's (the ranks on {', '.join(meta['rank_devices'])}; JAX's devices "
        f"{', '.join(meta['jax_devices'])}; XLA's CPU collectives through gloo). The default group "
        f"(`init_process_group()` without a backend) is `{meta['default_backend']}`: ours, which hands CPU "
        "tensors to a gloo group it holds; the baselines use PyTorch's own gloo group "
        f'(`new_group(backend="gloo")`). jax runs in {meta["mode"]} eager mode. A time is a median after a '
        "warm-up; each repeat starts after a barrier, waits for the device at its end and counts as its slowest "
        "rank's time. Ratios are against the gloo baseline: below 1 is faster. Other jobs may have shared the "
        "machine: small times are noisy (each JSON entry keeps every repeat).",
        "",
    ]
    if report.get("error"):
        lines += [f"**The run did not finish:** {report['error']}", ""]
    ar = report.get("allreduce")
    if ar:
        head = ["size"]
        for v, label in ALLREDUCE.items():
            head += [label] + (["ratio"] if v != "gloo" else [])
        lines += [
            f"## All-reduce (sum, float32), median of {meta['repeats']} repeats",
            "",
            "Time per all-reduce (each waits for the device; a repeat runs as many as move about 2 MiB, at least "
            "2) and algorithm bandwidth (bytes / time). 'check off' is ours without the fingerprint comparison "
            "through gloo before each jax collective (NOTE [Mismatched collectives]; as `TORCH_JAX_DIST_CHECK=0`).",
            "",
            "| " + " | ".join(head) + " |",
            "|" + " --- |" * len(head),
        ]
        for name, row in ar.items():
            cells = [name]
            for v in ALLREDUCE:
                r = row[v]
                cells.append(f"{_fmt(r['seconds'])} ({_bw(r['algbw_gbps'])})")
                if "ratio" in r:
                    cells.append(f"{r['ratio']:.2f}x")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    tr = report.get("training")
    if tr:
        steps = meta.get("training_steps", {})
        lines += [
            "## Training step",
            "",
            f"{meta['model']}; forward, backward, optimizer step and zero_grad, waiting for the device at the end. "
            f"Median of {steps.get('rounds', '?')} x {steps.get('steps_a_round', '?')} timed steps after "
            f"{steps.get('warmup', '?')} warm-up steps. DDP with default settings; FSDP2 is `fully_shard` per block "
            'and the root, on `init_device_mesh("jax", (2,))` for jax and on the gloo group '
            '(`DeviceMesh.from_group(gloo, "cpu")`) for the CPU. "No wrapper" is the bare model on each rank, '
            "no collectives: the steps' time without the distributed part. 'check off' is jax strict without the "
            "fingerprint check (its warm-up is short: the strict variant compiled the ops); jax fused runs the "
            'step in fused eager mode (`torch_jax.set_mode("fused")`, '
            "`torch_jax.mark_step()` at the step's end) in the same processes.",
            "",
            "Last loss: rank 0's after the last timed step (DDP and FSDP2 train alike on the same batches, so "
            "theirs should agree across the columns; the bare model trains on rank 0's batch alone).",
            "",
            "| step | "
            + " | ".join(f"{label} | ratio" if f != "cpu" else label for f, label in FLAVOURS.items())
            + " | warm-up (build and first steps; same columns) | last loss (same columns) |",
            "|" + " --- |" * (2 * len(FLAVOURS) + 2),
        ]
        for kind, label in KINDS.items():
            cells, warm, loss = [label], [], []
            for f in FLAVOURS:
                r = tr.get(f"{kind}_{f}", {})
                cells.append(_cell(r))
                if f != "cpu":
                    cells.append(f"{r['ratio']:.2f}x" if "ratio" in r else "-")
                warm.append(f"{r['warmup_seconds']:.1f} s" if "warmup_seconds" in r else "-")
                loss.append(f"{r['last_loss']:.5f}" if "last_loss" in r else "-")
            lines.append("| " + " | ".join(cells) + " | " + ", ".join(warm) + " | " + ", ".join(loss) + " |")
        lines.append("")
    return "\n".join(lines)


def _stop(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def launch(quick: bool, repeats: int, timeout: float) -> dict:
    """Run the workers under torchrun; what rank 0 wrote (with "error" where they failed)."""
    fd, path = tempfile.mkstemp(prefix="torch_jax_dist_bench_", suffix=".json")
    os.close(fd)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # (the backend sets the device count)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    cmd += ["-m", "benchmarks.distributed", "--worker", path, "--repeats", str(repeats)]
    cmd += ["--quick"] if quick else []
    error = None
    proc = subprocess.Popen(cmd, env=env)
    try:
        rc = proc.wait(timeout=timeout)
        if rc != 0:
            error = f"torchrun exited with {rc} (the workers' output is above)"
    except subprocess.TimeoutExpired:
        # (the workers first, by the ids they wrote: once JAX's distributed runtime runs, its
        # preemption service catches SIGTERM, so torchrun's SIGTERM would not stop them)
        for rank in range(2):
            try:
                with open(f"{path}.{rank}.pid") as f:
                    _stop(int(f.read()), signal.SIGKILL)
            except (OSError, ValueError):
                pass
        _stop(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            _stop(proc.pid, signal.SIGKILL)
            proc.wait()
        error = f"ran past {timeout:.0f} s and was stopped"
    try:
        with open(path) as f:
            report = json.load(f)
    except (OSError, ValueError):
        report = {"meta": None}
    finally:
        for p in (path, f"{path}.0.pid", f"{path}.1.pid"):
            if os.path.exists(p):
                os.unlink(p)
    if error:
        report["error"] = error
    return report


def main(argv=None) -> dict | None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.distributed", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="two message sizes; fewer steps, CPU and jax strict only (a smoke run)"
    )
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats (default 7, 3 with --quick)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before the workers are stopped")
    parser.add_argument("--out", default="docs/benchmarks")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--worker", metavar="RESULT_PATH", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    repeats = args.repeats or (3 if args.quick else 7)
    if args.worker:
        worker(args.worker, args.quick, repeats)
        return None
    started = time.perf_counter()
    report = launch(args.quick, repeats, args.timeout)
    if not report.get("meta"):
        print(f"no results: {report.get('error', 'rank 0 wrote nothing')}", file=sys.stderr)
        sys.exit(1)
    report["meta"]["wall_seconds"] = time.perf_counter() - started
    text = markdown(report)
    print()
    print(text)
    if not args.no_write:
        write_report(args.out, "distributed", report, text)
    if report.get("error"):
        sys.exit(1)
    return report


if __name__ == "__main__":
    main()
