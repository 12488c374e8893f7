"""JAX devices behind ``jax:N``, the current device, device RNG state, and the work
in flight that ``torch.jax.synchronize()`` waits for."""

from __future__ import annotations

import functools
import os
import threading

import jax
import numpy as np
import torch
from jax.sharding import SingleDeviceSharding

_devices = jax.local_devices()  # (this process's: under torch.distributed, JAX sees every process's)
_current = 0
_lock = threading.Lock()

# NOTE [Device RNG]: each device has a (seed, offset) pair, like CUDA's Philox state.
# Every random op takes the key fold_in(fold_in(key(seed), offset_lo), offset_hi) and
# bumps the offset, so a seed fixes every random op's numbers, calls are independent,
# and the state saved by get_rng_state replays the same numbers after set_rng_state.
# The offset moves by 4 an op, as CUDA's moves by a multiple of 4 a kernel (its Philox
# offsets count 4-word blocks): code written for CUDA rewinds a generator by 4 to draw a
# discarded draw again (vLLM does for a partial prefill's sampled token).
OFFSET_STEP = 4
DEFAULT_SEED = 67280421310721  # the default seed of PyTorch's CUDA generators
_rng = {i: [DEFAULT_SEED, 0] for i in range(len(_devices))}
_MASK64 = (1 << 64) - 1

# the results of the last op run on each device: a device runs its computations in the
# order they were dispatched, so waiting for the last one waits for all of them
last: dict = {}


def count() -> int:
    return len(_devices)


def device(index: int):
    if not 0 <= index < len(_devices):
        raise RuntimeError(
            f"torch_jax: device jax:{index} does not exist; JAX sees {len(_devices)} device(s) "
            f"({_devices[0].platform}); set XLA_FLAGS=--xla_force_host_platform_device_count=N "
            "for N CPU devices"
        )
    return _devices[index]


@functools.cache
def sharding(index: int) -> SingleDeviceSharding:
    """The sharding that places an array on jax:index (one object per device)."""
    return SingleDeviceSharding(device(index))


def current() -> int:
    return _current


def set_current(index: int) -> None:
    global _current
    device(index)
    _current = index
    from torch_jax.device import _patches

    _patches.fill_current_device(index != 0)  # NOTE [The current device in .to("jax")]


def index_of(dev) -> int:
    """The device index of a torch device argument (None or no index: the current one)."""
    if dev is None:
        return _current
    if not isinstance(dev, torch.device):
        dev = torch.device(dev)
    return _current if dev.index is None else dev.index


# ---- RNG ----


def manual_seed(seed: int, index: int | None = None) -> None:
    seed = int(seed) & _MASK64
    with _lock:
        for i in range(len(_devices)) if index is None else [index]:
            _rng[i] = [seed, 0]


def initial_seed(index: int) -> int:
    return _rng[index][0]


def random_seed(index: int | None = None) -> None:
    manual_seed(int.from_bytes(os.urandom(8), "little"), index)


def next_key(index: int) -> np.ndarray:
    """The 4 words (seed, offset) of the next random op on ``index``."""
    with _lock:
        state = _rng[index]
        seed, offset = state
        state[1] = (offset + OFFSET_STEP) & _MASK64
    return key_words(seed, offset)


def key_words(seed: int, offset: int) -> np.ndarray:
    """The 4 uint32 words a random lowering's key is built from."""
    return np.array([seed >> 32, seed & 0xFFFFFFFF, offset & 0xFFFFFFFF, offset >> 32], dtype=np.uint32)


def get_rng_state(index: int) -> torch.Tensor:
    seed, offset = _rng[index]
    return torch.tensor(np.array([seed, offset], dtype=np.uint64).view(np.uint8))


def set_rng_state(state: torch.Tensor, index: int) -> None:
    raw = state.detach().cpu().contiguous()
    if raw.dtype != torch.uint8 or raw.numel() != 16:
        raise RuntimeError(
            f"torch_jax: set_rng_state expects the 16-byte uint8 tensor that get_rng_state "
            f"returns, got {raw.dtype} with {raw.numel()} elements"
        )
    seed, offset = raw.numpy().view(np.uint64).tolist()
    with _lock:
        _rng[index] = [int(seed), int(offset)]


# ---- work in flight ----


before_synchronize: list = []  # callbacks (fused eager runs its pending graphs)
before_event: list = []  # callbacks that dispatch without waiting (an event's record, a query)


def synchronize(index: int | None = None) -> None:
    for callback in before_synchronize:
        callback()
    for i in list(last) if index is None else [index]:
        results = last.pop(i, None)
        if results is not None:
            jax.block_until_ready(results)
    if host_copies:
        finish_host_copies(index)


# NOTE [Copies to the host without blocking]: ``x.to("cpu", non_blocking=True)`` and
# ``cpu.copy_(x, non_blocking=True)`` of a jax tensor return at once, as on CUDA, with the
# CPU tensor's values written later: the copy waits here, in its device's queue, until
# something orders after it. That is an event recorded after it and then waited for
# (``Event.synchronize``, or ``query`` once its array is ready), the device's or its
# stream's ``synchronize``, or a blocking copy to the host (a stream's later copy finds
# the earlier ones done). The values are read then. vLLM's asynchronous scheduling copies
# each step's sampled tokens so and waits on an event before reading them, while the host
# prepares the next step. A copy is any object with ``ready()`` and ``finish()`` (the
# runtime's, runtime/_copy.py); the queue may be finished from another thread (vLLM's
# output thread), hence the lock.
host_copies: dict[int, list] = {}  # device index -> copies not yet written, oldest first
_copies_lock = threading.Lock()


def defer_host_copy(index: int, copy) -> None:
    with _copies_lock:
        host_copies.setdefault(index, []).append(copy)


def pending_host_copies(index: int) -> tuple:
    """The copies an event recorded now on device ``index`` orders after."""
    with _copies_lock:
        return tuple(host_copies.get(index, ()))


def finish_host_copies(index: int | None = None, copies=None) -> None:
    """Writes ``copies`` (by default every copy queued on device ``index``, or on every
    device) and drops them from the queue. (The writes wait outside the queue's lock: the
    host keeps queueing the next step's copies meanwhile; a copy writes once, whichever
    thread comes first.)"""
    if copies is None:
        with _copies_lock:
            copies = [c for i in (list(host_copies) if index is None else [index]) for c in host_copies.get(i, ())]
    for copy in copies:
        copy.finish()
    with _copies_lock:
        for i in list(host_copies):
            queue = [c for c in host_copies[i] if not c.done]
            if queue:
                host_copies[i] = queue
            else:
                del host_copies[i]
