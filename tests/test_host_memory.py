"""NOTE [Host memory of the CPU device]: on the CPU platform, freed device buffers stay in
the process and the next buffer of their size reuses them without page faults."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from torch_jax.device import _host_memory

# a 96 MiB buffer, over what glibc serves from a thread's heap or below its mmap
# threshold, made and freed ten times; the page faults of the cheapest later run
PROBE = """
import os, resource
if os.environ.get("PROBE_JAX_FIRST"):  # the program starts JAX itself before the device
    import jax.numpy as jnp
    jnp.ones(3).block_until_ready()
import torch, torch_jax
from torch_jax.device import _host_memory
faults = []
for _ in range(10):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    y = torch.full((4096, 6144), 1.5, device="jax")
    torch.jax.synchronize()
    del y
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(_host_memory.applied, min(faults[2:]))
"""


PAGES = 4096 * 6144 * 4 // 4096  # (the buffer's)


def _probe(**env):
    """Whether the settings applied, the cheapest later run's faults, and the debug log."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", **env)
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, check=True)
    log = [line for line in out.stdout.splitlines() if line.startswith("[torch_jax]")]
    applied, faults = next(line for line in out.stdout.splitlines() if line not in log).split()
    return applied == "True", int(faults), log


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings (Linux)")
def test_freed_buffers_are_reused_without_page_faults():
    applied, faults, _ = _probe()
    assert applied
    system_applied, system_faults, _ = _probe(TORCH_JAX_HOST_MEMORY="system")
    assert not system_applied
    assert system_faults > PAGES // 2  # glibc maps each new buffer afresh
    assert faults < PAGES // 100


def test_the_platform_is_told_before_jax_starts(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert _host_memory.platform() == "cpu"
    monkeypatch.setenv("JAX_PLATFORMS", "cuda,cpu")
    assert _host_memory.platform() == "other"
    monkeypatch.setenv("JAX_PLATFORMS", "tpu")
    assert _host_memory.platform() == "other"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings (Linux)")
def test_after_jax_started_the_main_threads_buffers_are_still_reused():
    # XLA's worker threads then have arenas of their own (a large block there is mmapped
    # afresh each time, and the debug log says so); the main thread's buffers, made by
    # computations XLA runs inline, are still reused
    applied, faults, log = _probe(PROBE_JAX_FIRST="1", TORCH_JAX_DEBUG="1")
    assert any("JAX started before the jax device" in line for line in log)
    assert applied
    assert faults < PAGES // 100
