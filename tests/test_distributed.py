"""torch.distributed on jax (NOTE [The jax process group]): two processes under torchrun on
localhost, each checking its results against gloo's on the same CPU tensors, or against one
process training on the CPU (tests/_dist_worker.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_dist_worker.py")


def _skip_without_devices(nproc: int) -> None:
    """On the CPU each process gets a device of its own (NOTE [The jax process group]); on
    a GPU each needs one, as with NCCL."""
    import jax

    if jax.default_backend() != "cpu" and jax.local_device_count() < nproc:
        pytest.skip(
            f"{nproc} processes need {nproc} {jax.default_backend()} devices; JAX sees {jax.local_device_count()}"
        )


def _torchrun(scenario: str, nproc: int = 2, *args: str):
    _skip_without_devices(nproc)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # (the backend sets each process's own)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", WORKER, scenario]
    cmd += args
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-6000:]
    for name in scenario.split(","):
        for rank in range(nproc):
            assert f"{rank} ok {name}" in out.stdout, text[-6000:]


@pytest.mark.parametrize(
    "scenarios",
    # (several a launch, where a fresh process is not the point: each launch starts torchrun,
    # two processes, torch and JAX, seconds of CI's time)
    # (device_first: the usual order, the device chosen and used before init_process_group;
    # the scenarios after it in the launch run on jax:LOCAL_RANK)
    [
        "device_first,collectives,mismatched,ddp,ddp_unused",
        "fsdp,tensor_parallel,pipeline",
        "compiled",
        "cpu_only",
        "early",
    ],
)
def test_two_processes(scenarios):
    _torchrun(scenarios)


def test_four_processes_on_a_2d_mesh():
    _torchrun("two_d", 4)


def test_checkpoint_saved_by_two_processes_loads_on_two_and_on_one(tmp_path):
    """DCP: two ranks save FSDP2's shards and Adam's state and load them back; then one
    process loads the same files into a plain model (another world size)."""
    _torchrun("checkpoint", 2, str(tmp_path))
    # (and the device first in a one-process job: no JAX runtime to start, as before)
    _torchrun("device_first,checkpoint_reload", 1, str(tmp_path))


def test_a_rank_that_raises_ends_the_run_at_once():
    """Under torchrun: the failing rank exits with its traceback and torchrun stops the
    other (which takes SIGTERM: JAX's preemption service, which would keep it, is off)."""
    _skip_without_devices(2)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", WORKER, "raises"]
    start = time.monotonic()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "rank 1 fails on purpose" in text, text[-6000:]
    assert time.monotonic() - start < 100, text[-6000:]  # (rank 0 would sleep 200 s)


def _by_hand(scenario: str):
    """Two processes started with torchrun's variables but not by torchrun (as mp.spawn
    scripts and other launchers do): rank 0 hosts the store. Their exit codes and outputs."""
    _skip_without_devices(2)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, scenario],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    return procs, outs


def test_the_device_first_with_the_variables_of_a_launcher_but_no_torchrun():
    """NOTE [Any order under a launcher]: rank 0's store, made when its device starts,
    serves init_process_group's store after it."""
    procs, outs = _by_hand("device_first")
    for r in range(2):
        assert procs[r].returncode == 0 and f"{r} ok device_first" in outs[r], outs[r][-6000:]


def test_a_rank_that_dies_gives_the_others_an_error_within_the_timeout():
    """Started by hand, not by torchrun (whose agent would stop the other rank itself)."""
    procs, outs = _by_hand("dead_rank")
    assert procs[1].returncode == 3, outs[1][-3000:]
    assert procs[0].returncode == 0 and "0 ok dead_rank" in outs[0], outs[0][-6000:]
