"""A few extra steps under torch.profiler, after the measured ones: what the device did in them.

    kernels_per_step  device events in a step (CUDA kernels, memcpys, memsets); on a CPU, the
                      operators the step dispatched (aten ops and autograd nodes, nested ones)
    device_busy_pct   100 * |union of the kernel intervals| / step wall time (None on a CPU)
    top_kernels       the kernels (CPU: ops by self time) that took longest, summed by name
    families          matrix multiplies (MATMUL) together; softmax, fused or (CPU) what ran inside a
                      Python function named softmax; (CPU) the matmuls inside an attention function

Each is the median over PROFILED_STEPS steps; an operator not longer than the next in every step
is not `ahead_of_next` (a preempted step ranks nothing). The wall time is the measured steps'
median when the caller passes it (`step_ms`): the profiler slows the host. Intervals are unioned:
kernels on different streams overlap. Only kernels, memcpys and memsets count: recent PyTorch
reports each `record_function` range that launched kernels as a CUDA *user annotation* spanning
first to last kernel, gaps included ("GPU busy ~100%" for a host-bound step), and CUPTI 13.0 can
emit zero timestamps; a kernel counts only inside its step's window (the step and its synchronize).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import pandas as pd
import torch
from torch.autograd import DeviceType

TOP_KERNELS = 10
PROFILED_STEPS = 3
WINDOW = "cs336_systems: profiled step"  # the range around each step and its synchronize
FUNCTION, SCOPED = "function ", re.compile(r"softmax|attention")  # ranges around calls of the functions named so
MATMUL = re.compile(r"(^|::|_)(mm|bmm|addmm|baddbmm|addbmm|matmul|linear|einsum)($|_|backward)|gemm|gemv|cutlass|xmma")
SOFTMAX = re.compile(r"^(?!.*log_?softmax).*softmax")  # names are lowered first; log_softmax is cross-entropy's


@dataclass(frozen=True)
class StepProfile:
    kernels_per_step: int | None  # None: a CUDA profile that recorded no kernels
    device_busy_ms: float | None
    device_busy_pct: float | None
    profiled_step_ms: float
    top_kernels: tuple[dict, ...]  # {"name", "calls", "total_ms", "share_pct", "step_ms", "ahead_of_next"}
    families: tuple[dict, ...] = ()  # {"family", "total_ms", "share_pct", "step_ms", "operators"}


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by the intervals (overlaps counted once)."""
    total, covered_to = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= covered_to:
            continue
        total += end - max(start, covered_to)
        covered_to = end
    return total


def families_of(name: str, parent=None) -> list[str]:
    """The families an operator or kernel counts in: its name's, and on a CPU the functions it ran in."""
    found = [family for family, pattern in (("matmul", MATMUL), ("softmax", SOFTMAX)) if pattern.search(name.lower())]
    while parent is not None:
        function = parent.name.removeprefix(FUNCTION).lower() if parent.name.startswith(FUNCTION) else ""
        if SOFTMAX.search(function):
            found.append("softmax")
        if "attention" in function and "matmul" in found:
            found.append("attention_matmul")
        parent = parent.cpu_parent
    return list(dict.fromkeys(found))


def _windows(events: Sequence) -> list[tuple[float, float]]:
    """Each profiled step's window in the profiler's clock (WINDOW's host ranges), else one unbounded."""
    found = [
        (e.time_range.start, e.time_range.end) for e in events if e.name == WINDOW and e.device_type == DeviceType.CPU
    ]
    return sorted(found) or [(float("-inf"), float("inf"))]


def device_kernels(events: Sequence, window: tuple[float, float] | None = None) -> list[tuple[str, float, float]]:
    """(name, start_us, end_us) of the device's kernels, memcpys and memsets, clipped to the profiled
    window (the first); user annotations and events without real timestamps are left out."""
    low, high = window or _windows(events)[0]
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


def _operators(events: Sequence, device_type: str, windows: list[tuple[float, float]]) -> pd.DataFrame:
    """One row per kernel (CPU: operator, by self time) of each profiled step: step, name, us, start, end, families."""
    rows = []
    for step, window in enumerate(windows):
        if device_type == "cuda":
            rows += [(step, n, b - a, a, b, families_of(n)) for n, a, b in device_kernels(events, window)]
            continue
        for e in events:
            own = e.device_type == DeviceType.CPU and not e.is_user_annotation and not e.name.startswith(FUNCTION)
            if own and e.name != WINDOW and window[0] <= e.time_range.start <= window[1]:
                rows.append((step, e.name, e.self_cpu_time_total, 0.0, 0.0, families_of(e.name, e.cpu_parent)))
    return pd.DataFrame(rows, columns=["step", "name", "us", "start", "end", "families"])


def _summary(ops: pd.DataFrame, steps: int, top: int) -> tuple[tuple[dict, ...], tuple[dict, ...]]:
    """The `top` operators by their median ms over the steps (0 in a step without them), whether each was
    longer than the next in every step, and each family's median ms, share and operators."""
    table = ops.pivot_table(index="name", columns="step", values="us", aggfunc=["sum", "count"], fill_value=0)
    ms, calls = (table[kind].reindex(columns=range(steps), fill_value=0) for kind in ("sum", "count"))
    ms, totals = ms / 1e3, ms.sum() / 1e3
    ranked = ms.median(axis=1).sort_values(ascending=False, kind="stable").index[: top + 1]

    def timed(times: pd.Series) -> dict:
        return {"total_ms": times.median(), "share_pct": (100 * times / totals).median(), "step_ms": times.tolist()}

    kernels = tuple(
        {"name": name, "calls": round(calls.loc[name].median()), **timed(ms.loc[name])}
        | {"ahead_of_next": name == ranked[-1] or bool((ms.loc[name] > ms.loc[ranked[i + 1]]).all())}
        for i, name in enumerate(ranked[:top])
    )
    families = ops.explode("families").dropna(subset="families").groupby("families", sort=False)
    return kernels, tuple(
        {"family": family, **timed((rows.groupby("step")["us"].sum() / 1e3).reindex(range(steps), fill_value=0))}
        | {"operators": sorted(rows["name"].unique())}
        for family, rows in families
    )


def summarize_events(
    events: Sequence, device_type: str, step_ms: float, profiled_step_ms: float | None = None, top: int = TOP_KERNELS
) -> StepProfile:
    """A StepProfile from torch.profiler FunctionEvents (anything with name, device_type,
    time_range.start/end in microseconds, is_user_annotation, self_cpu_time_total), one step per
    WINDOW range among them (all of them one step where there is none)."""
    windows = _windows(events)
    ops = _operators(events, device_type, windows)
    if device_type == "cuda" and ops.empty:  # every CUDA step launches kernels: the profiler could not see them
        return StepProfile(None, None, None, profiled_step_ms or step_ms, ())
    per_step = ops.groupby("step")
    busy_ms = busy_pct = None
    if device_type == "cuda":
        spans = per_step.apply(lambda rows: union_length(zip(rows["start"], rows["end"], strict=True)) / 1e3)
        busy_ms = spans.reindex(range(len(windows)), fill_value=0).median()
        # the profiled step runs slower than the median it is divided by; busy cannot exceed the step
        busy_pct = min(100.0, 100.0 * busy_ms / step_ms) if step_ms > 0 else None
    kernels, families = _summary(ops, len(windows), top) if not ops.empty else ((), ())
    return StepProfile(
        kernels_per_step=round(per_step.size().reindex(range(len(windows)), fill_value=0).median()),
        device_busy_ms=busy_ms,
        device_busy_pct=busy_pct,
        profiled_step_ms=step_ms if profiled_step_ms is None else profiled_step_ms,
        top_kernels=kernels,
        families=families,
    )


@contextlib.contextmanager
def function_ranges() -> Iterator[None]:
    """Each call of a Python function whose name SCOPED finds runs in a profiler range FUNCTION + its name."""
    from torch.profiler import record_function

    opened: dict[int, record_function] = {}

    def hook(frame, event: str, arg) -> None:
        if event == "call" and SCOPED.search(frame.f_code.co_name.lower()):
            opened[id(frame)] = record_function(FUNCTION + frame.f_code.co_name).__enter__()
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
    profiled_ms = sorted(profiled)[len(profiled) // 2]
    return summarize_events(
        profiler.events(), device.type, step_ms if step_ms is not None else profiled_ms, profiled_ms, top
    )
