"""One extra step under torch.profiler, after the measured ones: what the device did in it.

    kernels_per_step  device events in the step (CUDA kernels, memcpys, memsets); on a CPU,
                      the operators the step dispatched (aten ops and autograd nodes, nested
                      ones included), the CPU's analogue of launches
    device_busy_pct   100 * |union of the kernel intervals| / step wall time: the share of
                      the step in which the GPU ran anything (at most 100). None on a CPU
    top_kernels       the kernels (CPU: ops by self time) that took longest, summed by name

The wall time is the measured steps' median when the caller passes it (`step_ms`): the
profiler slows the host (it records every launch), so the profiled step's own wall time
would understate how busy the device is in an unprofiled step. Intervals are unioned
because kernels on different streams may overlap; a sum would count that time twice.
The profiled step runs outside the timed ones, so its cost never reaches a timing sample.

Only kernels, memcpys and memsets count. Recent PyTorch also reports each `record_function`
range that launched kernels (`Optimizer.step#AdamW.step`, `Torch-Compiled Region`, DDP's
ranges) as a CUDA-typed *user annotation* spanning its first to last kernel, gaps included:
counting those would read "GPU busy ~100%" for a host-bound step, so they are dropped, as
are events with no real timestamps (CUPTI 13.0 can emit zeros) and any part of a kernel
outside the profiled window (the step and its final synchronize).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

TOP_KERNELS = 10
WINDOW = "cs336_systems: profiled step"  # the range around the step and its synchronize


@dataclass(frozen=True)
class StepProfile:
    kernels_per_step: int | None  # None: a CUDA profile that recorded no kernels
    device_busy_ms: float | None
    device_busy_pct: float | None
    profiled_step_ms: float
    top_kernels: tuple[dict, ...]  # {"name", "calls", "total_ms"}, longest first


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by the intervals (overlaps counted once)."""
    total, covered_to = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= covered_to:
            continue
        total += end - max(start, covered_to)
        covered_to = end
    return total


def _top(durations: Iterable[tuple[str, float]], top: int) -> tuple[dict, ...]:
    by_name: dict[str, list] = {}
    for name, us in durations:
        entry = by_name.setdefault(name, [0, 0.0])
        entry[0] += 1
        entry[1] += us
    ranked = sorted(by_name.items(), key=lambda item: item[1][1], reverse=True)[:top]
    return tuple({"name": name, "calls": calls, "total_ms": us / 1e3} for name, (calls, us) in ranked)


def _window(events: Sequence) -> tuple[float, float]:
    """The profiled window in the profiler's clock (WINDOW's host range), else unbounded."""
    for e in events:
        if e.name == WINDOW and e.device_type == DeviceType.CPU:
            return e.time_range.start, e.time_range.end
    return float("-inf"), float("inf")


def device_kernels(events: Sequence) -> list[tuple[str, float, float]]:
    """(name, start_us, end_us) of the device's kernels, memcpys and memsets, clipped to the
    profiled window; user annotations and events without real timestamps are left out."""
    low, high = _window(events)
    kernels = []
    for e in events:
        if e.device_type != DeviceType.CUDA or e.is_user_annotation:
            continue
        start, end = e.time_range.start, e.time_range.end
        if start <= 0 or end < start:
            continue
        start, end = max(start, low), min(end, high)
        if end >= start:
            kernels.append((e.name, start, end))
    return kernels


def summarize_events(
    events: Sequence, device_type: str, step_ms: float, profiled_step_ms: float | None = None, top: int = TOP_KERNELS
) -> StepProfile:
    """A StepProfile from torch.profiler FunctionEvents (anything with name, device_type,
    time_range.start/end in microseconds, is_user_annotation, self_cpu_time_total)."""
    if device_type == "cuda":
        kernels = device_kernels(events)
        if not kernels:  # every CUDA step launches kernels: the profiler could not see them (no CUPTI)
            return StepProfile(None, None, None, profiled_step_ms or step_ms, ())
        busy_ms = union_length((start, end) for _, start, end in kernels) / 1e3
        durations = ((name, end - start) for name, start, end in kernels)
        # the profiled step runs slower than the median it is divided by; busy cannot exceed the step
        busy_pct = min(100.0, 100.0 * busy_ms / step_ms) if step_ms > 0 else None
    else:
        kernels = [
            e for e in events if e.device_type == DeviceType.CPU and not e.is_user_annotation and e.name != WINDOW
        ]
        busy_ms = busy_pct = None
        durations = ((e.name, e.self_cpu_time_total) for e in kernels)
    return StepProfile(
        kernels_per_step=len(kernels),
        device_busy_ms=busy_ms,
        device_busy_pct=busy_pct,
        profiled_step_ms=step_ms if profiled_step_ms is None else profiled_step_ms,
        top_kernels=_top(durations, top),
    )


KINETO_LINE_PREFIXES = ("USDT:", "STAGE:")  # Kineto's C++ progress lines at profiler start and stop


@contextlib.contextmanager
def kineto_lines_dropped() -> Iterator[None]:
    """Kineto writes `USDT: ... profiler_start` lines straight to file descriptor 2 whatever
    KINETO_LOG_LEVEL says: send fd 2 to a file for the duration, then pass on every other line."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [
                line
                for line in captured.read().decode(errors="replace").splitlines(keepends=True)
                if not line.startswith(KINETO_LINE_PREFIXES)
            ]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def profile_step(
    step: Callable[[], object],
    device: torch.device,
    synchronize: Callable[[], None],
    step_ms: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
    top: int = TOP_KERNELS,
) -> StepProfile:
    """Run `step` once under torch.profiler (device drained before and after) and summarise it."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    synchronize()
    profiler = profile(activities=activities)
    with kineto_lines_dropped():
        profiler.start()
    try:
        start = clock()
        with record_function(WINDOW):
            step()
            synchronize()
        profiled_ms = (clock() - start) * 1e3
    finally:
        with kineto_lines_dropped():
            profiler.stop()
    return summarize_events(
        profiler.events(), device.type, step_ms if step_ms is not None else profiled_ms, profiled_ms, top
    )
