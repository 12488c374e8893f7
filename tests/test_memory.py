"""Memory statistics (NOTE [Memory statistics] in device/_module): true figures on every
backend, through ``torch.accelerator`` and ``torch.jax``, in strict and fused mode. On
XLA:CPU they come from the runtime's count of live storages (NOTE [Memory accounting])."""

from __future__ import annotations

import gc

import pytest
import torch

import torch_jax

A = torch.accelerator
MB100 = 25_000_000 * 4  # bytes of 25M float32


def _settle():
    torch_jax.mark_step()
    gc.collect()


def test_allocate_free_peak_reset(mode):
    _settle()
    before = A.memory_allocated()
    assert torch.jax.memory_allocated() == before
    x = torch.empty(25_000_000, device="jax")
    x.fill_(1)
    assert abs(A.memory_allocated() - before - MB100) <= MB100 // 100
    assert torch.jax.memory_allocated("jax:0") == A.memory_allocated(0)
    y = x * 2
    assert abs(A.memory_allocated() - before - 2 * MB100) <= MB100 // 100
    del y
    _settle()
    peak = A.max_memory_allocated()
    assert peak - before >= 2 * MB100
    assert abs(A.memory_allocated() - before - MB100) <= MB100 // 100
    del x
    _settle()
    assert abs(A.memory_allocated() - before) <= MB100 // 100
    assert A.max_memory_allocated() == peak  # the peak holds until reset
    A.reset_peak_memory_stats()
    assert A.max_memory_allocated() == A.memory_allocated()
    assert torch.jax.max_memory_allocated() == torch.jax.memory_allocated()


def test_a_fused_graph_s_temporaries_are_not_live_after_it(mode):
    x = torch.randn(1_000_000, device="jax")
    _settle()
    before = A.memory_allocated()
    A.reset_peak_memory_stats()
    total = ((x * 2).sin() + 1).exp().sum()  # three temporaries of 4 MB, one scalar
    assert total.item() > 0
    del total
    _settle()
    assert A.memory_allocated() == before
    # each temporary counted while its tensor lived: at most two at once (an op's input and output)
    assert 2 * 4_000_000 <= A.max_memory_allocated() - before <= 3 * 4_000_000 + 64


@pytest.mark.two_devices
def test_each_device_counts_its_own():
    _settle()
    before0, before1 = A.memory_allocated(0), A.memory_allocated(1)
    x = torch.ones(1_000_000, device="jax:1")
    assert A.memory_allocated(1) - before1 == 4_000_000
    assert A.memory_allocated(0) == before0
    assert torch.jax.memory_allocated(1) == A.memory_allocated("jax:1")
    y = x.to("jax:0")
    assert A.memory_allocated(0) - before0 == 4_000_000
    del x, y
    _settle()
    assert (A.memory_allocated(0), A.memory_allocated(1)) == (before0, before1)


def test_stats_summary_and_info():
    _settle()
    torch.jax.reset_accumulated_memory_stats()
    A.reset_peak_memory_stats()
    x = torch.zeros(1000, device="jax")
    views = (x[10:], x.view(10, 100), x.unsqueeze(0))  # (they share x's storage: one allocation)
    stats = A.memory_stats()
    assert stats == torch.jax.memory_stats()
    assert stats["allocated_bytes.all.current"] == A.memory_allocated()
    assert stats["allocated_bytes.all.peak"] == A.max_memory_allocated()
    assert stats["allocated_bytes.all.allocated"] == 4000 and stats["allocation.all.allocated"] == 1
    assert stats["active_bytes.all.current"] == stats["allocated_bytes.all.current"]
    assert stats["reserved_bytes.all.current"] >= 0 and stats["num_ooms"] == 0
    del x, views
    _settle()
    stats = torch.jax.memory_stats()
    assert stats["allocated_bytes.all.freed"] == 4000 and stats["allocation.all.freed"] == 1
    A.reset_accumulated_memory_stats()
    assert A.memory_stats()["allocation.all.allocated"] == 0
    free, total = A.get_memory_info()
    assert (free, total) == torch.jax.mem_get_info() or abs(free - torch.jax.mem_get_info()[0]) < total // 50
    assert 0 < free <= total and torch.jax.get_device_properties().total_memory == total
    summary = torch.jax.memory_summary()
    assert "Allocated memory" in summary and "Peak Usage" in summary
    assert A.memory_reserved() >= 0 and A.max_memory_reserved() >= A.memory_reserved()
