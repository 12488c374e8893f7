"""Ray Train on jax (NOTE [Ray Train on jax] in device/_ray.py): ``TorchTrainer`` with two
jax workers, as Ray's docs show it for a GPU plus ``TorchConfig(backend="jax")``, trains to
the parameters of one CPU process on the whole batch. One Ray start and one worker group
for the file (tests/_ray_driver.py, in a process of its own): Ray's start and its workers'
imports take most of the time."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
import torch

pytest.importorskip("ray.train", reason="Ray Train is not installed (pip install 'ray[train]'; the test extra has it)")

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_ray_driver.py")

import _ray_driver  # noqa: E402


def _processes_of(marker: str) -> list[int]:
    """The processes whose environment holds ``marker`` (each Ray process inherits the
    driver's environment; Ray renames its workers, so their command lines do not tell)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker.encode() in f.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:  # (gone, or another user's)
            continue
    return found


def _run_driver(out: str, temp: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # (the backend sets each process's own)
    env.update(
        # (Ray binds the machine's network address, even with _node_ip_address="127.0.0.1",
        # which it resolves to that address; with Ray's switch for clusters off, every Ray
        # process, and MASTER_ADDR, is on the loopback)
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        RAY_USAGE_STATS_ENABLED="0",
        # (Ray's token authentication, on by default, with a token of this run: otherwise
        # Ray writes one to ~/.ray/auth_token)
        RAY_AUTH_TOKEN=secrets.token_hex(32),
        TORCH_JAX_RAY_TEMP=temp,
    )
    marker = f"TORCH_JAX_RAY_TEMP={temp}"
    proc = subprocess.Popen(
        [sys.executable, DRIVER, out], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        text, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # (the driver's ray.shutdown() stops Ray's processes)
        try:
            text, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            text, _ = proc.communicate()
        for pid in _processes_of(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        pytest.fail(f"Ray Train did not finish in 240 s:\n{text[-6000:]}")
    # (ray.shutdown() returns once its processes are told to stop; give them a moment)
    deadline = time.monotonic() + 20
    while (left := _processes_of(marker)) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 0 and "ray driver ok" in text, text[-6000:]
    assert not left, f"Ray's processes {left} were still running 20 s after ray.shutdown()"
    return text


def _cpu_reference() -> dict:
    """One CPU process, each step on both workers' batches at once (DDP averages the two
    workers' gradients of their mean losses: the gradient of the mean over both)."""
    model, x, y = _ray_driver.make_model_and_data()
    optimizer = _ray_driver.make_optimizer(model)
    both = 2 * _ray_driver.BATCH  # (DistributedSampler without shuffling: step k's 2B rows)
    for k in range(_ray_driver.STEPS):
        xb, yb = x[k * both : (k + 1) * both], y[k * both : (k + 1) * both]
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.state_dict()


def test_two_jax_workers_train_as_one_cpu_process():
    import jax

    if jax.default_backend() != "cpu" and jax.local_device_count() < 2:
        pytest.skip(f"two workers need two {jax.default_backend()} devices; JAX sees {jax.local_device_count()}")
    out = tempfile.mkdtemp(prefix="tjray-out")
    temp = tempfile.mkdtemp(prefix="tjray", dir="/tmp")  # (Ray's sockets live here: a short path)
    try:
        _run_driver(out, temp)
        with open(os.path.join(out, "driver.json")) as f:
            assert json.load(f)["manager"] == "CPUTorchDeviceManager"  # (outside a jax group, Ray's own)
        want = _cpu_reference()
        start = _ray_driver.make_model_and_data()[0].state_dict()
        for rank in range(2):
            with open(os.path.join(out, f"rank{rank}.json")) as f:
                seen = json.load(f)
            device = f"jax:{seen['local_rank']}"
            assert seen["device"] == device, seen  # ray.train.torch.get_device()
            assert seen["current"] == device, seen  # .to("jax") in the training function
            assert seen["config"] == "jax:0", seen  # (as a cuda:0 tensor in the config would be)
            assert seen["parameters"] == [device] and seen["model"] == "DistributedDataParallel", seen  # prepare_model
            assert seen["batches"] == [device], seen  # prepare_data_loader
            assert seen["backend"] == "jax" and seen["accelerate"] == device, seen
            assert seen["master_addr"] == "127.0.0.1" and seen["node_ip"] == "127.0.0.1", seen
            got = torch.load(os.path.join(out, f"rank{rank}.pt"))
            assert got.keys() == want.keys()
            for name, value in want.items():
                assert not torch.allclose(start[name], value, atol=1e-3), name  # (training moved it)
                torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6, msg=f"rank {rank}: {name}")
    finally:
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(temp, ignore_errors=True)
