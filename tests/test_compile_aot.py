"""torch's AOT compile with the "jax" backend (NOTE [Compiled graphs in AOTAutograd's
cache] in compile/_graph): a function compiled ahead of time, saved to a file and loaded
in a new process runs there as eager code does on the CPU, and with the persistent
compilation cache the new process compiles nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

if not (hasattr(torch._dynamo.config, "enable_aot_compile") and hasattr(torch.compiler, "load_compiled_function")):
    pytest.skip(
        f"torch {torch.__version__} has no AOT compile (torch._dynamo.config.enable_aot_compile, "
        "torch.compiler.load_compiled_function)",
        allow_module_level=True,
    )

# Each process: the model and data from the test, a forward under no_grad (an inference
# graph) and a training step's loss (a forward and a backward graph), then one SGD step
# and the loss again. "save" AOT-compiles both functions, runs them (so their computations
# are compiled, and written to the persistent cache) and saves them; "load" loads them.
_SCRIPT = textwrap.dedent(
    """
    import json, sys, torch, torch_jax
    torch._dynamo.config.enable_aot_compile = True
    mode, where = sys.argv[1], sys.argv[2]
    data = torch.load(f"{where}/data.pt")
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))
    model.load_state_dict(data["state"])
    model = model.to("jax")
    x, y = data["x"].to("jax"), data["y"].to("jax")

    def forward(model, x):
        return model(x)

    def loss(model, x, y):
        return torch.nn.functional.mse_loss(model(x), y)

    if mode == "save":
        with torch.no_grad():
            fwd = torch.compile(forward, backend="jax", fullgraph=True).aot_compile(((model, x), {}))
        step = torch.compile(loss, backend="jax", fullgraph=True).aot_compile(((model, x, y), {}))
    else:
        with open(f"{where}/forward.bin", "rb") as f:
            fwd = torch.compiler.load_compiled_function(f)
        with open(f"{where}/step.bin", "rb") as f:
            step = torch.compiler.load_compiled_function(f)
    with torch.no_grad():
        out = fwd(model, x)
    first = step(model, x, y)
    first.backward()
    grads = [p.grad.cpu() for p in model.parameters()]
    if mode == "save":  # (saved after the calls: the live programs run on after saving, below)
        fwd.save_compiled_function(f"{where}/forward.bin")
        step.save_compiled_function(f"{where}/step.bin")
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
        again = fwd(model, x)
    second = step(model, x, y)
    losses = torch.stack([first, second]).detach().cpu()
    torch.save({"out": out.cpu(), "again": again.cpu(), "grads": grads, "losses": losses}, f"{where}/{mode}.pt")
    s = torch_jax.stats()
    print(json.dumps([s.get("compiled_graph_compiles", 0), s.get("compiled_graph_loads", 0)]))
    """
)


def _reference(data: dict) -> dict:
    """The same steps in eager mode on the CPU."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))
    model.load_state_dict(data["state"])
    x, y = data["x"], data["y"]
    with torch.no_grad():
        out = model(x)
    first = torch.nn.functional.mse_loss(model(x), y)
    first.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
        again = model(x)
    second = torch.nn.functional.mse_loss(model(x), y)
    return {"out": out, "again": again, "grads": grads, "losses": torch.stack([first, second]).detach()}


def _run(mode: str, where, **env) -> list:
    run = subprocess.run(
        [sys.executable, "-c", _SCRIPT, mode, str(where)],
        env=dict(os.environ, TORCH_JAX_FALLBACK="error", **env),
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_a_saved_forward_and_training_step_run_in_a_new_process_as_on_the_cpu(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))
    data = {"state": model.state_dict(), "x": torch.randn(4, 8), "y": torch.randn(4, 3)}
    torch.save(data, tmp_path / "data.pt")
    cache = {"TORCH_JAX_CACHE_DIR": str(tmp_path / "cache"), "TORCH_JAX_COMPILATION_CACHE": "1"}
    want = _reference(data)
    # three computations (the inference graph, the training forward and its backward): the
    # new process builds them from the saved graphs, traces them, and loads all three from
    # the persistent cache instead of compiling them
    for mode, counts in [("save", [3, 0]), ("load", [0, 3])]:
        assert _run(mode, tmp_path, **cache) == counts, mode
        got = torch.load(tmp_path / f"{mode}.pt")
        for key in ("out", "again", "losses"):
            torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-5, msg=f"{mode}: {key}")
        for g, w in zip(got["grads"], want["grads"], strict=True):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, msg=f"{mode}: a gradient")
