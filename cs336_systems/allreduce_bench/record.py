"""The row of one (world size, size): AllReduceRecord, the bandwidths and its Markdown view."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..distributed import GroupResult, max_over_ranks, oversubscription_note
from ..distributed.links import RankColumns, bus_factor
from ..results import Environment, Record, Timing, fill_timing, identity_field, samples_field
from ..results.records import MARKDOWN_TIMING
from ..stats import per_second, summarize
from .worker import BYTES_PER_ELEMENT, DTYPE, AllReduceUnit


@dataclass
class AllReduceRecord(RankColumns, Timing, Record):
    """One (world size, size) of the all-reduce benchmark; latency statistics over the measured
    steps, each step's latency being the slowest rank's (status, error, notes: Record's; where the
    ranks ran and the links probed: RankColumns')."""

    tool: ClassVar[str] = "allreduce_bench"

    backend: str = identity_field()
    device: str = identity_field()
    launcher: str = identity_field()
    world_size: int = identity_field()
    size: str = identity_field()  # as asked, e.g. "10MB"
    dtype: str = identity_field()
    threads_per_rank: int = identity_field()
    warmup_steps: int = identity_field()
    measure_steps: int = identity_field()
    size_bytes: int  # really all-reduced: num_elements * 4
    num_elements: int
    algbw_gbps: float | None = None  # on the median step, as every rate (stats.per_second)
    busbw_gbps: float | None = None
    predicted_ms: float | None = None  # the ring model on the probed links (distributed/links.py)
    predicted_busbw_gbps: float | None = None
    step_ms: list[float] = samples_field()  # per step, the slowest rank
    warmup_step_ms: list[float] = samples_field()
    rank_step_ms: list[list[float]] = samples_field()  # [rank][step]

    title: ClassVar[str] = "all_reduce benchmark"
    markdown_columns: ClassVar[tuple[str, ...]] = (
        "backend",
        "world_size",
        "size",
        "size_bytes",
        "status",
        *MARKDOWN_TIMING,
        "algbw_gbps",
        "busbw_gbps",
        "predicted_busbw_gbps",
        "link_gbps",
        "nodes",
        "threads_per_rank",
    )
    label_columns: ClassVar[tuple[str, ...]] = ("backend", "world_size", "size")


def bandwidths_gbps(size_bytes: int, median_ms: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes per second) over the median step, as every rate."""
    algbw = per_second(size_bytes, median_ms) / 1e9
    return algbw, algbw * bus_factor(world_size)


def record_for(
    unit: AllReduceUnit, result: GroupResult, base: dict, environment: Environment | None
) -> AllReduceRecord:
    """The row of one unit from every rank's message (or from the group's failure)."""
    world_size = base["world_size"]
    record = AllReduceRecord(
        **base,
        size=unit.size,
        size_bytes=unit.size_bytes // BYTES_PER_ELEMENT * BYTES_PER_ELEMENT,
        num_elements=unit.size_bytes // BYTES_PER_ELEMENT,
        dtype=str(DTYPE).removeprefix("torch."),
        warmup_steps=unit.warmup_steps,
        measure_steps=unit.measure_steps,
        status=result.status,
        error=result.error,
        environment=result.environment or environment,
    )
    notes = [n for n in (oversubscription_note(record.backend, world_size, record.threads_per_rank),) if n]
    if world_size == 1:
        notes.append("world size 1: no data leaves the rank, so busbw is 0 by definition")
    if result.status == "ok":
        messages = result.messages
        failed = next((m for m in messages if m["status"] != "ok"), None)
        if failed is not None:
            record.status, record.error = failed["status"], failed["error"]
        else:
            record.rank_step_ms = [m["measured_ms"] for m in messages]
            record.step_ms = max_over_ranks(record.rank_step_ms)
            record.warmup_step_ms = max_over_ranks([m["warmup_ms"] for m in messages]) if unit.warmup_steps else []
            summary = summarize(record.step_ms)
            fill_timing(record, summary)
            record.algbw_gbps, record.busbw_gbps = bandwidths_gbps(record.size_bytes, summary.median, world_size)
    if result.links is not None:
        record.predicted_ms = result.links.ring_allreduce_ms(record.size_bytes, world_size)
        record.predicted_busbw_gbps = bandwidths_gbps(record.size_bytes, record.predicted_ms, world_size)[1]
    record.notes = "; ".join(notes) or None
    return record


def describe(unit: AllReduceUnit, record: AllReduceRecord) -> str:
    """The progress line of one row."""
    if record.status != "ok":
        return f"n={record.world_size} {unit.size}: {record.status}: {record.error}"
    predicted = f" (predicted {record.predicted_busbw_gbps:.3g})" if record.predicted_busbw_gbps else ""
    return (
        f"n={record.world_size} {unit.size}: median {record.median_ms:.3f} ms, "
        f"busbw {record.busbw_gbps:.3g} GB/s{predicted}"
    )
