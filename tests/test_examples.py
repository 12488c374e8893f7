"""The README's example command runs end to end and the loss falls."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import torch

import torch_jax

ROOT = Path(__file__).resolve().parents[1]


def test_readme_example_command_trains():
    readme = (ROOT / "README.md").read_text()
    assert "python examples/train_mlp.py" in readme
    stdout = _run_and_compiled("train_mlp.py", "--steps", "60")
    losses = _losses(stdout)
    assert len(losses) >= 3 and losses[-1] < 0.5 * losses[0], stdout


def _run(script, *args):
    env = dict(os.environ, TORCH_JAX_FALLBACK="error")
    out = subprocess.run(
        [sys.executable, f"examples/{script}", *args], cwd=ROOT, capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "device jax" in out.stdout
    return out.stdout


def _losses(stdout):
    return [float(v) for v in re.findall(r"loss (\d+\.\d+)", stdout)]


def _run_and_compiled(script, *args):
    """The example's output; in strict mode it also runs with ``--compile`` (torch.compile
    with its default backend, routed to the jax backend), which must give the same losses
    and the same generated text (CI's fused run leaves torch.compile to the strict run)."""
    eager = _run(script, *args)
    if torch_jax.config.mode == "strict":
        compiled = _run(script, *args, "--compile")
        torch.testing.assert_close(torch.tensor(_losses(compiled)), torch.tensor(_losses(eager)), rtol=2e-3, atol=1e-4)
        for marker in ("greedy :", "continues 5 6 7 8 with:"):
            assert [line for line in compiled.splitlines() if marker in line] == [
                line for line in eager.splitlines() if marker in line
            ]
    return eager


def test_train_cnn_example():
    losses = _losses(_run_and_compiled("train_cnn.py", "--steps", "50", "--amp"))
    assert len(losses) >= 3 and losses[-1] < 0.5 * losses[0]


def test_finetune_transformer_example():
    stdout = _run_and_compiled("finetune_transformer.py", "--steps", "40")
    losses = _losses(stdout)
    assert len(losses) >= 3 and losses[-1] < 0.5 * losses[0], stdout
    assert "reloaded model continues 5 6 7 8 with:" in stdout


def test_generate_text_example():
    stdout = _run_and_compiled("generate_text.py", "--steps", "30", "--new-tokens", "8")
    losses = _losses(stdout)
    assert losses[-1] < losses[0], stdout
    assert stdout.count("greedy :") == 2 and "sampled:" in stdout


def test_train_fsdp_example_under_torchrun_matches_the_cpu():
    """The README's FSDP2 command (fewer steps), on jax and with --device cpu (gloo)."""
    readme = (ROOT / "README.md").read_text()
    assert "torchrun --standalone --nproc-per-node=2 examples/train_fsdp.py" in readme
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # (one process a device)
    losses = {}
    for device in ("jax", "cpu"):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
        cmd += ["examples/train_fsdp.py", "--steps", "20", "--device", device]
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
        assert f"rank 0's shard on {device}" in out.stdout, out.stdout
        losses[device] = _losses(out.stdout)
    assert len(losses["jax"]) == 3 and losses["jax"][-1] < 0.5 * losses["jax"][0], losses
    torch.testing.assert_close(torch.tensor(losses["jax"]), torch.tensor(losses["cpu"]), rtol=1e-3, atol=1e-4)
