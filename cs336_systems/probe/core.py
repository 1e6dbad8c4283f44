"""StepProbe: the three lines in the user's loop (see the package docstring)."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import torch

from ..device import resolve_device
from ..loader_bench import batch_nbytes, error_text, verdict
from ..results import Environment, ResultSink, ResultWriteError, check_output_paths, collect_environment, write_whole
from ..results.errors import OutputLockedError
from ..results.markdown import render_document
from .advice import LoaderInfo, compute_advice, host_advice, input_advice
from .record import (
    ProbeRecord,
    Step,
    bound,
    summary_line,
    window_figures,
)

DEFAULT_WINDOW = 50
TIMERS = ("auto", "host", "cuda-events")


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
        if timer == "cuda-events" and self.device.type != "cuda" and event_factory is None:
            raise ValueError(f"timer 'cuda-events' needs a CUDA device, got {self.device}")
        self.batch_size, self.window, self.label = batch_size, window, label
        self.model, self.precision, self.device_busy_pct = model, precision, device_busy_pct
        self._events = timer == "cuda-events" or (timer == "auto" and self.device.type == "cuda")
        self.timer = "cuda-events" if self._events else "host"
        self._clock, self._print = clock, print_fn
        self._event_factory = event_factory or (lambda: torch.cuda.Event(enable_timing=True))
        self._synchronize = synchronize or (
            (lambda: torch.cuda.synchronize(self.device)) if self.device.type == "cuda" else (lambda: None)
        )
        paths = [_rank_path(Path(p)) for p in (*([output] if output is not None else []), *outputs)]
        checked = check_output_paths(paths)
        self._markdown = [p for p in checked if p.suffix == ".md"]
        self._write_error: str | None = None  # the probe's own write failure, told once
        try:
            self._sink = ResultSink([p for p in checked if p.suffix != ".md"], ProbeRecord)
        except OutputLockedError as exc:  # another rank (or run) writes it: the loop goes on, measured, unwritten
            self._sink = ResultSink([], ProbeRecord)
            self._markdown = []
            self._report_write_error(
                f"{exc}; give each process its own output (or create the probe after init_process_group)"
            )
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
            self._guarded(self._flush)

    # -- lifetime ---------------------------------------------------------------------------------

    def __enter__(self) -> StepProbe:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(exc)  # never raises: the user's own exception goes on as it was

    def close(self, error: BaseException | None = None) -> None:
        """Write the last (partial) window, the Markdown and the advice, and let go of the outputs'
        locks. Idempotent; never raises (a failure of the probe's own is told once on stderr)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._guarded(lambda: self._finish(error))
        finally:
            self._sink.close()

    def _finish(self, error: BaseException | None) -> None:
        open_step = self._open
        text = error_text(error) if error is not None else ("stopped inside a step" if open_step else None)
        if self._window_steps or open_step:
            self._flush(status="error" if error is not None or open_step else "ok", error=text)
        self.advice = self.advise()
        for path in self._markdown if self._write_error is None else ():
            try:
                write_whole(path, self.markdown())  # the one writer: a temp file beside it, then a rename
            except ResultWriteError as exc:
                self._report_write_error(str(exc))
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
        conventions = (
            "data_wait_pct: time blocked waiting for a batch / wall time; verdict: < 5% not "
            "input-bound, 5-20% moderately, > 20% input-bound; phases: mean ms per step "
            f"({self.timer} timer)."
        )
        advice = "\n".join(f"    {line}" for line in self.advice)
        return render_document(
            rows,
            title=f"probe: {self.label}",
            columns=ProbeRecord.markdown_columns,
            label_columns=ProbeRecord.label_columns,
            conventions=f"Advice:\n\n{advice}\n\n{conventions}",
        )

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
            run=self.label,
            window=len(self.records),
            first_step=first,
            last_step=first + len(complete) - 1,
            device=str(self.device),
            timer=self.timer,
            batch_size=self.batch_size,
            status=status,
            error=error,
            loader=self.loader_info.describe() if self.loader_info else None,
            notes="the last step is unfinished (the loop stopped inside it)" if self._open else None,
            environment=self._environment,
            **figures,
        )
        self.steps += complete
        self.records.append(record)
        if self._write_error is None:
            try:
                self._sink.write(record)
            except OSError as exc:  # a full disk: measuring goes on, the windows stay in .records
                self._report_write_error(str(exc.strerror or exc))
        self._emit(summary_line(record))
        self._window_steps, self._window_pending, self._window_start = [], [], end
        self._step_start, self._wait_ms, self._phase_ms, self._pending, self._open = end, 0.0, {}, [], False

    def _guarded(self, action: Callable[[], None]) -> None:
        """Run the probe's own work; a failure of it never reaches the user's loop (told once)."""
        try:
            action()
        except Exception as exc:
            self._report_write_error(f"{type(exc).__name__}: {exc}")

    def _report_write_error(self, what: str) -> None:
        if self._write_error is None:
            self._write_error = what
            with contextlib.suppress(Exception):
                self._emit(f"probe: error: {what}; measuring goes on, later windows are kept in probe.records only")

    def _emit(self, line: str) -> None:
        if self._print is not None:
            self._print(line)
            return
        bars = getattr(sys.modules.get("tqdm"), "tqdm", None)
        if bars is not None and getattr(bars, "_instances", None):
            bars.write(line, file=sys.stderr)  # above the bar, which redraws itself
        else:
            print(line, file=sys.stderr, flush=True)


def _rank_path(path: Path) -> Path:
    """Rank 0 writes `path`; rank r > 0 writes `stem.rankR.suffix` beside it, so every rank of a
    data-parallel job can be given the same output: the rank of an initialised process group, or, before
    init_process_group, the RANK its launcher (torchrun) set."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        rank = torch.distributed.get_rank()
    else:
        text = os.environ.get("RANK", "0")
        rank = int(text) if text.isdigit() and os.environ.get("WORLD_SIZE", "1") != "1" else 0
    return path if rank == 0 else path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


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
