"""The probe's record and its accounting: pure functions of per-step times."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from ..loader_bench import NOT_INPUT_BOUND_PCT, verdict
from ..results import Record, samples_field

# On a GPU, phases covering less of the wall time than this (with no data wait) leave the GPU
# waiting on the host: Python, kernel launches, synchronising calls outside the phases.
HOST_BOUND_BUSY_PCT = 80.0


@dataclass
class ProbeRecord(Record):
    """One window of steps of the user's loop."""

    tool: ClassVar[str] = "probe"

    run: str  # the probe's label (not `label`: the results package's Record has a label() method)
    window: int
    first_step: int
    last_step: int
    steps: int
    device: str
    timer: str  # "host" or "cuda-events" (phases)
    batch_size: int | None
    samples: int | None
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
    # status (Record): "ok"; "error" when the loop raised in this window
    step_wall_ms: list[float] = samples_field()
    step_wait_ms: list[float] = samples_field()
    step_phase_ms: list[dict[str, float]] = samples_field()

    markdown_columns: ClassVar[tuple[str, ...]] = (
        "run",
        "window",
        "first_step",
        "last_step",
        "status",
        "step_ms",
        "data_wait_pct",
        "verdict",
        "phases",
        "phases_pct",
        "outside_pct",
        "samples_per_s",
    )
    label_columns: ClassVar[tuple[str, ...]] = ("run", "window")


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
        return f"probe {record.run}: no complete step" + (f" ({record.error})" if record.error else "")
    parts = [f"probe {record.run} steps {record.first_step}-{record.last_step}: step {record.step_ms:.1f} ms"]
    if record.samples_per_s is not None:
        parts.append(f"{record.samples_per_s:.1f} samples/s")
    parts.append(f"data wait {record.data_wait_pct:.1f}% ({record.verdict})")
    per_step = record.step_phase_ms
    names = dict.fromkeys(name for phases in per_step for name in phases)  # any names, spaces too
    for name in names:
        parts.append(f"{name} {sum(phases.get(name, 0.0) for phases in per_step) / len(per_step):.1f} ms")
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
