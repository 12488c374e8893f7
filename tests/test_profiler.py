"""The device's time and memory in torch.profiler (NOTE [Device time in torch.profiler] in
runtime/_profiler): each computation run on jax is a device event and a kernel of the op
(strict mode) or graph row (fused mode, torch.compile) that ran it; allocations fill the
device memory column; the Chrome trace gets a jax track. Checked as structure and counts;
how much of a step's time the rows hold is measured by benchmarks/profiler_attribution.py."""

from __future__ import annotations

import json

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]


def _program(x):
    return (x @ x).relu().sum()


def _device_events(prof):
    return [e for e in prof.events() if e.device_type == DeviceType.PrivateUse1]


def _cpu(prof, name):
    return [e for e in prof.events() if e.device_type == DeviceType.CPU and e.name == name]


def test_device_time_goes_to_the_op_or_graph_that_spent_it(mode):
    x = torch.randn(128, 128, device="jax")
    _program(x).item()  # (compiled before the profile)
    with profile(activities=ACTIVITIES) as prof:
        _program(x).item()
    device = _device_events(prof)
    table = prof.key_averages().table(sort_by="self_device_time_total")
    assert "Self JAX" in table
    if mode == "strict":
        assert sorted(e.name for e in device) == ["jit(aten::mm)", "jit(aten::relu)", "jit(aten::sum)"]
        for op in ("aten::mm", "aten::relu", "aten::sum"):
            (row,) = _cpu(prof, op)
            assert [k.name for k in row.kernels] == [f"jit({op})"]
            assert row.self_device_time_total == row.kernels[0].duration > 0
        assert "jit(aten::mm)" in table
    else:
        assert [e.name for e in device] == ["jit(fused graph of 3 ops)"]
        (row,) = _cpu(prof, "jax::fused_graph (3 ops)")
        assert [k.name for k in row.kernels] == ["jit(fused graph of 3 ops)"]
        assert not any(e.kernels for e in _cpu(prof, "aten::mm"))  # (recorded, not run)
    # the table's device total is the device events' time, each inside its host row
    assert sum(e.self_device_time_total for e in prof.key_averages() if e.device_type == DeviceType.PrivateUse1) == (
        pytest.approx(sum(e.time_range.elapsed_us() for e in device))
    )
    for e in device:
        (owner,) = [c for c in prof.events() if any(k.name == e.name for k in c.kernels)]
        assert owner.time_range.start <= e.time_range.start <= e.time_range.end <= owner.time_range.end


def test_a_compiled_graph_has_its_row():
    f = torch.compile(lambda x: (x @ x).relu().sum(), backend="jax")
    x = torch.randn(64, 64, device="jax")
    f(x).item()
    with profile(activities=ACTIVITIES) as prof:
        f(x).item()
    (row,) = [e for e in prof.events() if e.name.startswith("jax::inference_")]  # (no gradient: AOT's inference graph)
    # (the kernel has the XLA module's name, which JAX's own profiler shows)
    assert [k.name for k in row.kernels] == ["jit_" + row.name[len("jax::") :]] and row.self_device_time_total > 0


def test_allocations_fill_the_device_memory_column(mode):
    with profile(activities=ACTIVITIES, profile_memory=True) as prof:
        x = torch.ones(1_000_000, device="jax")
        y = x * 2
        del x, y
    for op in ("aten::ones", "aten::mul"):  # (the ops called, not those their kernels call)
        assert [e.device_memory_usage for e in _cpu(prof, op) if e.cpu_parent is None] == [4_000_000]
    assert "JAX Mem" in prof.key_averages().table()


def test_the_chrome_trace_has_a_jax_track(tmp_path, mode):
    x = torch.randn(64, 64, device="jax")
    _program(x).item()
    with profile(activities=ACTIVITIES, profile_memory=True) as prof:
        _program(x).item()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    tracks = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    device = [e for e in events if e.get("cat") == "jax"]
    assert device and {tracks[e["pid"]] for e in device} == {"jax:0"}
    host = {e["name"]: e for e in events if e.get("cat") in ("cpu_op", "user_annotation")}
    for e in device:  # each range lies inside the host row that ran it, on the trace's clock
        owner = (
            host["aten::" + e["name"][len("jit(aten::") : -1]] if mode == "strict" else host["jax::fused_graph (3 ops)"]
        )
        assert owner["ts"] <= e["ts"] and e["ts"] + e["dur"] <= owner["ts"] + owner["dur"] + 1
    memory = [e for e in events if e.get("name") == "[memory]" and e["args"]["Device Type"] == 20]
    assert memory and all(e["args"]["Device Id"] == 0 for e in memory)


def test_a_profile_without_the_device_is_left_as_it_was():
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.ones(8).add(1)
    assert prof.profiler.use_device is None and not _device_events(prof)
    assert "JAX" not in prof.key_averages().table()
