"""The ``jax`` process group.

NOTE [The jax process group]: collectives on ``jax`` tensors run as XLA collectives
across JAX processes (gloo between CPUs, NCCL between NVIDIA GPUs, ICI on TPUs: the one
program JAX compiles for each). JAX's distributed runtime must start before JAX's
backend does, so creating the group only records its store, rank and size; the device,
when it first starts (``torch_jax.initialize``), starts JAX's runtime first, from the
same rendezvous: rank 0 picks a free port beside ``MASTER_ADDR`` and tells the others
through the group's store. On the CPU each process gets ``LOCAL_WORLD_SIZE`` CPU
devices, as each process on a GPU host sees all its GPUs and uses ``LOCAL_RANK``'s.

NOTE [Any order under a launcher]: most scripts choose the device first and create the
group after (``set_device_index(LOCAL_RANK)``, the model on the device, then
``init_process_group()``: PyTorch's DDP tutorial, TorchTitan). Where the environment says
the process is one of a job (``RANK``, ``WORLD_SIZE`` over 1, ``MASTER_ADDR`` and
``MASTER_PORT``, as torchrun and ``torch.distributed.launch`` set them), a device that starts
before any group starts JAX's runtime itself, through the rendezvous ``env://`` that
``init_process_group()`` will use: torchrun's agent store, or rank 0's multi-tenant
store, which the group's own store later shares (the one kept here holds its server).
So ``jax:LOCAL_RANK`` exists from the first use, and tensors made before the group work
in its collectives. Outside such an environment a program that used the device before
``init_process_group`` gets a clear error at its first collective on ``jax``. (Ray Train
unpickles a worker's ``train_loop_config`` before it sets these variables there; for a
jax group the variables are set first, NOTE [Ray Train on jax].)

Each collective makes one global array from every rank's tensor (rank ``r``'s tensor is
row ``r`` of an array sharded over a mesh of one device per rank: the device of the
tensor on each rank, exchanged through the store the first time), runs a jitted
``shard_map`` of the collective (cached by JAX per shape and dtype), and writes the
rank's row of the result into the caller's tensor. The reductions JAX has collectives for
(sum, max, min, average of floats) use them; product and the bitwise ones gather and
reduce. CPU tensors, ``send``/``recv`` and ``barrier`` go through a gloo group the jax
group holds beside (host copies for ``send``/``recv`` of jax tensors).
"""

from __future__ import annotations

import functools
import ipaddress
import os
import socket
import sys
import zlib

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.futures import Future

_KEY = "torch_jax/coordinator"
_world = None  # (store, rank, size, timeout) of the first jax group, until JAX's runtime starts
_started = False
_launch_store = None  # NOTE [Any order under a launcher]
_CHECK = os.environ.get("TORCH_JAX_DIST_CHECK", "1") != "0"  # NOTE [Mismatched collectives]


def start_runtime() -> None:
    """Start JAX's distributed runtime (before JAX's backend) for the first jax group, or,
    before any, for the launcher's job (NOTE [Any order under a launcher])."""
    global _started
    if _started:
        return
    world = _world or _launched_world()
    if world is None:
        return
    store, rank, size, timeout = world
    _started = True
    if size == 1:
        return
    import jax

    from torch_jax.device import _host_memory

    # (JAX's preemption service takes SIGTERM, with which torchrun stops the other ranks
    # when one fails: the ranks would not stop; measured)
    jax.config.update("jax_enable_preemption_service", False)
    if _host_memory.platform() == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        # as each process of a GPU host sees every GPU of it (and uses cuda:LOCAL_RANK, which
        # DeviceMesh and most scripts set), each process gets a CPU device per local process
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        flags = os.environ.get("XLA_FLAGS", "")
        if local > 1 and "xla_force_host_platform_device_count" not in flags:
            os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={local}".strip()
    if rank == 0:
        host = os.environ.get("MASTER_ADDR", "127.0.0.1")
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        store.set(_KEY, f"{host}:{port}")
    address = store.get(_KEY).decode()
    _exit_on_uncaught_exceptions()
    # (the group's timeout bounds JAX's waits too: for a rank that stops sending heartbeats,
    # which ends the others with JAX's error, and at exit for the shutdown barrier)
    seconds = max(int(timeout.total_seconds()), 1)
    jax.distributed.initialize(
        address,
        size,
        rank,
        initialization_timeout=seconds,
        heartbeat_timeout_seconds=min(seconds, 100),
        shutdown_timeout_seconds=min(seconds, 300),
        # (a job on one machine's loopback keeps JAX's coordinator there too: it listens on
        # every interface otherwise)
        coordinator_bind_address=address if _loopback(address.rsplit(":", 1)[0]) else None,
    )


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def _launched_world():
    """(store, rank, size, timeout) of the launcher's job, through ``env://`` (None when the
    process is not one of a job)."""
    global _launch_store
    from torch_jax.distributed import launched

    if not launched():
        return None
    from torch.distributed.constants import default_pg_timeout

    store, rank, size = next(dist.rendezvous("env://", timeout=default_pg_timeout))
    _launch_store = store  # (rank 0's server, when it hosts one, lives as long as a store of it)
    # (torchrun's agent store outlives a restart of the workers: each attempt its own keys)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"torch_jax/launch/{attempt}", store), rank, size, default_pg_timeout


def _exit_on_uncaught_exceptions() -> None:
    """A rank that ends with an uncaught exception exits at once, after Python prints it:
    at exit JAX's runtime waits (up to the group's timeout) for every rank to end, so a
    failing rank would stay alive while the others wait for it at their next collective,
    where torchrun, seeing it exit, stops them. (atexit handlers do not run then.)"""
    previous = sys.excepthook

    def excepthook(kind, value, tb):
        previous(kind, value, tb)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)

    sys.excepthook = excepthook


def _done(result=None):
    future = Future()
    future.set_result(result)
    return _create_work_from_future(future)


class JaxProcessGroup(dist.ProcessGroup):
    """``torch.distributed``'s backend for ``jax`` tensors (NOTE [The jax process group])."""

    def __init__(self, store, rank: int, size: int, timeout):
        super().__init__(rank, size)
        global _world
        from torch_jax.device import _start

        self._store, self._rank, self._size, self._timeout = store, rank, size, timeout
        self._meshes = {}
        self._name = ""
        self._checks = 0
        self._gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo", store), rank, size, timeout)
        if _world is None and not _start.started():
            _world = (store, rank, size, timeout)  # (started with the device; else _mesh says why not)

    def getBackendName(self) -> str:
        return "jax"

    # (a Python group stands for itself: its name, which functional collectives look it up
    # by, is kept here)
    def _set_group_name(self, name: str) -> None:
        super()._set_group_name(name)
        self._name = name

    @property
    def group_name(self) -> str:
        return self._name

    def __repr__(self) -> str:
        return f"JaxProcessGroup(rank={self._rank}, size={self._size})"

    def _get_backend(self, device):
        """The backend for ``device``'s tensors (torch 2.14's ``batch_isend_irecv`` asks any
        group): this group for jax, the gloo group it holds for the CPU."""
        kind = torch.device(device).type
        if kind == "cpu":
            return self._gloo
        if kind == "jax":
            return self
        raise RuntimeError(f"No backend type associated with device type {kind}")

    # ------------------------------------------------------------ the mesh

    def _mesh(self, index: int):
        """The mesh of this group's devices, one a rank, for tensors on local jax:index."""
        mesh = self._meshes.get(index)
        if mesh is None:
            import jax
            import numpy as np

            from torch_jax.device import _state

            if self._size > 1 and not jax.distributed.is_initialized():
                raise RuntimeError(
                    "torch_jax: the jax device started before torch.distributed.init_process_group(), "
                    "so JAX's distributed runtime could not start; call init_process_group() before the "
                    "first use of the jax device"
                )
            # (ranks may use different local devices, jax:LOCAL_RANK say: the exchange is keyed by
            # how many meshes this group has made, as every rank makes its first at its first
            # collective on jax, and another only if it moves its tensors to another device)
            key = f"torch_jax/devices/{len(self._meshes)}"
            self._store.set(f"{key}/{self._rank}", str(_state.device(index).id))
            ids = [int(self._store.get(f"{key}/{r}")) for r in range(self._size)]
            by_id = {d.id: d for d in jax.devices()}
            mesh = jax.sharding.Mesh(np.array([by_id[i] for i in ids]), ("r",))
            self._meshes[index] = mesh
        return mesh

    def _run(self, kind: str, t: torch.Tensor, *extra):
        """``kind``'s collective over this group's copies of ``t``: the local result array."""
        import jax
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        from torch_jax.device import _state
        from torch_jax.runtime import _copy

        index = t.device.index or 0
        mesh = self._mesh(index)
        if _CHECK:
            self._check(f"{kind}{' ' + extra[0] if extra else ''} {str(t.dtype)[6:]}{list(t.shape)}")
        local = _copy.logical_array(t, "collective")
        local = local.reshape((1,) + local.shape)
        sharding = NamedSharding(mesh, P("r"))
        whole = jax.make_array_from_single_device_arrays((self._size,) + local.shape[1:], sharding, [local])
        out = _collective(mesh, kind, *extra)(whole)
        _state.last[index] = out  # (what torch.jax.synchronize() waits for, as for any op)
        return out.addressable_data(0)

    def _check(self, what: str) -> None:
        """NOTE [Mismatched collectives]: XLA runs a collective whose ranks disagree on its
        shape silently wrong or hangs (measured on the CPU: a sum over 3 and 4 elements gave
        one rank a wrong sum and hung the other). So before each collective the ranks compare
        a fingerprint of (collective, reduction, dtype, shape) through the gloo group beside,
        whose wait is bounded by the group's timeout: a rank that died or never comes gives
        the others an error within the timeout, and a mismatch an error naming what each rank
        called. (One small host all-gather a collective; ``TORCH_JAX_DIST_CHECK=0`` skips it.)"""
        mine = torch.tensor([zlib.crc32(what.encode())], dtype=torch.int64)
        every = [torch.empty_like(mine) for _ in range(self._size)]
        try:
            self._gloo.allgather([every], [mine]).wait()
        except RuntimeError as e:
            raise RuntimeError(
                f"torch_jax: rank {self._rank} waited for the other ranks of its process group at a "
                f"collective ({what}) and they did not all come within the group's timeout "
                f"({self._timeout}), or one died: {e}"
            ) from e
        self._checks += 1
        if any(int(h) != int(mine) for h in every):
            key = f"torch_jax/mismatch/{self._checks}"
            self._store.set(f"{key}/{self._rank}", what)
            called = "; ".join(f"rank {r}: {self._store.get(f'{key}/{r}').decode()}" for r in range(self._size))
            raise RuntimeError(
                f"torch_jax: the ranks of a process group called different collectives, or one with "
                f"different shapes or dtypes ({called}); every rank must call the same collectives "
                "in the same order on tensors of the same shape"
            )

    def _write(self, t: torch.Tensor, arr) -> None:
        from torch_jax.device import _state
        from torch_jax.tensor import _storage

        index = t.device.index or 0
        _state.last[index] = arr  # (synchronize() waits for it; a copy_ that runs an op replaces it with its own)
        with torch.no_grad():  # (a backend writes its tensors as data: a Parameter, a buffer that requires grad)
            t.copy_(_storage.new_tensor(tuple(arr.shape), t.dtype, index, arr=arr))

    # ------------------------------------------------------------ collectives

    def allreduce(self, tensors, opts=None):
        if tensors[0].device.type == "cpu":
            return self._gloo.allreduce(tensors, opts)
        for t in tensors:
            x, op = _premultiplied(t, opts)
            if op == "avg" and not (t.is_floating_point() or t.is_complex()):
                raise ValueError(f"torch_jax: all_reduce with ReduceOp.AVG needs a floating tensor, got {t.dtype}")
            self._write(t, self._run("allreduce", x, op, str(t.dtype))[0])
        return _done(tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts=None):
        if tensors[0].device.type == "cpu":
            return self._gloo.broadcast(tensors, opts)
        root = opts.rootRank
        for t in tensors:
            self._write(t, self._run("gather", t)[0][root])
        return _done(tensors)

    def reduce(self, tensors, opts=None):
        if tensors[0].device.type == "cpu":
            return self._gloo.reduce(tensors, opts)
        for t in tensors:
            x, op = _premultiplied(t, opts)
            result = self._run("allreduce", x, op, str(t.dtype))[0]
            if self._rank == opts.rootRank:
                self._write(t, result)
        return _done(tensors)

    def allgather(self, output_lists, inputs, opts=None):
        if inputs[0].device.type == "cpu":
            return self._gloo.allgather(output_lists, inputs, opts)
        for outputs, t in zip(output_lists, inputs):
            rows = self._run("gather", t)[0]
            for r, out in enumerate(outputs):
                self._write(out, rows[r])
        return _done(output_lists)

    def all_gather_single(self, output, input, opts=None):
        if input.device.type == "cpu":
            return self._gloo._allgather_base(output, input, opts)
        rows = self._run("gather", input)[0]
        self._write(output, rows.reshape(output.shape))
        return _done(output)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        for out, t in zip(outputs, inputs):
            self.all_gather_single(out, t, opts)
        return _done(outputs)

    def reduce_scatter(self, outputs, input_lists, opts=None):
        if outputs[0].device.type == "cpu":
            return self._gloo.reduce_scatter(outputs, input_lists, opts)
        for out, chunks in zip(outputs, input_lists):
            self._reduce_scatter(out, torch.stack([c.reshape(out.shape) for c in chunks]), opts)
        return _done(outputs)

    def reduce_scatter_single(self, output, input, opts=None):
        if input.device.type == "cpu":
            return self._gloo._reduce_scatter_base(output, input, opts)
        self._reduce_scatter(output, input.reshape((self._size,) + tuple(output.shape)), opts)
        return _done(output)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        for out, t in zip(outputs, inputs):
            self.reduce_scatter_single(out, t, opts)
        return _done(outputs)

    def _reduce_scatter(self, output, stacked, opts):
        stacked, op = _premultiplied(stacked, opts)
        # every rank's row for this rank, reduced: a gather of the rows, then the reduction
        rows = self._run("allreduce", stacked, op, str(stacked.dtype))[0]
        self._write(output, rows[self._rank])

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        if input.device.type == "cpu":
            return self._gloo.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)
        # (an empty list of splits: even ones, as in PyTorch; the other list may be uneven)
        sends = list(input_split_sizes) or [input.shape[0] // self._size] * self._size
        receives = list(output_split_sizes) or [output.shape[0] // self._size] * self._size
        if len(set(sends + receives)) > 1:
            return self._all_to_all_uneven(output, input, sends, receives)
        chunks = input.reshape((self._size, sends[0]) + tuple(input.shape[1:]))
        rows = self._run("gather", chunks)[0]  # (rank, chunk, ...): what every rank sends
        self._write(output, rows[:, self._rank].reshape(output.shape))
        return _done(output)

    def _all_to_all_uneven(self, output, input, sends, receives):
        """Uneven splits: every rank's chunks padded to one length, the longest chunk of any
        rank rounded up to a power of two (found through gloo; the rounding bounds the
        compilations when the splits change every step, as a mixture of experts' do), then
        the even exchange, and each received chunk cut to its length."""
        import jax.numpy as jnp
        import numpy as np

        from torch_jax.runtime import _copy
        from torch_jax.tensor import _storage

        longest = torch.tensor([max(sends)], dtype=torch.int64)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MAX
        self._gloo.allreduce([longest], opts).wait()
        length = 1 << (max(int(longest), 1) - 1).bit_length()
        starts = np.cumsum([0] + sends[:-1])
        rows = [s + j if j < n else -1 for s, n in zip(starts, sends) for j in range(length)]
        local = _copy.logical_array(input, "collective")
        padded = jnp.take(local, jnp.asarray(rows, dtype=np.int32), axis=0, mode="fill", fill_value=0)
        padded = padded.reshape((self._size, length) + local.shape[1:])
        chunks = _storage.new_tensor(tuple(padded.shape), input.dtype, input.device.index or 0, arr=padded)
        got = self._run("gather", chunks)[0][:, self._rank]  # (source rank, length, ...)
        keep = [r * length + j for r, n in enumerate(receives) for j in range(n)]
        flat = got.reshape((self._size * length,) + got.shape[2:])
        self._write(output, jnp.take(flat, jnp.asarray(keep, dtype=np.int32), axis=0))
        return _done(output)

    def alltoall(self, outputs, inputs, opts=None):
        for r in range(self._size):  # (per destination: each rank's input r reaches rank r)
            rows = self._run("gather", inputs[r].contiguous())[0]
            if r == self._rank:
                for src, out in enumerate(outputs):
                    self._write(out, rows[src])
        return _done(outputs)

    def gather(self, output_lists, inputs, opts=None):
        if inputs[0].device.type == "cpu":
            return self._gloo.gather(output_lists, inputs, opts)
        rows = self._run("gather", inputs[0])[0]
        if self._rank == opts.rootRank:
            for r, out in enumerate(output_lists[0]):
                self._write(out, rows[r])
        return _done(output_lists)

    def scatter(self, outputs, input_lists, opts=None):
        if outputs[0].device.type == "cpu":
            return self._gloo.scatter(outputs, input_lists, opts)
        out = outputs[0]
        if self._rank == opts.rootRank:
            stacked = torch.stack([c.reshape(out.shape) for c in input_lists[0]])
        else:
            stacked = torch.zeros((self._size,) + tuple(out.shape), dtype=out.dtype, device=out.device)
        rows = self._run("gather", stacked)[0]
        self._write(out, rows[opts.rootRank, self._rank])
        return _done(outputs)

    # (the names torch 2.11 and 2.12 call them by)
    _allgather_base = all_gather_single
    _reduce_scatter_base = reduce_scatter_single
    alltoall_base = all_to_all_single

    def barrier(self, opts=None):
        return self._gloo.barrier()

    def send(self, tensors, dst: int, tag: int = 0):
        host = [t.cpu() if t.device.type != "cpu" else t for t in tensors]
        return self._gloo.send(host, dst, tag)

    def recv(self, tensors, src: int, tag: int = 0):
        host = [torch.empty_like(t, device="cpu") if t.device.type != "cpu" else t for t in tensors]
        work = self._gloo.recv(host, src, tag)
        work.wait()
        with torch.no_grad():  # (as _write)
            for t, h in zip(tensors, host):
                if t is not h:
                    t.copy_(h)
        return _done(tensors)


def _premultiplied(t: torch.Tensor, opts):
    """(the tensor to reduce, the reduction's name): ``PREMUL_SUM(factor)``, which FSDP2
    reduce-scatters gradients with (its divide factor), is the sum of each rank's tensor
    times the factor, multiplied in the tensor's dtype as NCCL does; the others reduce
    ``t`` itself."""
    op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
    if op == dist.ReduceOp.PREMUL_SUM:
        factor = op.factor
        if isinstance(factor, torch.Tensor):
            factor = factor.to(t.device, t.dtype)
        return t * factor, "sum"
    return t, _op(opts)


def _op(opts) -> str:
    op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
    names = {
        dist.ReduceOp.SUM: "sum",
        dist.ReduceOp.AVG: "avg",
        dist.ReduceOp.MAX: "max",
        dist.ReduceOp.MIN: "min",
        dist.ReduceOp.PRODUCT: "product",
        dist.ReduceOp.BAND: "band",
        dist.ReduceOp.BOR: "bor",
        dist.ReduceOp.BXOR: "bxor",
    }
    for value, name in names.items():
        if op == value:
            return name
    kind = getattr(op, "op", op)  # (a ReduceOp object prints its address; its RedOpType its name)
    raise NotImplementedError(f"torch_jax: ReduceOp {getattr(kind, 'name', kind)} on jax tensors")


@functools.cache
def _collective(mesh, kind: str, op: str | None = None, dtype: str | None = None):
    """A jitted shard_map over ``mesh``'s axis "r" (rows: one a rank)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    def gather(x):  # (1, ...) -> (1, size, ...): every rank's row
        return jax.lax.all_gather(x[0], "r")[None]

    def allreduce(x):
        if op in ("sum", "avg") and dtype != "torch.bool":
            y = jax.lax.psum(x, "r")
            return y / mesh.size if op == "avg" else y
        if op in ("max", "min") and dtype != "torch.bool":
            return (jax.lax.pmax if op == "max" else jax.lax.pmin)(x, "r")
        rows = jax.lax.all_gather(x[0], "r")
        reduce = {
            "sum": jnp.any,  # (bool)
            "max": jnp.any,
            "min": jnp.all,
            "product": lambda r, axis: (
                jnp.prod(r, axis=axis, dtype=r.dtype) if r.dtype != jnp.bool_ else jnp.all(r, axis=axis)
            ),
            "band": lambda r, axis: functools.reduce(jnp.bitwise_and, list(r)),
            "bor": lambda r, axis: functools.reduce(jnp.bitwise_or, list(r)),
            "bxor": lambda r, axis: functools.reduce(jnp.bitwise_xor, list(r)),
        }[op]
        return reduce(rows, axis=0)[None]

    body = {"gather": gather, "allreduce": allreduce}[kind]
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("r"), out_specs=P("r")))
