"""The device's time and memory in ``torch.profiler``.

NOTE [Device time in torch.profiler]: PyTorch fills the device columns of a profile
(``Self CUDA``, ``CUDA total``, their memory) from two C++ sources, a Kineto activity
profiler registered for the device or the ``ProfilerStubs`` of ``registerPrivateUse1Methods``,
and a memory event reported by the device's C++ allocator. None of them can be registered
from Python, and the kernels of a Python backend allocate no memory through c10. So while
a profile records, the runtime keeps its own log, and fills the profile's events from it
when PyTorch builds them:

- every computation it runs on a device (an op in strict mode, a fused graph, a
  ``torch.compile`` graph) is a *device range*, from its dispatch until its results are
  ready: the runtime waits for them while profiling (as ``CUDA_LAUNCH_BLOCKING=1`` does),
  so that the time is the computation's and not that of whatever waits next;
- each range becomes a kernel of the innermost op that ran it (``FunctionEvent.append_kernel``,
  what PyTorch does with a CUDA kernel), so the table's ``Self jax``/``jax total`` columns
  hold it; a fused or compiled graph also gets a row of its own (``jax::fused_graph (N ops)``,
  ``jax::jit_forward_<hash>``), inside the op that made it run;
- each storage allocated or freed (NOTE [Memory accounting] in tensor/_storage) adds its
  bytes to the ``jax Mem`` column of the ops around it (with ``profile_memory=True``);
- ``export_chrome_trace`` adds a process per device: a ``jax:N`` track of the device
  ranges and a counter of its allocated bytes, beside PyTorch's ``[memory]`` events.

A profile whose program ran nothing on the device is left as PyTorch made it.
"""

from __future__ import annotations

import bisect
import gzip
import json
import threading
import time

import jax
import torch
from torch.autograd.profiler_util import FunctionEvent

from torch_jax.device import _state as _devices
from torch_jax.tensor import _storage

recording = False  # read by the runtime's paths that run computations
_ranges: list = []  # (name, start ns, end ns, native thread id, device index)
_memory: list = []  # (time ns, native thread id, device index, bytes (negative: freed), allocated after)
_DEVICE_TYPE = int(torch._C._autograd.DeviceType.PrivateUse1)
_TRACK = 1 << 24  # (pid of device N's track in the Chrome trace: _TRACK + N)


def timed(name: str, index: int, fn, args):
    """``fn(*args)``, a computation on jax:index, logged as a device range."""
    start = time.time_ns()
    results = fn(*args)
    jax.block_until_ready(results)
    _ranges.append((name, start, time.time_ns(), threading.get_native_id(), index))
    return results


def graph(row: str, name: str, index: int, fn, args):
    """``timed`` for a whole graph, which also gets a row of its own in the profile."""
    with torch.profiler.record_function(row):
        return timed(name, index, fn, args)


def _on_memory(index: int, nbytes: int, usage) -> None:
    _memory.append((time.time_ns(), threading.get_native_id(), index, nbytes, usage.current))


def _start(prof) -> None:
    global recording
    _ranges.clear()
    _memory.clear()
    recording = True
    if prof.profile_memory:
        _storage._tracer = _on_memory


def _stop(prof) -> None:
    global recording
    recording = False
    _storage._tracer = None
    prof._jax_log = (_ranges[:], _memory[:])
    _ranges.clear()
    _memory.clear()


def _containing(events_by_thread, threads: dict, native: int, start_us: float, end_us: float):
    """The events around [start_us, end_us] on the host thread ``native``, innermost first.
    PyTorch numbers the threads it profiles in its own way, so a native thread's number is
    learnt from the first of its times that only one profiled thread's events hold."""
    if native in threads:
        return _around(*events_by_thread[threads[native]], start_us, end_us)
    found = {t: _around(*evs, start_us, end_us) for t, evs in events_by_thread.items()}
    found = {t: evs for t, evs in found.items() if evs}
    if len(found) != 1:
        return []
    ((thread, evs),) = found.items()
    threads[native] = thread
    return evs


def _around(starts, events, start_us: float, end_us: float) -> list:
    i = bisect.bisect_right(starts, start_us) - 1
    found = []
    while i >= 0:
        e = events[i]
        if e.time_range.end >= end_us:
            found.append(e)
        i -= 1
    return found


def _fill(prof, events, trace_start_ns: int) -> None:
    """Add the log's device ranges and allocations to PyTorch's events (NOTE [Device time
    in torch.profiler])."""
    ranges, memory = getattr(prof, "_jax_log", ((), ()))
    if not ranges and not memory:
        return
    if prof.use_device is None:  # (the profile did not name the device's activity: it ran on it)
        prof.use_device = torch._C._get_privateuse1_backend_name()
    by_thread: dict = {}
    for e in events:
        if not e.is_async and e.device_type == torch.autograd.DeviceType.CPU:
            by_thread.setdefault(e.thread, []).append(e)
            e.use_device = prof.use_device
    for thread, evs in by_thread.items():
        evs.sort(key=lambda e: e.time_range.start)
        by_thread[thread] = ([e.time_range.start for e in evs], evs)
    threads: dict = {}  # native thread id -> the profiler's
    next_id = max((e.id for e in events), default=0) + 1
    for name, start, end, thread, index in ranges:
        start_us, end_us = (start - trace_start_ns) / 1000, (end - trace_start_ns) / 1000
        around = _containing(by_thread, threads, thread, start_us, end_us)
        if around:
            around[0].append_kernel(name, index, end_us - start_us)
        # (and an event on the device, as Kineto makes for a CUDA kernel: the table's device
        # total is the sum of those)
        events.append(
            FunctionEvent(
                id=next_id,
                name=name,
                thread=index,
                start_us=start_us,
                end_us=end_us,
                input_shapes=[],
                stack=[],
                use_device=prof.use_device,
                device_type=torch.autograd.DeviceType.PrivateUse1,
                device_index=index,
                trace_name=name,
            )
        )
        next_id += 1
    for at, thread, _, nbytes, _ in memory:  # (all devices' bytes, as PyTorch sums CUDA's)
        at_us = (at - trace_start_ns) / 1000
        for e in _containing(by_thread, threads, thread, at_us, at_us):
            e.device_memory_usage += nbytes


def _trace_events(ranges, memory, base_ns: int, pid: int) -> list:
    """Chrome trace events for the log: a track and a memory counter per device."""
    out = []
    for index in sorted({r[4] for r in ranges} | {m[2] for m in memory}):
        track = _TRACK + index
        platform = jax.devices()[index].platform if index < len(jax.devices()) else "?"
        out.append({"ph": "M", "name": "process_name", "pid": track, "tid": 0, "args": {"name": f"jax:{index}"}})
        out.append({"ph": "M", "name": "process_labels", "pid": track, "tid": 0, "args": {"labels": platform}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": track, "tid": 0, "args": {"sort_index": track}})
        out.append({"ph": "M", "name": "thread_name", "pid": track, "tid": 0, "args": {"name": "computations"}})
    for name, start, end, thread, index in ranges:
        out.append(
            {
                "ph": "X",
                "cat": "jax",
                "name": name,
                "pid": _TRACK + index,
                "tid": 0,
                "ts": (start - base_ns) / 1000,
                "dur": (end - start) / 1000,
                "args": {"device": index, "host thread": thread},
            }
        )
    for at, thread, index, nbytes, current in memory:
        ts = (at - base_ns) / 1000
        out.append(
            {
                "ph": "i",
                "s": "t",
                "cat": "cpu_instant_event",
                "name": "[memory]",
                "pid": pid,
                "tid": thread,
                "ts": ts,
                "args": {
                    "Device Type": _DEVICE_TYPE,
                    "Device Id": index,
                    "Bytes": nbytes,
                    "Total Allocated": current,
                    "Total Reserved": current,
                },
            }
        )
        out.append({"ph": "C", "name": "allocated bytes", "pid": _TRACK + index, "ts": ts, "args": {"bytes": current}})
    return out


def _add_to_trace(prof, path: str) -> None:
    ranges, memory = getattr(prof, "_jax_log", ((), ()))
    if not ranges and not memory:
        return
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    base_ns = int(trace.get("baseTimeNanoseconds", 0))
    pid = next((e["pid"] for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"), 0)
    trace["traceEvents"].extend(_trace_events(ranges, memory, base_ns, pid))
    with opener(path, "wt") as f:
        json.dump(trace, f)


def install() -> None:
    """Wrap ``torch.autograd.profiler.profile`` (which ``torch.profiler.profile`` drives)
    so that its traces and events hold the device's log."""
    profile = torch.autograd.profiler.profile
    if getattr(profile, "_torch_jax", False):
        return
    start_trace, exit_, parse = profile._start_trace, profile.__exit__, profile._parse_kineto_results
    export = profile.export_chrome_trace

    def _start_trace(self):
        start_trace(self)
        _start(self)

    def __exit__(self, *exc):
        if self.enabled:
            _devices.synchronize()  # (what fused eager still holds runs inside the profile)
            _stop(self)
        return exit_(self, *exc)

    def _parse_kineto_results(self, result, *args, **kwargs):
        events = parse(self, result, *args, **kwargs)
        _fill(self, events, result.trace_start_ns())
        return events

    def export_chrome_trace(self, path, *args, **kwargs):
        out = export(self, path, *args, **kwargs)
        _add_to_trace(self, path)
        return out

    profile._start_trace = _start_trace
    profile.__exit__ = __exit__
    profile._parse_kineto_results = _parse_kineto_results
    profile.export_chrome_trace = export_chrome_trace
    profile._torch_jax = True
    global recording
    recording = torch.autograd.profiler._is_profiler_enabled  # (the device started inside a profile)
