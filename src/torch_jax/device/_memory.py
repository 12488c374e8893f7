"""The bytes of each device's live storages (NOTE [Memory accounting]): the counts the
tensor layer keeps as storages come and go, and the device module reads
(``torch.jax.memory_allocated``)."""

from __future__ import annotations


class Usage:
    """NOTE [Memory accounting]: the bytes of one device's live storages, as CUDA's
    caching allocator counts the blocks it hands to tensors. A storage counts from its
    creation (``torch.empty`` allocates, on CUDA too) until its box dies with the
    storage, whether its array is computed yet (fused eager's pending results), was
    never written, or is held: views, autograd's saved tensors and the optimizer's state
    share the storage and so its one count. Buffers the runtime holds outside storages
    (a compiled graph's temporaries, its constants) are not counted, as CUDA's counters
    leave out cuBLAS's workspace. XLA:CPU's PJRT client reports no allocator statistics,
    so this is what ``torch.jax.memory_allocated`` reads there (device/_module). Updated
    under the GIL by plain attribute arithmetic, with no call between read and write."""

    __slots__ = ("current", "peak", "count", "count_peak", "allocated", "freed", "allocs", "frees")

    def __init__(self):
        self.current = self.peak = self.count = self.count_peak = 0
        self.allocated = self.freed = self.allocs = self.frees = 0


USAGE: list[Usage] = []  # by device index


def usage(index: int) -> Usage:
    while len(USAGE) <= index:
        USAGE.append(Usage())
    return USAGE[index]
