"""A few extra steps under torch.profiler, after the measured ones: what the device did in them.

    kernels_per_step  device events in a step (CUDA kernels, memcpys, memsets); on a CPU, the
                      operators the step dispatched (aten ops and autograd nodes, nested ones
                      included), the CPU's analogue of launches
    device_busy_pct   100 * |union of the kernel intervals| / step wall time: the share of
                      the step in which the GPU ran anything (at most 100). None on a CPU
    top_kernels       the kernels (CPU: ops by self time) that took longest, summed by name
    families          the matrix multiplies (mm, bmm, addmm, linear, matmul, einsum's lowering,
                      GEMM kernels) counted together, softmax (the fused op, or on a CPU the ops
                      run inside a Python function named softmax: a student's own exp/max/sum/div),
                      and on a CPU the matrix multiplies run inside an attention function. Those
                      functions are found by a profile hook that puts each call in a range of its
                      name (FUNCTION): the profiler's own Python tracer (with_stack) keeps pointers
                      to code objects that can be freed meanwhile, and then reads garbage names

Each figure is the median over PROFILED_STEPS steps, and each operator is ranked by its median; an
operator that is not longer than the next in every profiled step is not ahead of it (`ahead_of_next`
False): a preempted step, or a few microseconds apart, ranks nothing.

The wall time is the measured steps' median when the caller passes it (`step_ms`): the
profiler slows the host (it records every launch), so the profiled step's own wall time
would understate how busy the device is in an unprofiled step. Intervals are unioned
because kernels on different streams may overlap; a sum would count that time twice.
The profiled steps run outside the timed ones, so their cost never reaches a timing sample.

Only kernels, memcpys and memsets count. Recent PyTorch also reports each `record_function`
range that launched kernels (`Optimizer.step#AdamW.step`, `Torch-Compiled Region`, DDP's
ranges) as a CUDA-typed *user annotation* spanning its first to last kernel, gaps included:
counting those would read "GPU busy ~100%" for a host-bound step, so they are dropped, as
are events with no real timestamps (CUPTI 13.0 can emit zeros) and any part of a kernel
outside its profiled window (the step and its final synchronize).
"""

from __future__ import annotations

import contextlib
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch.autograd import DeviceType

TOP_KERNELS = 10
PROFILED_STEPS = 3
WINDOW = "cs336_systems: profiled step"  # the range around each step and its synchronize
FUNCTION, SCOPED = "function ", re.compile(r"softmax|attention")  # ranges around calls of the functions named so
MATMUL = re.compile(
    r"(?:^|::|_)(?:mm|bmm|addmm|baddbmm|addbmm|matmul|linear|einsum)(?:$|_|backward)|gemm|gemv|cutlass|xmma"
)
SOFTMAX, LOG_SOFTMAX = re.compile(r"softmax"), re.compile(r"log_?softmax")  # names are lowered first


@dataclass(frozen=True)
class StepProfile:
    kernels_per_step: int | None  # None: a CUDA profile that recorded no kernels
    device_busy_ms: float | None
    device_busy_pct: float | None
    profiled_step_ms: float
    top_kernels: tuple[dict, ...]  # {"name", "calls", "total_ms", "share_pct", "step_ms", "ahead_of_next"}
    families: tuple[dict, ...] = ()  # {"family", "total_ms", "share_pct", "step_ms", "operators"}


@dataclass
class _Step:
    """One profiled step: its kernels (CPU: operators), their time by name and by family, microseconds."""

    kernels: int = 0
    busy_us: float | None = None
    by_name: dict[str, list] = field(default_factory=dict)  # name -> [calls, us]
    by_family: dict[str, list] = field(default_factory=dict)  # family -> [us, {names}]

    def add(self, name: str, us: float, families: Iterable[str]) -> None:
        self.kernels += 1
        entry = self.by_name.setdefault(name, [0, 0.0])
        entry[0] += 1
        entry[1] += us
        for family in families:
            total = self.by_family.setdefault(family, [0.0, set()])
            total[0] += us
            total[1].add(name)

    @property
    def total_us(self) -> float:
        return sum(us for _, us in self.by_name.values())


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by the intervals (overlaps counted once)."""
    total, covered_to = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= covered_to:
            continue
        total += end - max(start, covered_to)
        covered_to = end
    return total


def families_of(event) -> list[str]:
    """The families an operator or kernel counts in: its own name's (matmul, softmax), and on a CPU the
    Python functions it ran inside (a student's softmax made of exp, max, sum and div; the matrix
    multiplies of an attention function)."""
    name = event.name.lower()
    found = []
    if MATMUL.search(name):
        found.append("matmul")
    if _softmax(name):
        found.append("softmax")
    parent = getattr(event, "cpu_parent", None)
    while parent is not None:
        if parent.name.startswith(FUNCTION):
            function = parent.name.removeprefix(FUNCTION).lower()
            if _softmax(function) and "softmax" not in found:
                found.append("softmax")
            if "attention" in function and "matmul" in found and "attention_matmul" not in found:
                found.append("attention_matmul")
        parent = parent.cpu_parent
    return found


def _softmax(name: str) -> bool:
    return bool(SOFTMAX.search(name)) and not LOG_SOFTMAX.search(name)


def _windows(events: Sequence) -> list[tuple[float, float]]:
    """Each profiled step's window in the profiler's clock (WINDOW's host ranges), else one unbounded."""
    found = sorted(
        (e.time_range.start, e.time_range.end) for e in events if e.name == WINDOW and e.device_type == DeviceType.CPU
    )
    return found or [(float("-inf"), float("inf"))]


def device_kernels(events: Sequence, window: tuple[float, float] | None = None) -> list[tuple[str, float, float]]:
    """(name, start_us, end_us) of the device's kernels, memcpys and memsets, clipped to the profiled
    window (the first); user annotations and events without real timestamps are left out."""
    low, high = window or _windows(events)[0]
    kernels = []
    for e in events:
        if e.device_type != DeviceType.CUDA or e.is_user_annotation:
            continue
        start, end = e.time_range.start, e.time_range.end
        if start <= 0 or end < start or end < low or start > high:
            continue
        start, end = max(start, low), min(end, high)
        if end >= start:
            kernels.append((e.name, start, end))
    return kernels


def _one_step(events: Sequence, device_type: str, window: tuple[float, float]) -> _Step:
    step = _Step()
    if device_type == "cuda":
        kernels = device_kernels(events, window)
        for name, start, end in kernels:
            step.add(name, end - start, families_of(_Named(name)))
        step.busy_us = union_length((start, end) for _, start, end in kernels) if kernels else None
        return step
    for e in events:
        if e.device_type != DeviceType.CPU or e.is_user_annotation or e.name.startswith(FUNCTION):
            continue
        if e.name != WINDOW and window[0] <= e.time_range.start <= window[1]:
            step.add(e.name, e.self_cpu_time_total, families_of(e))
    return step


@dataclass(frozen=True)
class _Named:
    name: str


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def _ranked(steps: list[_Step], top: int) -> tuple[dict, ...]:
    """The `top` operators by their median time over the steps (0 in a step without them), each with
    whether it was longer than the next-ranked one in every step."""
    names = dict.fromkeys(name for step in steps for name in step.by_name)
    ms = {name: [step.by_name.get(name, [0, 0.0])[1] / 1e3 for step in steps] for name in names}
    totals = [step.total_us / 1e3 for step in steps]
    ranked = sorted(names, key=lambda name: -_median(ms[name]))[: top + 1]
    entries = []
    for index, name in enumerate(ranked[:top]):
        after = ms[ranked[index + 1]] if index + 1 < len(ranked) else None
        entries.append(
            {
                "name": name,
                "calls": round(_median([step.by_name.get(name, [0, 0.0])[0] for step in steps])),
                "total_ms": _median(ms[name]),
                "share_pct": _median([100 * a / t for a, t in zip(ms[name], totals, strict=True) if t]),
                "step_ms": ms[name],
                "ahead_of_next": after is None or all(a > b for a, b in zip(ms[name], after, strict=True)),
            }
        )
    return tuple(entries)


def _families(steps: list[_Step]) -> tuple[dict, ...]:
    found = []
    for family in dict.fromkeys(f for step in steps for f in step.by_family):
        ms = [step.by_family.get(family, [0.0, set()])[0] / 1e3 for step in steps]
        shares = [100 * m / (step.total_us / 1e3) for m, step in zip(ms, steps, strict=True) if step.total_us]
        names = sorted(set().union(*(step.by_family.get(family, [0.0, set()])[1] for step in steps)))
        found.append(
            {"family": family, "total_ms": _median(ms), "share_pct": _median(shares), "step_ms": ms, "operators": names}
        )
    return tuple(found)


def summarize_events(
    events: Sequence, device_type: str, step_ms: float, profiled_step_ms: float | None = None, top: int = TOP_KERNELS
) -> StepProfile:
    """A StepProfile from torch.profiler FunctionEvents (anything with name, device_type,
    time_range.start/end in microseconds, is_user_annotation, self_cpu_time_total), one step per
    WINDOW range among them (all of them one step where there is none)."""
    steps = [_one_step(events, device_type, window) for window in _windows(events)]
    if device_type == "cuda" and not any(step.kernels for step in steps):
        # every CUDA step launches kernels: the profiler could not see them (no CUPTI)
        return StepProfile(None, None, None, profiled_step_ms or step_ms, ())
    busy_ms = busy_pct = None
    if device_type == "cuda":
        busy_ms = _median([(step.busy_us or 0.0) / 1e3 for step in steps])
        # the profiled step runs slower than the median it is divided by; busy cannot exceed the step
        busy_pct = min(100.0, 100.0 * busy_ms / step_ms) if step_ms > 0 else None
    return StepProfile(
        kernels_per_step=round(_median([step.kernels for step in steps])),
        device_busy_ms=busy_ms,
        device_busy_pct=busy_pct,
        profiled_step_ms=step_ms if profiled_step_ms is None else profiled_step_ms,
        top_kernels=_ranked(steps, top),
        families=_families(steps),
    )


@contextlib.contextmanager
def function_ranges() -> Iterator[None]:
    """Each call of a Python function whose name SCOPED finds runs inside a profiler range named FUNCTION +
    its name, so an operator's parents say which of them it ran in (a student's softmax, their attention)."""
    opened: dict[int, object] = {}

    def hook(frame, event: str, arg) -> None:
        if event == "call" and SCOPED.search(frame.f_code.co_name.lower()):
            from torch.profiler import record_function

            opened[id(frame)] = scope = record_function(FUNCTION + frame.f_code.co_name)
            scope.__enter__()
        elif event == "return" and id(frame) in opened:
            opened.pop(id(frame)).__exit__(None, None, None)

    previous = sys.getprofile()
    sys.setprofile(hook)
    try:
        yield
    finally:
        sys.setprofile(previous)
        for scope in reversed(list(opened.values())):  # a step that raised inside one
            scope.__exit__(None, None, None)


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
    steps: int = PROFILED_STEPS,
) -> StepProfile:
    """Run `step` `steps` times under one torch.profiler session, each in a WINDOW range drained before
    and after (on a CPU in function_ranges: the families need the functions an op ran in), and summarise."""
    from torch.profiler import ProfilerActivity, profile, record_function  # imports torch._inductor: a second

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    synchronize()
    profiler = profile(activities=activities)
    with kineto_lines_dropped():
        profiler.start()
    profiled = []
    try:
        for _ in range(steps):
            start = clock()
            with record_function(WINDOW), function_ranges() if device.type == "cpu" else contextlib.nullcontext():
                step()
                synchronize()
            profiled.append((clock() - start) * 1e3)
    finally:
        with kineto_lines_dropped():
            profiler.stop()
    profiled_ms = _median(profiled)
    return summarize_events(
        profiler.events(), device.type, step_ms if step_ms is not None else profiled_ms, profiled_ms, top
    )
