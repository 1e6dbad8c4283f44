"""The warmup/measure loop. Each step is timed on its own and returned as raw samples.

The device-synchronisation rule lives here and only here: a host timer synchronises
the device before starting the clock and before reading it, because CUDA kernels run
asynchronously and an unsynchronised clock times only the kernel launches.

With `nvtx.enable()` the loop marks itself for Nsight Systems: a "warmup" range around
the warmup steps, each measured step in a "step" range, and the measured steps inside
`nvtx.capture()` (what `nsys --capture-range=cudaProfilerApi` records).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from cs336_systems import nvtx

TIMERS = ("host", "cuda-event")

Step = Callable[[], object]


class StepTimer(Protocol):
    def time_ms(self, step: Step) -> float:
        """Run `step` once and return its duration in milliseconds."""
        ...


def _no_sync() -> None:
    return None


def device_synchronizer(device: torch.device) -> Callable[[], None]:
    """The function that waits for all queued work on `device` (a no-op on CPU)."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return _no_sync


class HostTimer:
    """Host clock around the step, with the device synchronised on both sides."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter, synchronize: Callable[[], None] = _no_sync):
        self.clock = clock
        self.synchronize = synchronize

    def time_ms(self, step: Step) -> float:
        self.synchronize()
        start = self.clock()
        step()
        self.synchronize()
        return (self.clock() - start) * 1e3


class CudaEventTimer:
    """A CUDA event pair around the step: device time from the first to the last queued op.

    The end event is waited on after each step so per-step samples stay separate.
    """

    def __init__(self, event_factory: Callable[[], object] | None = None):
        self.event_factory = event_factory or (lambda: torch.cuda.Event(enable_timing=True))

    def time_ms(self, step: Step) -> float:
        start, end = self.event_factory(), self.event_factory()
        start.record()
        step()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))


class UntimedSetup:
    """A timer that runs `setup` (untimed) before each timed step.

    For a step that needs fresh state each time, e.g. a backward pass needs a forward
    pass first: `setup` runs the forward, the step the backward, and only the backward
    is timed (the inner timer synchronises before starting its clock).
    """

    def __init__(self, timer: StepTimer, setup: Callable[[], object]):
        self.timer, self.setup = timer, setup

    def time_ms(self, step: Step) -> float:
        self.setup()
        return self.timer.time_ms(step)


def make_timer(kind: str, device: torch.device, clock: Callable[[], float] = time.perf_counter) -> StepTimer:
    if kind == "host":
        return HostTimer(clock=clock, synchronize=device_synchronizer(device))
    if kind == "cuda-event":
        if device.type != "cuda":
            raise ValueError("--timer cuda-event needs a CUDA device")
        return CudaEventTimer()
    raise ValueError(f"unknown timer {kind!r}; choose one of {TIMERS}")


@dataclass(frozen=True)
class StepTimes:
    """Raw per-step durations. Warmup steps are kept for warmup studies, never summarised."""

    warmup_ms: tuple[float, ...]
    measured_ms: tuple[float, ...]


def time_steps(
    step: Step,
    *,
    warmup_steps: int,
    measure_steps: int,
    timer: StepTimer,
    during_measurement: contextlib.AbstractContextManager | None = None,
    budget_s: float | None = None,
    min_measure_steps: int = 3,
) -> StepTimes:
    """Warmup steps, then measured steps, each timed on its own.

    `during_measurement` is entered around the measured steps only (a memory-history
    recording, a profiler capture range).

    `budget_s` bounds slow configurations: warmup stops once its steps have taken that
    long (after at least one), and measurement stops once its steps have taken that long
    and at least `min_measure_steps` were measured. The budget counts timed step time
    only; how many steps ran is the length of the returned samples.
    """
    if warmup_steps < 0 or measure_steps < 1:
        raise ValueError(f"need warmup_steps >= 0 and measure_steps >= 1, got {warmup_steps}, {measure_steps}")

    def over_budget(samples: list[float], at_least: int) -> bool:
        return budget_s is not None and len(samples) >= at_least and sum(samples) >= budget_s * 1e3

    warmup: list[float] = []
    with nvtx.range("warmup"):
        for _ in range(warmup_steps):
            warmup.append(timer.time_ms(step))
            if over_budget(warmup, 1):
                break
    measured: list[float] = []
    with during_measurement or contextlib.nullcontext(), nvtx.capture("measured"):
        for _ in range(measure_steps):
            with nvtx.range("step"):
                measured.append(timer.time_ms(step))
            if over_budget(measured, min(min_measure_steps, measure_steps)):
                break
    return StepTimes(warmup_ms=tuple(warmup), measured_ms=tuple(measured))
