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
    """The key (4 uint32 words) of the next random op on ``index``."""
    with _lock:
        state = _rng[index]
        seed, offset = state
        state[1] = (offset + OFFSET_STEP) & _MASK64
    return key_words(seed, offset)


# NOTE [Keys hashed on the host]: a random op's key is hashed from its generator's seed
# and offset here, in Python, and its computation takes the key's 4 words: the key of
# JAX's "rbg" layout, fold_in(fold_in(key(seed), offset_lo), offset_hi) and its
# fold_in(., 1), as jax.random derives them (the same words, so the same numbers, as
# when the computation hashed them itself). In the computation, the three threefry
# hashes (a while loop each on the CPU) made every random op's compilation the costliest
# of the small ones: XLA:CPU compiled uniform_ of a small shape in 126 against 256 ms,
# the hash alone 180 ms, a trivial computation 36 (a 2-core AMD EPYC in a slow hour,
# 2026-12-07), and an OpInfo sweep makes its samples with uniform_ on the device: the
# hashes were 47% of the float32 sweep's compile time. One hash in Python takes 25-30
# us, so a draw one OFFSET_STEP after the last one of its seed hashes the next
# KEY_BLOCK offsets at once with NumPy (about 7 us a key), the draws after it then
# looking theirs up; the hash the computation no longer runs took about 5 us of each
# call.
KEY_BLOCK = 64
_M32 = 0xFFFFFFFF
# Threefry-2x32's 20 rounds in 5 groups: the group's 4 rotations, then the key words
# injected after it and the injection's count
_THREEFRY = (
    (13, 15, 26, 6, 1, 2, 1), (17, 29, 16, 24, 2, 0, 2), (13, 15, 26, 6, 0, 1, 3),
    (17, 29, 16, 24, 1, 2, 4), (13, 15, 26, 6, 2, 0, 5),
)  # fmt: skip
_key_blocks: dict = {}  # seed -> (the first offset, the keys of KEY_BLOCK offsets from it)
_hashed: dict = {}  # seed -> the offset last hashed (alone, or the last of a block)


def _threefry2x32(k0, k1, x0, x1):
    """Threefry-2x32 of the block (x0, x1) under the key (k0, k1), as JAX's
    ``threefry2x32``: on Python ints or NumPy uint32 arrays (whose arithmetic wraps)."""
    ks = (k0, k1, k0 ^ k1 ^ 0x1BD11BDA)
    x0 = (x0 + k0) & _M32
    x1 = (x1 + k1) & _M32
    for r0, r1, r2, r3, a, b, count in _THREEFRY:
        for r in (r0, r1, r2, r3):
            x0 = (x0 + x1) & _M32
            x1 = ((x1 << r | x1 >> 32 - r) & _M32) ^ x0
        x0 = (x0 + ks[a]) & _M32
        x1 = (x1 + ks[b] + count) & _M32
    return x0, x1


def _hash(seed: int, lo, hi):
    """The key words of ``seed`` at the offsets whose low and high words are ``lo``, ``hi``
    (JAX's fold_in of a uint32 hashes the block (0, data))."""
    a, b = _threefry2x32(seed >> 32, seed & _M32, 0, lo)
    a, b = _threefry2x32(a, b, 0, hi)
    return (a, b, *_threefry2x32(a, b, 0, 1))


def key_words(seed: int, offset: int) -> np.ndarray:
    """The key (4 uint32 words) of the random op drawn at ``seed``, ``offset`` (NOTE
    [Keys hashed on the host])."""
    block = _key_blocks.get(seed)
    if block is not None:
        k, r = divmod(offset - block[0], OFFSET_STEP)
        if r == 0 and 0 <= k < KEY_BLOCK:
            return block[1][k]
    if len(_hashed) > 64:  # (seeds of generators gone: keep a few)
        _hashed.clear()
        _key_blocks.clear()
    if _hashed.get(seed) == offset - OFFSET_STEP:  # (a run of draws: the next ones at once)
        offsets = np.uint64(offset) + np.arange(KEY_BLOCK, dtype=np.uint64) * np.uint64(OFFSET_STEP)
        words = np.stack(_hash(seed, (offsets & _M32).astype(np.uint32), (offsets >> 32).astype(np.uint32)), axis=1)
        _key_blocks[seed] = (offset, words)
        _hashed[seed] = offset + (KEY_BLOCK - 1) * OFFSET_STEP  # (the draw after it: the next block)
        return words[0]
    _hashed[seed] = offset
    return np.array(_hash(seed, offset & _M32, offset >> 32), dtype=np.uint32)


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
