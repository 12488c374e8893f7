"""NOTE [The default torch.compile on jax]: ``torch.compile(model)`` names no backend,
so PyTorch compiles with Inductor, which has no code generator for the ``jax`` device
(``KeyError: 'jax'``, or a ``LoweringException`` deeper in). PyTorch builds one
``torch._TorchCompileInductorWrapper`` per ``torch.compile`` call (its ``mode`` and
``options``) and calls it with each graph Dynamo captures and the graph's example
inputs. The device wraps that call: a graph whose example inputs or values include a
tensor on ``jax`` goes to the ``jax`` backend, every other graph (CPU, CUDA) to Inductor
as before. So an unchanged script that calls ``torch.compile`` (nanoGPT's ``train.py``)
runs on ``jax``. Inductor's ``mode`` and ``options`` tune Inductor's own code generation
(autotuning, CUDA graphs) and have no meaning for XLA: they are checked by PyTorch as
usual and otherwise not used. The first routed graph says so once
(``torch_jax.CompileWarning``); ``TORCH_JAX_ROUTE_INDUCTOR=0`` (``config.route_inductor``)
leaves every graph to Inductor.

Installed when the device registers, without importing Dynamo or Inductor (NOTE [Cheap
autoload] in _registration).

NOTE [Dynamo skips the runtime]: while a compiled function runs, Dynamo's frame hook sees
every Python frame it calls, and it traces any code outside its skip list: the eager
part of a function after a graph break (a ``.item()``) calls the device's kernels, which
are Python, and Dynamo would try to compile torch_jax's runtime and JAX itself (and fail
inside JAX's internals). So when Dynamo's ``trace_rules`` is imported, torch_jax, jax and
jaxlib join its skip list, as torch's own files are.
"""

from __future__ import annotations

import warnings

import torch

NAME = "jax"
_told = False


def install() -> None:
    from torch_jax.device import _patches

    _patches.on_import("torch._dynamo.trace_rules", _skip_runtime)  # NOTE [Dynamo skips the runtime]
    wrapper = getattr(torch, "_TorchCompileInductorWrapper", None)
    if wrapper is None or getattr(wrapper.__call__, "_torch_jax", False):
        return
    inductor = wrapper.__call__

    def __call__(self, model_, inputs_, *args, **kwargs):
        from torch_jax._config import config

        if config.route_inductor and on_device(model_, inputs_):
            from torch_jax.compile import backend

            _tell(self)
            return backend(model_, inputs_)
        return inductor(self, model_, inputs_, *args, **kwargs)

    __call__._torch_jax = True
    __call__.__doc__ = inductor.__doc__
    wrapper.__call__ = __call__


def _skip_runtime(trace_rules) -> None:
    for package in ("torch_jax", "jax", "jaxlib"):
        trace_rules.add(package)
    # the methods that ``dataclasses`` generates have no file of ours ("<string>"), so the
    # skip list cannot name them: their code objects are skipped one by one (the device's
    # dataclasses that code under a compiled function may make; the lowering table's
    # context is a plain class for this reason, and is not imported here: that imports JAX)
    from torch._dynamo import eval_frame

    skip_code = getattr(eval_frame, "skip_code", None)  # (torch 2.11-2.14 have it)
    if skip_code is None:
        return
    from torch_jax import _config
    from torch_jax.device import _module

    for cls in (_module._DeviceProperties, _config.Config):
        for member in vars(cls).values():
            code = getattr(member, "__code__", None)
            if code is not None and not code.co_filename.endswith(".py"):
                skip_code(code)


def on_device(gm, inputs) -> bool:
    """Whether the graph holds a tensor on ``jax`` (an input, or a value it makes)."""
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.device.type == NAME:
            return True
    for node in getattr(getattr(gm, "graph", None), "nodes", ()):
        value = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(value, torch.Tensor) and value.device.type == NAME:
            return True
    return False


def _tell(wrapper) -> None:
    global _told
    if _told:
        return
    _told = True
    mode = [f"{k}={v!r}" for k, v in sorted(getattr(wrapper, "config", {}).items())]
    ignored = f" (Inductor's options {', '.join(mode)} do not apply)" if mode else ""
    warnings.warn(
        "torch_jax: torch.compile's graphs on the jax device run through the 'jax' backend (one XLA "
        f"computation per graph), not Inductor{ignored}; TORCH_JAX_ROUTE_INDUCTOR=0 turns this off",
        _category(),
        stacklevel=3,
    )


def _category():
    from torch_jax._warnings import CompileWarning

    return CompileWarning
