"""Functional collectives inside ``torch.compile`` graphs.

NOTE [Collectives in compiled graphs]: DTensor and traced distributed code put
``torch.ops._c10d_functional`` ops in a graph (``all_reduce``, ``all_gather_into_tensor``,
``reduce_scatter_tensor``, ``all_to_all_single``, each followed by ``wait_tensor``). A graph
that holds them compiles as one SPMD program over the mesh of its process group (one
device a rank, the mesh the ``jax`` process group's eager collectives use, NOTE [The jax
process group]): ``shard_map`` over the mesh axis ``"r"``, each rank's inputs its own block
of global arrays, and the collectives as JAX's (``psum``, ``all_gather``, ``psum_scatter``,
``all_to_all``), so that a step's computation and its communication are one XLA
computation. Each input array of a rank becomes its block along dimension 0 of a global
array (scalars are made one-element arrays first); each output is the rank's block back.
A graph whose collectives use more than one group, or a group whose ``jax`` backend is not
torch_jax's, runs op by op (the eager collectives), as does anything else the program
cannot lower.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

_F = torch.ops._c10d_functional
AXIS = "r"


class Unsupported(Exception):
    pass


def _reduce(x, op: str):
    if op in ("sum", "avg"):
        y = jax.lax.psum(x, AXIS)
        return y / jax.lax.axis_size(AXIS) if op == "avg" else y
    if op in ("max", "min"):
        return (jax.lax.pmax if op == "max" else jax.lax.pmin)(x, AXIS)
    raise Unsupported(f"the reduction {op!r} of a functional collective")


def _all_reduce(x, op, group):
    return _reduce(x, op)


def _all_gather(x, size, group):
    return jax.lax.all_gather(x, AXIS, axis=0, tiled=True)


def _reduce_scatter(x, op, size, group):
    if op not in ("sum", "avg"):
        raise Unsupported(f"reduce_scatter_tensor with {op!r}")
    y = jax.lax.psum_scatter(x, AXIS, scatter_dimension=0, tiled=True)
    return y / size if op == "avg" else y


def _all_to_all(x, output_splits, input_splits, group):
    size = jax.lax.axis_size(AXIS)
    for splits in (output_splits, input_splits):
        if splits and any(int(s) != x.shape[0] // size for s in splits):
            raise Unsupported("all_to_all_single with uneven splits")
    return jax.lax.all_to_all(x, AXIS, 0, 0, tiled=True)


def _lowerings() -> dict:
    if not hasattr(_F, "all_reduce"):  # (a torch built without distributed)
        return {}
    return {
        _F.all_reduce.default: _all_reduce,
        _F.all_reduce_coalesced.default: lambda xs, op, group: [_reduce(x, op) for x in xs],
        _F.all_gather_into_tensor.default: _all_gather,
        _F.all_gather_into_tensor_coalesced.default: lambda xs, size, group: [_all_gather(x, size, group) for x in xs],
        _F.reduce_scatter_tensor.default: _reduce_scatter,
        _F.reduce_scatter_tensor_coalesced.default: lambda xs, op, size, group: [
            _reduce_scatter(x, op, size, group) for x in xs
        ],
        _F.all_to_all_single.default: _all_to_all,
        _F.wait_tensor.default: lambda x: x,
    }


LOWERINGS = _lowerings()


def group_of(node) -> str | None:
    """The process group name a collective node names (None: wait_tensor)."""
    if node.target._schema.name == "_c10d_functional::wait_tensor":
        return None
    name = node.args[-1] if node.args else node.kwargs.get("group_name")
    if not isinstance(name, str):
        raise Unsupported(f"{node.target} with the group {name!r}")
    return name


def backend_of(name: str):
    """The jax process group (torch_jax's backend) of the group named ``name``."""
    from torch.distributed.distributed_c10d import _resolve_process_group

    from torch_jax.distributed._backend import JaxProcessGroup

    group = _resolve_process_group(name)
    backend = group if isinstance(group, JaxProcessGroup) else group._get_backend(torch.device("jax"))
    if not isinstance(backend, JaxProcessGroup):
        raise Unsupported(f"the process group {name!r}, whose jax backend is {type(backend).__name__}")
    return backend


def call(compiled, backend, mesh, device, scalars, what: str, *dyn):
    """One call of a compiled SPMD program with this rank's dyn values: its results. The
    ranks first compare what they call (NOTE [Mismatched collectives])."""
    from torch_jax.distributed import _backend

    if _backend._CHECK:
        shapes = " ".join(f"{np.dtype(getattr(v, 'dtype', type(v))).name}{list(np.shape(v))}" for v in dyn)
        backend._check(f"{what} ({shapes})")
    return localize(compiled(*globalize(dyn, mesh, device)), scalars)


def spmd(traced, mesh, count: int, found: dict):
    """``traced`` (dyn arrays -> outputs) as a jitted SPMD program over ``mesh``: it takes
    and returns global arrays whose dimension-0 blocks are the ranks' arrays (a scalar a
    one-element block; ``found["scalars"]`` says which outputs were scalars)."""
    from jax.sharding import PartitionSpec as P

    def body(*blocks):
        vals = [b.reshape(()) if flat else b for b, flat in zip(blocks, found["scalar_ins"])]
        outs = traced(*vals)
        found["scalars"] = [jnp.ndim(o) == 0 for o in outs]
        return tuple(jnp.reshape(o, (1,)) if jnp.ndim(o) == 0 else o for o in outs)

    specs = (P(AXIS),) * count
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P(AXIS), check_vma=False))


def globalize(dyn, mesh, device) -> list:
    """Each rank's dyn values as global arrays: its block, along dimension 0."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    sharding = NamedSharding(mesh, P(AXIS))
    size = mesh.size
    out = []
    for v in dyn:
        if not isinstance(v, jax.Array):
            v = jax.device_put(np.asarray(v), device)
        if v.ndim == 0:
            v = v.reshape((1,))
        out.append(jax.make_array_from_single_device_arrays((size * v.shape[0],) + v.shape[1:], sharding, [v]))
    return out


def localize(results, scalars) -> list:
    """This rank's blocks of the program's global results."""
    out = []
    for r, flat in zip(results, scalars):
        block = r.addressable_data(0)
        out.append(block.reshape(()) if flat else block)
    return out
