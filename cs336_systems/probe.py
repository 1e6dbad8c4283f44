"""Why is *my* training slow? A probe for the user's own training loop.

    probe = StepProbe(device="cuda", output="probe.csv", batch_size=32)
    for batch in probe.loader(train_loader):      # times each wait for a batch
        with probe.phase("forward"):              # any names: time the loop's own phases
            loss = model(batch)
        ...
        probe.step()                              # closes a step

Per window of N steps: data-wait % (time blocked waiting for the next batch / wall time,
torchtitan's data_loading %), each phase's mean time, samples/s, and loader_bench's
input-bound verdict bands. One summary line per window (through tqdm.write when a tqdm bar is
active); rows go to CSV (flushed per window), JSONL (raw per-step times) and Markdown (with the
advice) through the project's writers. `close()` (or leaving `with StepProbe(...)`, or the
interpreter exiting) writes what was measured, also when the user's loop raised.

Timing: the host clock (time.perf_counter) for the waits and the steps. Phases: the host clock
on a CPU; on a GPU a CUDA event pair per phase, resolved after one synchronize at the end of the
window, so the host runs ahead of the GPU as in training (no synchronisation per step).
A step runs from the previous probe.step() (or the first wait) to this one, so steps tile time.
"""

from __future__ import annotations

import atexit
import math
import os
import sys
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import torch

from cs336_systems.loader_bench import (
    NOT_INPUT_BOUND_PCT,
    batch_nbytes,
    error_text,
    predicted_buffer_bytes,
    predicted_epoch_s,
    verdict,
)
from cs336_systems.memory import estimate_memory
from cs336_systems.models import ModelConfig, TransformerLM
from cs336_systems.results import (
    Environment,
    Record,
    ResultSink,
    check_output_paths,
    collect_environment,
    render_markdown,
    samples_field,
    utc_timestamp,
)
from cs336_systems.runner import resolve_device
from cs336_systems.units import format_bytes

DEFAULT_WINDOW = 50
# On a GPU, phases covering less of the wall time than this (with no data wait) leave the GPU
# waiting on the host: Python, kernel launches, synchronising calls outside the phases.
HOST_BOUND_BUSY_PCT = 80.0
DEFAULT_PREFETCH = 2  # torch's DataLoader default
TIMERS = ("auto", "host", "cuda-events")


@dataclass
class ProbeRecord(Record):
    """One window of steps of the user's loop."""

    label: str
    window: int
    first_step: int
    last_step: int
    steps: int
    device: str
    timer: str  # "host" or "cuda-events" (phases)
    batch_size: int | None
    samples: int | None
    status: str  # "ok"; "error" when the loop raised in this window
    error: str | None
    wall_s: float
    step_ms: float | None  # mean over the window's steps
    data_wait_ms: float | None  # mean per step
    data_wait_pct: float | None
    verdict: str | None  # loader_bench's input-bound bands on data_wait_pct
    phases: str | None  # "forward=12.345 backward=20.100": mean ms per step
    phases_pct: float | None  # all phases / wall time (device time on a GPU)
    outside_pct: float | None  # neither waiting nor in a phase (host clock only)
    samples_per_s: float | None
    loader: str | None  # the DataLoader's flags, when it is one
    notes: str | None = None
    timestamp: str = field(default_factory=utc_timestamp)
    environment: Environment | None = None
    step_wall_ms: list[float] = samples_field()
    step_wait_ms: list[float] = samples_field()
    step_phase_ms: list[dict[str, float]] = samples_field()


PROBE_FIELDS = ProbeRecord.row_fields()
MARKDOWN_COLUMNS = ("label", "window", "first_step", "last_step", "status", "step_ms", "data_wait_pct",
                    "verdict", "phases", "phases_pct", "outside_pct", "samples_per_s")  # fmt: skip
LABEL_COLUMNS = ("label", "window")


# -- accounting: pure functions of per-step times ------------------------------------------------


@dataclass
class Step:
    """One step: host wall and data wait (ms), phase times (ms) and samples."""

    wall_ms: float
    wait_ms: float
    phase_ms: dict[str, float]
    samples: int | None


def phase_means(steps: Sequence[Step]) -> dict[str, float]:
    names = list(dict.fromkeys(name for s in steps for name in s.phase_ms))
    return {name: sum(s.phase_ms.get(name, 0.0) for s in steps) / len(steps) for name in names}


def window_figures(steps: Sequence[Step], wall_s: float, host_phases: bool) -> dict:
    """The window's figures; the percentages are of `wall_s`."""
    wall_ms = wall_s * 1e3
    wait_ms = sum(s.wait_ms for s in steps)
    phases_ms = sum(sum(s.phase_ms.values()) for s in steps)
    samples = None if any(s.samples is None for s in steps) else sum(s.samples for s in steps)
    wait_pct = 100 * wait_ms / wall_ms if wall_ms > 0 else None
    phases_pct = 100 * phases_ms / wall_ms if wall_ms > 0 else None
    return dict(
        steps=len(steps),
        samples=samples,
        wall_s=wall_s,
        step_ms=sum(s.wall_ms for s in steps) / len(steps) if steps else None,
        data_wait_ms=wait_ms / len(steps) if steps else None,
        data_wait_pct=wait_pct,
        verdict=None if wait_pct is None else verdict(wait_pct),
        phases=" ".join(f"{name}={ms:.3f}" for name, ms in phase_means(steps).items()) or None if steps else None,
        phases_pct=phases_pct,
        # on a GPU the phases are device time, which overlaps the host's waits: no sum then
        outside_pct=max(0.0, 100 - wait_pct - phases_pct) if host_phases and wait_pct is not None else None,
        samples_per_s=samples / wall_s if samples is not None and wall_s > 0 else None,
        step_wall_ms=[s.wall_ms for s in steps],
        step_wait_ms=[s.wait_ms for s in steps],
        step_phase_ms=[dict(s.phase_ms) for s in steps],
    )


def summary_line(record: ProbeRecord) -> str:
    if not record.steps:
        return f"probe {record.label}: no complete step" + (f" ({record.error})" if record.error else "")
    parts = [f"probe {record.label} steps {record.first_step}-{record.last_step}: step {record.step_ms:.1f} ms"]
    if record.samples_per_s is not None:
        parts.append(f"{record.samples_per_s:.1f} samples/s")
    parts.append(f"data wait {record.data_wait_pct:.1f}% ({record.verdict})")
    if record.phases:
        parts.append(" ".join(f"{p.split('=')[0]} {float(p.split('=')[1]):.1f} ms" for p in record.phases.split()))
    if record.status != "ok":
        parts.append(f"{record.status}: {record.error}")
    return ", ".join(parts)


def bound(data_wait_pct: float, phases_pct: float | None, on_gpu: bool, device_busy_pct: float | None) -> str:
    """'input', 'host' (a GPU waiting on the host) or 'compute'."""
    if data_wait_pct >= NOT_INPUT_BOUND_PCT:
        return "input"
    busy = device_busy_pct if device_busy_pct is not None else phases_pct
    if on_gpu and busy is not None and busy < HOST_BOUND_BUSY_PCT:
        return "host"
    return "compute"


# -- advice ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoaderInfo:
    """What the probe read off a torch DataLoader (None: not a DataLoader)."""

    num_workers: int
    prefetch_factor: int | None
    pin_memory: bool
    persistent_workers: bool
    batch_size: int | None
    num_items: int | None

    @classmethod
    def of(cls, loader: object) -> LoaderInfo | None:
        if not isinstance(loader, torch.utils.data.DataLoader):
            return None
        try:
            items = len(loader.dataset)
        except TypeError:
            items = None
        workers = loader.num_workers
        return cls(workers, loader.prefetch_factor if workers else None, loader.pin_memory,
                   loader.persistent_workers, loader.batch_size, items)  # fmt: skip

    def describe(self) -> str:
        return (f"num_workers={self.num_workers} prefetch_factor={self.prefetch_factor} "
                f"pin_memory={self.pin_memory} persistent_workers={self.persistent_workers}")  # fmt: skip


def input_advice(steps: Sequence[Step], info: LoaderInfo | None, batch_bytes: int | None, pinned: bool) -> list[str]:
    """More workers (how many, what it predicts, the host RAM it takes), persistence, a local copy."""
    wait = sum(s.wait_ms for s in steps) / len(steps) / 1e3
    step = sum(s.wall_ms for s in steps) / len(steps) / 1e3
    compute = max(step - wait, 1e-6)
    if info is None:
        return [f"input-bound: the loop waits {1e3 * wait:.1f} ms per {1e3 * step:.1f} ms step for its data; "
                "load in parallel (DataLoader num_workers / prefetch_factor) or from a faster copy"]  # fmt: skip
    # steady state with W workers: a step takes fetch / W, so a batch's fetch is W steps (W = 0: one wait)
    fetch = wait if info.num_workers == 0 else info.num_workers * step
    workers = max(info.num_workers + 1, math.ceil(fetch / compute))
    prefetch = info.prefetch_factor or DEFAULT_PREFETCH
    predicted = predicted_epoch_s(len(steps), fetch, compute, workers) / len(steps)
    lines = [
        f"input-bound: {1e3 * wait:.1f} ms of each {1e3 * step:.1f} ms step is spent waiting for a batch "
        f"({info.describe()}); a batch takes about {1e3 * fetch:.0f} ms to fetch and the rest of the step "
        f"{1e3 * compute:.1f} ms",
        f"try num_workers={workers} (prefetch_factor={prefetch}): predicted step {1e3 * predicted:.1f} ms "
        f"(loader_bench's closed form), {step / predicted:.1f}x",
    ]
    if batch_bytes is not None:
        buffer = predicted_buffer_bytes(workers, prefetch, batch_bytes, pinned)
        available = psutil.virtual_memory().available
        lines.append(f"  host RAM for its batches in flight: up to {format_bytes(buffer)} "
                     f"({format_bytes(available)} available now)")  # fmt: skip
    if info.num_workers and not info.persistent_workers:
        lines.append("persistent_workers=True: keeps the workers (and their warm state) between epochs")
    if batch_bytes is not None and info.num_items is not None and info.batch_size:
        dataset = info.num_items * batch_bytes // info.batch_size
        lines.append(f"a local copy of the data (on local disk or in RAM under /dev/shm) takes "
                     f"{format_bytes(dataset)}: worth it when each item is fetched from remote storage")  # fmt: skip
    return lines


def compute_advice(model: torch.nn.Module | None, batch_size: int | None, context_length: int | None,
                   precision: str, device: torch.device) -> list[str]:  # fmt: skip
    """Precision, compile, and a larger batch (with the estimator's verdict for the built-in model)."""
    lines = ["compute-bound: the time is in your own phases; the loader keeps up"]
    if precision == "fp32":
        lines.append("precision: bf16 autocast (torch.autocast) on hardware that has it; on a GPU TF32 "
                     "matmuls (torch.set_float32_matmul_precision('high'))")  # fmt: skip
    lines.append("compile: torch.compile(model) fuses the elementwise work")
    config = getattr(model, "config", None)
    if isinstance(model, TransformerLM) and isinstance(config, ModelConfig) and batch_size and context_length:
        if device.type == "cuda":
            memory = torch.cuda.get_device_properties(device).total_memory
        else:
            memory = psutil.virtual_memory().total
        larger = 2 * batch_size
        est = estimate_memory(config, larger, context_length, "train-step", precision, device.type, memory)
        fits = "fits" if est.fits else "does not fit"
        lines.append(f"batch size {larger} (from {batch_size}): the estimator predicts {format_bytes(est.total_bytes)} "
                     f"for a train step, which {fits} in {format_bytes(memory)}")  # fmt: skip
    else:
        lines.append("batch size: a larger batch uses the hardware better while it fits in memory")
    return lines


def host_advice(phases_pct: float | None, device_busy_pct: float | None) -> list[str]:
    if device_busy_pct is not None:
        measured = f"the GPU is busy {device_busy_pct:.0f}% of the step (measured)"
    else:
        measured = f"your phases cover {phases_pct:.0f}% of the step on the GPU"
    return [f"host-bound: {measured}; the GPU waits for the host to launch work",
            "try torch.compile(mode='reduce-overhead') or CUDA graphs, a larger batch, and no "
            "synchronising calls (.item(), .cpu(), print of a tensor) inside the step"]  # fmt: skip


# -- timers ----------------------------------------------------------------------------------------


class _Phase:
    __slots__ = ("probe", "name", "start")

    def __init__(self, probe: StepProbe, name: str):
        self.probe, self.name = probe, name

    def __enter__(self) -> _Phase:
        probe = self.probe
        probe._open = True
        if probe._events:
            self.start = probe._event_factory()
            self.start.record()
        else:
            self.start = probe._clock()
        return self

    def __exit__(self, *exc) -> None:
        probe = self.probe
        if probe._events:
            end = probe._event_factory()
            end.record()
            probe._pending.append((self.name, self.start, end))
        else:
            phase = probe._phase_ms
            phase[self.name] = phase.get(self.name, 0.0) + 1e3 * (probe._clock() - self.start)


class StepProbe:
    """Measures the user's loop; see the module docstring. `clock`, `event_factory` and
    `synchronize` are seams for tests (a fake clock; fake CUDA events and a counted sync)."""

    def __init__(
        self,
        device: str | torch.device = "cpu",
        output: str | Path | None = None,
        outputs: Sequence[str | Path] = (),
        batch_size: int | None = None,
        window: int = DEFAULT_WINDOW,
        *,
        label: str = "train",
        model: torch.nn.Module | None = None,
        precision: str = "fp32",
        device_busy_pct: float | None = None,
        timer: str = "auto",
        clock: Callable[[], float] = time.perf_counter,
        event_factory: Callable[[], object] | None = None,
        synchronize: Callable[[], None] | None = None,
        print_fn: Callable[[str], None] | None = None,
        environment: Environment | None = None,
    ):
        if window < 1:
            raise ValueError(f"window must be at least 1 step, got {window}")
        if timer not in TIMERS:
            raise ValueError(f"timer must be one of {', '.join(TIMERS)}, got {timer!r}")
        self.device = device if isinstance(device, torch.device) else resolve_device(device)
        self.batch_size, self.window, self.label = batch_size, window, label
        self.model, self.precision, self.device_busy_pct = model, precision, device_busy_pct
        self._events = timer == "cuda-events" or (timer == "auto" and self.device.type == "cuda")
        self.timer = "cuda-events" if self._events else "host"
        self._clock, self._print = clock, print_fn
        self._event_factory = event_factory or (lambda: torch.cuda.Event(enable_timing=True))
        self._synchronize = synchronize or (
            (lambda: torch.cuda.synchronize(self.device)) if self.device.type == "cuda" else (lambda: None)
        )
        paths = [*([output] if output is not None else []), *outputs]
        checked = check_output_paths(paths)
        self._markdown = [p for p in checked if p.suffix == ".md"]
        self._sink = ResultSink([p for p in checked if p.suffix != ".md"], fields=PROBE_FIELDS)
        self._environment = environment or collect_environment(self.device)  # before any timing
        self.records: list[ProbeRecord] = []
        self.steps: list[Step] = []  # every closed step, for the advice
        self.loader_info: LoaderInfo | None = None
        self.batch_bytes: int | None = None
        self.context_length: int | None = None
        self._window_steps: list[Step] = []
        self._window_pending: list[list[tuple[str, object, object]]] = []  # per step (event timer)
        self._window_start: float | None = None
        self._step_start: float | None = None
        self._wait_ms = 0.0
        self._phase_ms: dict[str, float] = {}
        self._pending: list[tuple[str, object, object]] = []
        self._samples: int | None = None
        self._open = False  # something measured since the last step()
        self._closed = False
        self.advice: list[str] = []
        atexit.register(_close_at_exit, weakref.ref(self))

    # -- the three lines --------------------------------------------------------------------------

    def loader(self, iterable: Iterable) -> Iterator:
        """Yield `iterable`'s batches, timing each wait for one."""
        info = LoaderInfo.of(iterable)
        if info is not None:
            self.loader_info = info
            if self.batch_size is None:
                self.batch_size = info.batch_size
        iterator = iter(iterable)
        while True:
            start = self._clock()
            if self._step_start is None:
                self._start_step(start)
            try:
                batch = next(iterator)
            except StopIteration:
                return
            self._wait_ms += 1e3 * (self._clock() - start)
            self._open = True
            if self.batch_bytes is None:
                self._first_batch(batch)
            if self.batch_size is None:
                self._samples = (self._samples or 0) + _batch_len(batch)
            yield batch

    def phase(self, name: str) -> _Phase:
        """`with probe.phase("forward"):` times the block (CUDA events on a GPU)."""
        if self._step_start is None:
            self._start_step(self._clock())
        return _Phase(self, name)

    def step(self) -> None:
        """Close a step; every `window` steps, write and print the window."""
        now = self._clock()
        if self._step_start is None:
            self._start_step(now)
        samples = self.batch_size if self.batch_size is not None else self._samples
        step = Step(1e3 * (now - self._step_start), self._wait_ms, self._phase_ms, samples)
        self._window_steps.append(step)
        self._window_pending.append(self._pending)
        self._step_start, self._wait_ms, self._phase_ms, self._pending, self._samples = now, 0.0, {}, [], None
        self._open = False
        if len(self._window_steps) >= self.window:
            self._flush()

    # -- lifetime ---------------------------------------------------------------------------------

    def __enter__(self) -> StepProbe:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(exc)

    def close(self, error: BaseException | None = None) -> None:
        """Write the last (partial) window, the Markdown and the advice. Idempotent."""
        if self._closed:
            return
        self._closed = True
        open_step = self._open
        text = error_text(error) if error is not None else ("stopped inside a step" if open_step else None)
        if self._window_steps or open_step:
            self._flush(status="error" if error is not None or open_step else "ok", error=text)
        self.advice = self.advise()
        for path in self._markdown:
            temporary = path.with_name(path.name + ".tmp")
            temporary.write_text(self.markdown())
            os.replace(temporary, path)
        self._emit("probe advice:\n  " + "\n  ".join(self.advice))

    # -- results ----------------------------------------------------------------------------------

    def advise(self) -> list[str]:
        # the first step pays worker start-up and the first fetch: leave it out when there are more
        steps = self.steps[1:] if len(self.steps) > 1 else self.steps
        if not steps:
            return ["no complete step measured"]
        wall_ms = sum(s.wall_ms for s in steps)
        wait_pct = 100 * sum(s.wait_ms for s in steps) / wall_ms if wall_ms > 0 else 0.0
        phases_pct = 100 * sum(sum(s.phase_ms.values()) for s in steps) / wall_ms if wall_ms > 0 else None
        kind = bound(wait_pct, phases_pct, self.device.type == "cuda", self.device_busy_pct)
        head = f"over {len(steps)} steps: data wait {wait_pct:.1f}% ({verdict(wait_pct)})"
        if kind == "input":
            pinned = bool(self.loader_info and self.loader_info.pin_memory and self.device.type == "cuda")
            return [head, *input_advice(steps, self.loader_info, self.batch_bytes, pinned)]
        if kind == "host":
            return [head, *host_advice(phases_pct, self.device_busy_pct)]
        return [head, *compute_advice(self.model, self.batch_size, self.context_length, self.precision, self.device)]

    def markdown(self) -> str:
        rows = [r.to_row() for r in self.records]
        text = render_markdown(rows, f"probe: {self.label}", MARKDOWN_COLUMNS, LABEL_COLUMNS)
        head, _, _ = text.rpartition("std is the sample standard deviation")
        conventions = ("data_wait_pct: time blocked waiting for a batch / wall time; verdict: < 5% not "
                       "input-bound, 5-20% moderately, > 20% input-bound; phases: mean ms per step "
                       f"({self.timer} timer).")  # fmt: skip
        return head + "Advice:\n\n" + "\n".join(f"    {line}" for line in self.advice) + "\n\n" + conventions + "\n"

    # -- internals --------------------------------------------------------------------------------

    def _start_step(self, now: float) -> None:
        self._step_start = now
        if self._window_start is None:
            self._window_start = now

    def _first_batch(self, batch) -> None:
        self.batch_bytes = batch_nbytes(batch) or None
        first = _first_tensor(batch)
        if first is not None and first.dim() >= 2:
            self.context_length = first.shape[-1]

    def _flush(self, status: str = "ok", error: str | None = None) -> None:
        steps, pending = self._window_steps, self._window_pending
        if self._open:  # an unfinished step (the loop raised): its waits and phases still count
            now = self._clock()
            steps.append(Step(1e3 * (now - self._step_start), self._wait_ms, self._phase_ms, 0))
            pending.append(self._pending)
        if self._events:
            self._synchronize()  # the window's one synchronisation
            for step, events in zip(steps, pending):
                for name, start, end in events:
                    step.phase_ms[name] = step.phase_ms.get(name, 0.0) + start.elapsed_time(end)
        end = self._clock()
        wall_s = end - self._window_start if self._window_start is not None else 0.0
        complete = steps[:-1] if self._open else steps
        first = len(self.steps) + 1
        figures = window_figures(steps, wall_s, not self._events)
        figures["steps"] = len(complete)
        figures["step_ms"] = sum(s.wall_ms for s in complete) / len(complete) if complete else None
        record = ProbeRecord(
            label=self.label, window=len(self.records), first_step=first, last_step=first + len(complete) - 1,
            device=str(self.device), timer=self.timer, batch_size=self.batch_size, status=status, error=error,
            loader=self.loader_info.describe() if self.loader_info else None,
            notes="the last step is unfinished (the loop stopped inside it)" if self._open else None,
            environment=self._environment, **figures,
        )  # fmt: skip
        self.steps += complete
        self.records.append(record)
        self._sink.write(record)
        self._emit(summary_line(record))
        self._window_steps, self._window_pending, self._window_start = [], [], end
        self._step_start, self._wait_ms, self._phase_ms, self._pending, self._open = end, 0.0, {}, [], False

    def _emit(self, line: str) -> None:
        if self._print is not None:
            self._print(line)
            return
        bars = getattr(sys.modules.get("tqdm"), "tqdm", None)
        if bars is not None and getattr(bars, "_instances", None):
            bars.write(line, file=sys.stderr)  # above the bar, which redraws itself
        else:
            print(line, file=sys.stderr, flush=True)


def _close_at_exit(ref: weakref.ref) -> None:
    probe = ref()
    if probe is not None:
        probe.close()


def _first_tensor(batch) -> torch.Tensor | None:
    if isinstance(batch, torch.Tensor):
        return batch
    values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    for value in values:
        found = _first_tensor(value)
        if found is not None:
            return found
    return None


def _batch_len(batch) -> int:
    first = _first_tensor(batch)
    return int(first.shape[0]) if first is not None and first.dim() > 0 else 1
