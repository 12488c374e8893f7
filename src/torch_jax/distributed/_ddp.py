"""NOTE [DDP's unused parameters on jax]: with ``find_unused_parameters=True`` (or
``static_graph=True``) PyTorch's C++ reducer copies its map of used parameters to the
device through a pinned host buffer, and a Python backend cannot give PyTorch a pinned
allocator (NOTE [Pinned memory for jax]): the first backward fails. On jax the reducer is
made without its search for unused parameters, and this module does its work, keeping
what a CUDA user sees:

- After each forward that will sync, the autograd graph is walked from the outputs to
  the parameters it reaches (as the reducer's search does). The outputs pass through
  ``_Sink``, whose backward, the first node of the backward pass, all-reduces the map of
  used parameters over the DDP group and gives each parameter this rank did not use a
  zero gradient, so that the reducer sees every parameter ready and all-reduces every
  bucket (a parameter another rank used gets the mean over the ranks, as on CUDA).
- A parameter no rank used keeps its ``.grad`` as it was (``None`` stays ``None``): it is
  put back after the reducer has written its buckets (a callback queued from a callback
  runs after the reducer's own, which autograd runs in order).
- ``static_graph=True`` runs the same way (the same results; the reducer is not told
  the graph is static, so ``ddp.static_graph`` reads ``False``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

NAME = "jax"


def install(module) -> None:
    """Wrap DistributedDataParallel's reducer set-up, ``_set_static_graph`` and ``_post_forward``."""
    ddp = module.DistributedDataParallel
    init_helper, set_static_graph, post_forward = ddp._ddp_init_helper, ddp._set_static_graph, ddp._post_forward
    flatten, unflatten = module._tree_flatten_with_rref, module._tree_unflatten_with_rref

    def _ddp_init_helper(self, *args, **kwargs):
        if getattr(self, "device_type", None) != NAME or not self.find_unused_parameters:
            return init_helper(self, *args, **kwargs)
        self.find_unused_parameters = False  # (the reducer's own search: see the NOTE)
        try:
            return init_helper(self, *args, **kwargs)
        finally:
            self.find_unused_parameters = True
            self._jax_unused = True

    def _set_static_graph(self):
        if getattr(self, "device_type", None) != NAME:
            return set_static_graph(self)
        self.find_unused_parameters = self._jax_unused = True

    def _post_forward(self, output):
        output = post_forward(self, output)
        if not getattr(self, "_jax_unused", False) or getattr(self, "_delay_all_reduce_all_params", False):
            return output
        if not (torch.is_grad_enabled() and self.require_backward_grad_sync):  # (as DDP's own search)
            return output
        tensors, spec, is_rref = flatten(output)
        at = [i for i, t in enumerate(tensors) if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        if not at:
            return output
        params = [p for p in self._module_parameters if p.requires_grad]
        reached = _reached([tensors[i] for i in at])
        used = [id(p) in reached for p in params]
        unused = [p for p, u in zip(params, used) if not u]
        passed = _Sink.apply(_Step(self, params, used), len(unused), *unused, *(tensors[i] for i in at))
        for i, t in zip(at, passed):
            tensors[i] = t
        return unflatten(tensors, spec, is_rref)

    ddp._ddp_init_helper, ddp._set_static_graph, ddp._post_forward = _ddp_init_helper, _set_static_graph, _post_forward


def _reached(tensors) -> set[int]:
    """The ids of the leaf tensors that the autograd graph of ``tensors`` reaches."""
    seen, found = set(), set()
    stack = [t.grad_fn for t in tensors]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        variable = getattr(fn, "variable", None)  # (AccumulateGrad)
        if variable is not None:
            found.add(id(variable))
        stack.extend(f for f, _ in fn.next_functions)
    return found


class _Step:
    """One forward's parameters and which of them this rank used."""

    def __init__(self, ddp, params, used):
        self.ddp, self.params, self.used = ddp, params, used

    def synced(self) -> None:
        """All-reduce the map of used parameters; arrange for the parameters no rank used to
        keep their gradients."""
        flags = torch.tensor(self.used, dtype=torch.int32)
        dist.all_reduce(flags, group=self.ddp.process_group)
        kept = [
            (p, None if p.grad is None else p.grad.detach().clone())
            for p, f in zip(self.params, flags.tolist())
            if not f
        ]
        if not kept:
            return
        engine = torch.autograd.Variable._execution_engine

        def restore():
            for p, grad in kept:
                if grad is None:
                    p.grad = None
                else:
                    p.grad.detach().copy_(grad)

        engine.queue_callback(lambda: engine.queue_callback(restore))  # (after the reducer's)


class _Sink(torch.autograd.Function):
    @staticmethod
    def forward(ctx, step, count, *tensors):
        ctx.step = step
        return tuple(t.clone() for t in tensors[count:])

    @staticmethod
    def backward(ctx, *grads):
        step = ctx.step
        step.synced()
        zeros = [torch.zeros_like(p) for p, u in zip(step.params, step.used) if not u]
        return (None, None, *zeros, *grads)
