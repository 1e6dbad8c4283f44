"""The warmup/measure loop. Each step is timed on its own and returned as raw samples.

The device-synchronisation rule lives here and only here: a host timer synchronises
the device before starting the clock and before reading it, because CUDA kernels run
asynchronously and an unsynchronised clock times only the kernel launches.

With `nvtx.enable()` the loop marks itself for Nsight Systems: a "warmup" range around
the warmup steps, each measured step in a "step" range, and the measured steps inside
`nvtx.capture()` (what `nsys --capture-range=cudaProfilerApi` records).

Per-phase time comes from the same measured steps: the step calls `phases.phase(name)`
around its forward, backward and optimizer parts (runner's `phase` callback). On a CPU
the boundaries are host-clock reads; on CUDA they are event pairs, queued with the work
and resolved only after the last measured step, so timing the phases adds no
synchronisation to any step. A phase is the time from its start to its end; what lies
between phases (zero_grad, Python glue) is the step minus the phases' sum.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from . import nvtx
from .argtypes import TIMERS, add_timer_argument  # noqa: F401  (timing's names, read by the flags torch-free)
from .stats import summarize

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


class DoBenchTimer:
    """`triton.testing.do_bench` around the step, as CS336 ranks the fastest training step.

    do_bench runs the step itself: a few calls to estimate its length, then its own warmup and
    repetitions (25 ms and 100 ms of them by default, at least one each), clearing the L2 cache
    before each; it returns their mean. One sample of `time_steps` is one do_bench call.
    """

    def __init__(self, do_bench: Callable[..., float]):
        self.do_bench = do_bench

    def time_ms(self, step: Step) -> float:
        return float(self.do_bench(step))


def triton_do_bench() -> Callable | None:
    """`triton.testing.do_bench`, or None where Triton is not importable."""
    try:
        from triton.testing import do_bench
    except Exception:  # not installed, or installed without a usable backend
        return None
    return do_bench


def timer_unsupported_reason(kind: str, device: torch.device, do_bench: Callable | None = None) -> str | None:
    """Why `kind` cannot time steps on `device` (one line), or None. `do_bench` stands in for Triton's."""
    if kind == "cuda-event" and device.type != "cuda":
        return "--timer cuda-event needs a CUDA device"
    if kind == "do-bench":
        if device.type != "cuda":
            return "--timer do-bench needs a CUDA device (triton.testing.do_bench times GPU work)"
        if (do_bench or triton_do_bench()) is None:
            return "--timer do-bench needs Triton (triton.testing.do_bench), which is not importable here"
    return None


def make_timer(
    kind: str,
    device: torch.device,
    clock: Callable[[], float] = time.perf_counter,
    do_bench: Callable[..., float] | None = None,
) -> StepTimer:
    reason = timer_unsupported_reason(kind, device, do_bench)
    if reason is not None:
        raise ValueError(reason)
    if kind == "host":
        return HostTimer(clock=clock, synchronize=device_synchronizer(device))
    if kind == "cuda-event":
        return CudaEventTimer()
    if kind == "do-bench":
        return DoBenchTimer(do_bench or triton_do_bench())
    raise ValueError(f"unknown timer {kind!r}; choose one of {TIMERS}")


class _Mark:
    """Calls `enter()` and `exit()` around a `with` body (also when it raises)."""

    __slots__ = ("begin", "finish")

    def __init__(self, begin: Callable[[], object], finish: Callable[[], object]):
        self.begin, self.finish = begin, finish

    def __enter__(self) -> None:
        self.begin()

    def __exit__(self, *exc_info) -> bool:
        self.finish()
        return False


_OFF = contextlib.nullcontext()


class _StepPhases:
    """Per-step phase lists: `start_step()` opens one, `end_step()` files it; outside a step
    `_current` is None and `phase` is a no-op."""

    def __init__(self) -> None:
        self._steps: list[list[tuple]] = []
        self._current: list[tuple] | None = None

    def start_step(self) -> None:
        self._current = []

    def end_step(self) -> None:
        self._steps.append(self._current or [])
        self._current = None


class HostPhases(_StepPhases):
    """Phase boundaries read from the host clock: right on a CPU, where the device is the host.

    Only steps between `start_step()` and `end_step()` are recorded; elsewhere (warmup,
    untimed steps) `phase` is a shared no-op.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        super().__init__()
        self.clock = clock

    def phase(self, name: str) -> contextlib.AbstractContextManager:
        current = self._current
        if current is None:
            return _OFF
        start = [0.0]

        def begin() -> None:
            start[0] = self.clock()

        def finish() -> None:
            current.append((name, start[0], self.clock()))

        return _Mark(begin, finish)

    def resolve(self) -> list[dict[str, float]]:
        """Milliseconds per phase name, one dict per recorded step (a repeated phase adds up)."""
        return [_add_up((name, (end - start) * 1e3) for name, start, end in step) for step in self._steps]


class CudaEventPhases(_StepPhases):
    """Phase boundaries as CUDA event pairs, recorded into the stream with the work.

    Recording an event does not wait for the device; `resolve` waits once, on the last
    event, after the measured steps, then reads every pair's elapsed time.
    """

    def __init__(self, event_factory: Callable[[], object] | None = None):
        super().__init__()
        self.event_factory = event_factory or (lambda: torch.cuda.Event(enable_timing=True))

    def phase(self, name: str) -> contextlib.AbstractContextManager:
        current = self._current
        if current is None:
            return _OFF
        start, end = self.event_factory(), self.event_factory()
        return _Mark(start.record, lambda: (end.record(), current.append((name, start, end))))

    def resolve(self) -> list[dict[str, float]]:
        pairs = [pair for step in self._steps for pair in step]
        if pairs:
            pairs[-1][2].synchronize()  # events complete in stream order: the last one done means all are
        return [_add_up((name, float(start.elapsed_time(end))) for name, start, end in step) for step in self._steps]


def _add_up(items) -> dict[str, float]:
    totals: dict[str, float] = {}
    for name, ms in items:
        totals[name] = totals.get(name, 0.0) + ms
    return totals


class PhaseRecorder(Protocol):
    def start_step(self) -> None: ...
    def end_step(self) -> None: ...
    def phase(self, name: str) -> contextlib.AbstractContextManager: ...
    def resolve(self) -> list[dict[str, float]]: ...


def make_phase_recorder(device: torch.device, clock: Callable[[], float] = time.perf_counter) -> PhaseRecorder:
    """CUDA event pairs on a GPU (no added synchronisation), the host clock elsewhere."""
    return CudaEventPhases() if device.type == "cuda" else HostPhases(clock)


@dataclass(frozen=True)
class StepTimes:
    """Raw per-step durations. Warmup steps are kept for warmup studies, never summarised."""

    warmup_ms: tuple[float, ...]
    measured_ms: tuple[float, ...]
    # {phase name: one duration per measured step}, in the order the phases first ran
    phase_ms: dict[str, tuple[float, ...]] = field(default_factory=dict)
    # measured until resolved (target_iqr_pct): whether IQR/median fell to the target before the cap
    target_reached: bool | None = None


def time_steps(
    step: Step,
    *,
    warmup_steps: int,
    measure_steps: int,
    timer: StepTimer,
    during_measurement: contextlib.AbstractContextManager | None = None,
    budget_s: float | None = None,
    min_measure_steps: int = 3,
    phases: PhaseRecorder | None = None,
    target_iqr_pct: float | None = None,
    max_measure_s: float = 60.0,
    max_measure_steps: int = 1000,
    after_step: Callable[[str, int, int, float], None] | None = None,
) -> StepTimes:
    """Warmup steps, then measured steps, each timed on its own.

    `during_measurement` is entered around the measured steps only (a memory-history
    recording, a profiler capture range).

    `budget_s` bounds slow configurations: warmup stops once its steps have taken that
    long (after at least one), and measurement stops once its steps have taken that long
    and at least `min_measure_steps` were measured. The budget counts timed step time
    only; how many steps ran is the length of the returned samples.

    `phases` (a recorder whose `phase` callback the step uses) records the phases of the
    measured steps; they are resolved after the last one.

    `target_iqr_pct` measures until resolved, in the spirit of torch.utils.benchmark's adaptive
    autorange: after `measure_steps`, one more step at a time while IQR/median is above the target,
    the measured steps have taken under `max_measure_s` and fewer than `max_measure_steps` ran; the
    result says whether the target was reached.

    `after_step(kind, index, planned, ms)` is called after each timed step, outside its timing ("warmup"
    or "measured", 1-based index, the planned count): a progress line for slow configurations.
    """
    if warmup_steps < 0 or measure_steps < 1:
        raise ValueError(f"need warmup_steps >= 0 and measure_steps >= 1, got {warmup_steps}, {measure_steps}")

    def over_budget(samples: list[float], at_least: int) -> bool:
        return budget_s is not None and len(samples) >= at_least and sum(samples) >= budget_s * 1e3

    warmup: list[float] = []
    with nvtx.range("warmup"):
        for _ in range(warmup_steps):
            warmup.append(timer.time_ms(step))
            if after_step is not None:
                after_step("warmup", len(warmup), warmup_steps, warmup[-1])
            if over_budget(warmup, 1):
                break
    measured: list[float] = []

    def one_step() -> None:
        with nvtx.range("step"):
            if phases is not None:
                phases.start_step()
            measured.append(timer.time_ms(step))
            if phases is not None:
                phases.end_step()
            if after_step is not None:
                after_step("measured", len(measured), measure_steps, measured[-1])

    def unresolved() -> bool:
        return len(measured) < 2 or summarize(measured).iqr_pct > target_iqr_pct

    with during_measurement or contextlib.nullcontext(), nvtx.capture("measured"):
        for _ in range(measure_steps):
            one_step()
            if over_budget(measured, min(min_measure_steps, measure_steps)):
                break
        reached = None
        if target_iqr_pct is not None:
            while unresolved() and sum(measured) < max_measure_s * 1e3 and len(measured) < max_measure_steps:
                one_step()
            reached = not unresolved()
    return StepTimes(tuple(warmup), tuple(measured), phase_samples(phases), reached)


def phase_samples(phases: PhaseRecorder | None) -> dict[str, tuple[float, ...]]:
    """Each phase's milliseconds per recorded step (0 in a step that did not run it)."""
    per_step = phases.resolve() if phases is not None else []
    names = list(dict.fromkeys(name for step_phases in per_step for name in step_phases))
    return {name: tuple(step_phases.get(name, 0.0) for step_phases in per_step) for name in names}
