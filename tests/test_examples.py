"""The README's example command runs end to end and the loss falls."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_example_command_trains():
    readme = (ROOT / "README.md").read_text()
    assert "python examples/train_mlp.py" in readme
    env = dict(os.environ, TORCH_JAX_FALLBACK="error")
    out = subprocess.run(
        [sys.executable, "examples/train_mlp.py", "--steps", "60"], cwd=ROOT, capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    losses = [float(v) for v in re.findall(r"loss (\d+\.\d+)", out.stdout)]
    assert len(losses) >= 3 and losses[-1] < 0.5 * losses[0], out.stdout
    assert "device jax" in out.stdout
