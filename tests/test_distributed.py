"""torch.distributed on jax (NOTE [The jax process group]): two processes under torchrun on
localhost, each checking its results against gloo's on the same CPU tensors, or against one
process training on the CPU (tests/_dist_worker.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_dist_worker.py")


def _torchrun(scenario: str, nproc: int = 2):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # (one JAX CPU device a process)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", WORKER, scenario]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-6000:]
    for rank in range(nproc):
        assert f"{rank} ok {scenario}" in out.stdout, text[-6000:]


@pytest.mark.parametrize("scenario", ["collectives", "ddp", "fsdp", "tensor_parallel", "cpu_only", "early"])
def test_two_processes(scenario):
    _torchrun(scenario)
