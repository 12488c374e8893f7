"""One run of a doctor's workload, in its own process: ``python .../doctor/_child.py``
(by its path, so that the reference run imports torch without the device; it imports
nothing of torch_jax's but in the jax runs).

NOTE [What the doctor sees of a script]: the target is an unmodified script, so the
child watches it through PyTorch's global hooks and reports what they saw:

- losses: every ``torch.autograd.backward`` call on a one-element tensor (which is what
  ``loss.backward()`` calls), kept as tensors and read at the end, so that watching
  forces no transfer or flush in the middle of a step;
- steps: optimizer steps (``register_optimizer_step_post_hook``), or where no optimizer
  steps, calls of the model: the first module the script calls (a global forward
  pre-hook finds it, then hooks on that module watch it). Each step
  ends with ``torch.accelerator.synchronize()`` on the run's device, so a step's time is
  its device time, as a CUDA user times it;
- gradients: at the first optimizer step, every parameter's gradient, named through the
  first module the script called; parameters: the same parameters after the last step;
  outputs: the model's first output where no optimizer steps;
- ``compiled`` mode: the model's forward is compiled with ``torch.compile``
  (backend ``jax``) the first time it is called (that call runs eagerly; the warm-up
  leaves it out); a module the script compiled itself is left as it is.

Tensors go to ``tensors.pt`` (on the CPU), the rest to ``result.json`` in ``--out``; a
script that raises still writes both, with the error and where it was raised.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import runpy
import sys
import time
import traceback


class Watch:
    """What the hooks saw (NOTE [What the doctor sees of a script])."""

    def __init__(self, device: str, compiled: bool, progress=None):
        self.device = device
        self.progress = progress  # a file the steps so far are written to, once a second
        self.told = 0.0
        self.compiled = compiled
        self.losses = []  # one-element tensors, detached
        self.step_ends = []  # perf_counter() after each optimizer step's synchronize
        self.forward_ends = []  # and after each forward of the model, before the first step
        self.optimizer_steps = 0
        self.root_calls = 0
        self.root = None  # the first module called
        self.first_hook = None
        self.grads = None  # name -> CPU tensor, at the first optimizer step
        self.outputs = None  # name -> CPU tensor, the first root output (inference)
        self.params = []  # the optimizers' parameters, in order
        self.start = time.perf_counter()

    # ------------------------------------------------------------ hooks

    def backward(self, original):
        def backward(tensors, *args, **kwargs):
            t = tensors[0] if isinstance(tensors, (tuple, list)) and tensors else tensors
            if isinstance(t, _torch().Tensor) and t.numel() == 1:
                self.losses.append(t.detach().reshape(()).clone())
            return original(tensors, *args, **kwargs)

        return backward

    def pre_step(self, optimizer, args, kwargs):
        if self.grads is None:
            self.params = [p for g in optimizer.param_groups for p in g["params"]]
            names = self._names()
            self.grads = {
                f"grad:{names.get(id(p), f'param{i}')}": p.grad.detach().cpu().clone()
                for i, p in enumerate(self.params)
                if p.grad is not None
            }

    def post_step(self, optimizer, args, kwargs):
        self.optimizer_steps += 1
        self.step_ends.append(self._synchronized())

    def first_call(self, module, args):
        """The first module called is the model: its own hooks watch it from here on
        (global hooks would be traced inside a compiled forward, and Dynamo cannot
        inline code of the device's package: NOTE [Dynamo skips the runtime])."""
        self.first_hook.remove()
        self.root = module
        module.register_forward_hook(self.post_forward)
        torch = _torch()
        if self.compiled and not isinstance(module, torch._dynamo.eval_frame.OptimizedModule):
            # (the forward, not Module.compile(): on torch 2.13 Dynamo compiles no graph
            # from a compiled Module._call_impl)
            module.forward = torch.compile(module.forward, backend="jax")

    def post_forward(self, module, args, output):
        self.root_calls += 1
        if self.outputs is None:
            self.outputs = {f"output:{k}": v.detach().cpu().clone() for k, v in _tensors(output)}
        if self.optimizer_steps == 0:  # (a training script's first forward too: warm-up)
            self.forward_ends.append(self._synchronized())

    def _synchronized(self) -> float:
        if self.device != "cpu":
            _torch().accelerator.synchronize()
        now = time.perf_counter()
        if self.progress is not None and now - self.told >= 1.0:  # (the doctor's progress line)
            self.told = now
            with open(self.progress, "w") as f:
                f.write(str(max(self.optimizer_steps, len(self.forward_ends))))
        return now

    def _names(self) -> dict:
        return {id(p): n for n, p in self.root.named_parameters()} if self.root is not None else {}

    # ------------------------------------------------------------ results

    def install(self):
        import torch.autograd
        import torch.nn.modules.module as module
        import torch.optim.optimizer as optimizer

        torch.autograd.backward = self.backward(torch.autograd.backward)
        optimizer.register_optimizer_step_pre_hook(self.pre_step)
        optimizer.register_optimizer_step_post_hook(self.post_step)
        self.first_hook = module.register_module_forward_pre_hook(self.first_call)

    def tensors(self) -> dict:
        out = {}
        if self.losses:
            out["loss"] = _torch().stack([t.cpu() for t in self.losses]).double()
        out.update(self.grads or {})
        if self.optimizer_steps == 0:
            out.update(self.outputs or {})
        names = self._names()
        for i, p in enumerate(self.params):
            out[f"param:{names.get(id(p), f'param{i}')}"] = p.detach().cpu().clone()
        return out

    def step_times(self) -> list:
        ends = [self.start] + (self.step_ends if self.optimizer_steps else self.forward_ends)
        return [b - a for a, b in zip(ends, ends[1:])]


def _torch():
    import torch

    return torch


def _tensors(output, prefix=""):
    """(name, tensor) for every floating tensor in a module's output."""
    torch = _torch()
    if isinstance(output, torch.Tensor):
        if output.is_floating_point() or output.is_complex():
            yield prefix or "0", output
    elif isinstance(output, dict) or hasattr(output, "items"):
        for k, v in output.items():
            yield from _tensors(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(output, (tuple, list)):
        for i, v in enumerate(output):
            yield from _tensors(v, f"{prefix}.{i}" if prefix else str(i))


def _error(exc: BaseException, target_path: str | None) -> dict:
    frames = traceback.extract_tb(exc.__traceback__)
    inside = [f for f in frames if target_path and os.path.abspath(f.filename) == target_path]
    frame = (inside or frames or [None])[-1]
    where = f"{frame.filename}:{frame.lineno} ({frame.name})" if frame else "?"
    return {
        "type": type(exc).__name__,
        "message": str(exc)[:4000],
        "where": where,
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-20000:],
    }


def _run_script(path: str, args: list) -> None:
    sys.argv = [path] + args
    sys.path.insert(0, os.path.dirname(path))
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            raise RuntimeError(f"the script exited with status {e.code}") from None


def _run_entry(spec: str, device: str, steps: int, compiled: bool) -> None:
    """``module:function`` returns ``(model, inputs)``; each step runs the forward and,
    when the output holds a loss (an output's ``loss``, or a one-element output), the
    backward, with plain SGD between steps (so the optimizer hooks see steps)."""
    torch = _torch()
    module_name, _, function = spec.partition(":")
    model, inputs = getattr(importlib.import_module(module_name), function)()
    model = model.to(device)
    to = lambda v: v.to(device) if isinstance(v, torch.Tensor) else v  # noqa: E731
    if isinstance(inputs, dict):
        args, kwargs = (), {k: to(v) for k, v in inputs.items()}
    else:
        args, kwargs = tuple(to(v) for v in (inputs if isinstance(inputs, (tuple, list)) else (inputs,))), {}
    if compiled:
        model = torch.compile(model, backend="jax")
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=1e-3) if params else None
    for _ in range(steps):
        out = model(*args, **kwargs)
        loss = _loss(out)
        if loss is None or optimizer is None:
            continue
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def _loss(out):
    torch = _torch()
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, dict):
        loss = out.get("loss")
    if loss is None and isinstance(out, torch.Tensor) and out.numel() == 1:
        loss = out
    return loss if isinstance(loss, torch.Tensor) and loss.requires_grad else None


def _peak_device_bytes(device: str):
    torch = _torch()
    try:
        if device.startswith("cuda"):
            return int(torch.cuda.max_memory_allocated())
        if device.startswith("jax"):
            return int(torch.jax.max_memory_allocated())  # (NOTE [Memory statistics]: true on XLA:CPU too)
    except Exception:  # (a device that reports nothing)
        return None
    return None


def main(argv=None) -> int:
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        sys.path[0] = os.getcwd()  # (the target's imports see the working directory, not this one)
    p = argparse.ArgumentParser(prog="_child.py")
    p.add_argument("--mode", required=True, choices=["reference", "strict", "fused", "compiled"])
    p.add_argument("--device", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--kind", required=True, choices=["script", "entry"])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("target")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    args = a.args[1:] if a.args[:1] == ["--"] else a.args

    import torch

    if a.mode != "reference":
        import torch_jax  # noqa: F401  (the environment set the mode and the census)

    torch.manual_seed(0)
    watch = Watch(a.device, compiled=a.mode == "compiled", progress=os.path.join(a.out, "progress"))
    watch.install()
    path = os.path.abspath(a.target) if a.kind == "script" else None
    error = None
    start = time.perf_counter()
    try:
        if a.kind == "script":
            _run_script(path, args)
        else:
            _run_entry(a.target, a.device, a.steps, compiled=a.mode == "compiled")
        if a.device != "cpu":
            torch.accelerator.synchronize()
    except BaseException as e:  # (KeyboardInterrupt too: the record says where it stopped)
        error = _error(e, path)
    wall = time.perf_counter() - start
    result = {
        "error": error,
        "wall_s": wall,
        "steps": watch.optimizer_steps or watch.root_calls,
        "step_times": watch.step_times(),
        "host_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "device_bytes": _peak_device_bytes(a.device),
        "stats": None,
    }
    try:
        tensors = watch.tensors()
        result["losses"] = tensors["loss"].tolist() if "loss" in tensors else []
        torch.save(tensors, os.path.join(a.out, "tensors.pt"))
    except Exception as e:  # (the device failed: the record keeps the first error)
        result["error"] = result["error"] or _error(e, path)
        result["losses"] = []
    if a.mode != "reference":
        import torch_jax

        result["stats"] = torch_jax.stats()
    with open(os.path.join(a.out, "result.json"), "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
