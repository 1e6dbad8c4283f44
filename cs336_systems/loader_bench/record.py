"""The loader's result record (one row per configuration and epoch) and its Markdown view."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..device import resolve_device
from ..results import Record, identity_field, samples_field
from ..stats import summarize
from .config import BenchConfig, LoaderConfig
from .measure import EpochMeasurement
from .predictions import predicted_buffer_bytes, predicted_samples_per_s, verdict

# a row's loader settings: its label, and the first Markdown columns
_LABELS = ("processes", "num_workers", "prefetch_factor", "pin_memory", "persistent_workers", "epoch")


@dataclass
class LoaderRecord(Record):
    """One epoch of one loader configuration: what was asked, what happened, where."""

    tool: ClassVar[str] = "loader_bench"

    # the data
    storage: str = identity_field()
    dataset: str | None = identity_field()
    num_items: int = identity_field()
    item_bytes: int | None = identity_field()
    batch_size: int = identity_field()
    latency_ms: float | None = identity_field()
    bandwidth_bytes_per_s: float | None = identity_field()
    jitter_ms: float | None = identity_field()
    cache_hit_rate: float | None = identity_field()  # this epoch's
    warm_latency_ms: float | None = identity_field()
    # the step
    compute: str = identity_field()
    compute_ms: float | None = identity_field()
    device: str = identity_field()
    # the swept flags
    processes: int = identity_field()
    num_workers: int = identity_field()
    prefetch_factor: int | None = identity_field()
    pin_memory: bool = identity_field()
    persistent_workers: bool = identity_field()
    child_processes: bool = identity_field()
    epochs: int = identity_field()
    epoch: int | None = identity_field()
    seed: int = identity_field()
    ram_budget_bytes: int | None  # what the recommendation was held to, not part of the configuration
    # outcome
    steps: int | None = None
    samples: int | None = None
    wall_s: float | None = None
    samples_per_s: float | None = None
    predicted_samples_per_s: float | None = None
    data_wait_s: float | None = None
    data_wait_pct: float | None = None
    first_batch_wait_ms: float | None = None
    wait_p50_ms: float | None = None
    wait_p90_ms: float | None = None
    h2d_s: float | None = None
    h2d_pct: float | None = None
    compute_s: float | None = None
    compute_idle_pct: float | None = None
    verdict: str | None = None
    batch_bytes: int | None = None
    pinned: bool | None = None  # pin_memory in effect (it needs a GPU)
    predicted_buffer_bytes: int | None = None
    worker_rss_bytes: int | None = None
    worker_uss_bytes: int | None = None
    shm_bytes: int | None = None
    step_wait_ms: list[float] = samples_field()
    step_h2d_ms: list[float] = samples_field()
    step_compute_ms: list[float] = samples_field()

    title: ClassVar[str] = "cs336-bench loader benchmark"
    markdown_columns: ClassVar[tuple[str, ...]] = (
        *_LABELS,
        "status",
        "samples_per_s",
        "predicted_samples_per_s",
        "data_wait_pct",
        "compute_idle_pct",
        "verdict",
        "first_batch_wait_ms",
        "wait_p50_ms",
        "predicted_buffer_mib",
        "worker_rss_mib",
        "worker_uss_mib",
        "shm_mib",
    )
    label_columns: ClassVar[tuple[str, ...]] = _LABELS
    conventions: ClassVar[str] = (
        "data_wait_pct = time blocked in next(iterator) / wall; compute_idle_pct = 1 - compute / wall; verdict bands "
        "< 5% / 5-20% / > 20% (TensorFlow's input-pipeline analyzer). predicted_buffer = (workers x prefetch + 1) x "
        "batch bytes (+ workers x prefetch pinned copies on a GPU); worker RSS counts pages shared with the main "
        "process once per worker, USS only the workers' own; shm = batches in flight in /dev/shm."
    )


TITLE = LoaderRecord.title
render = LoaderRecord.markdown


def new_record(bench: BenchConfig, loader: LoaderConfig, env, compute_desc: str, ram_budget: int | None, epoch):
    model = bench.model if bench.storage in ("simulated", "http") else None
    return LoaderRecord(
        storage=bench.storage,
        dataset=bench.dataset,
        num_items=bench.num_items,
        item_bytes=bench.item_bytes,
        batch_size=bench.batch_size,
        latency_ms=model.latency_ms if model else None,
        bandwidth_bytes_per_s=model.bandwidth_bytes_per_s if model else None,
        jitter_ms=model.jitter_ms if model else None,
        cache_hit_rate=model.hit_rate(epoch) if model and epoch is not None else None,
        warm_latency_ms=model.warm_latency_ms if model else None,
        compute=compute_desc,
        compute_ms=bench.compute_ms if bench.compute == "sleep" else None,
        device=bench.device,
        **dataclasses.asdict(loader),  # the swept flags, each a column of its own name
        epochs=bench.epochs,
        epoch=epoch,
        seed=bench.seed,
        ram_budget_bytes=ram_budget,
        status="ok",
        environment=env,
    )


def epoch_record(
    bench: BenchConfig,
    loader: LoaderConfig,
    measured: Sequence[EpochMeasurement],
    env,
    compute_desc: str,
    ram_budget: int | None,
    notes: Sequence[str] = (),
) -> LoaderRecord:
    """One epoch's row from the measurements of every process (one unless processes mode)."""
    epoch = measured[0].epoch
    record = new_record(bench, loader, env, compute_desc, ram_budget, epoch)
    walls = [m.end_s - m.start_s for m in measured]
    total_wall = sum(walls)
    record.wall_s = max(m.end_s for m in measured) - min(m.start_s for m in measured)
    record.steps = sum(m.steps for m in measured)
    record.samples = sum(m.samples for m in measured)
    record.samples_per_s = record.samples / record.wall_s if record.wall_s > 0 else None
    record.predicted_samples_per_s = predicted_samples_per_s(bench, loader, epoch, min(m.steps for m in measured))
    waits = [w for m in measured for w in m.wait_ms]
    computes = [c for m in measured for c in m.compute_ms]
    record.data_wait_s = (sum(waits) + sum(m.final_wait_ms for m in measured)) / 1e3
    record.data_wait_pct = 100 * record.data_wait_s / total_wall if total_wall > 0 else None
    record.compute_s = sum(computes) / 1e3
    record.compute_idle_pct = 100 * (1 - record.compute_s / total_wall) if total_wall > 0 else None
    record.verdict = verdict(record.data_wait_pct) if record.data_wait_pct is not None else None
    if waits:
        record.first_batch_wait_ms = max(m.wait_ms[0] for m in measured if m.wait_ms)
        wait_summary = summarize(waits)
        record.wait_p50_ms, record.wait_p90_ms = wait_summary.median, wait_summary.p90
    if measured[0].h2d_ms is not None:
        copies = [h for m in measured for h in m.h2d_ms]
        record.h2d_s = sum(copies) / 1e3
        record.h2d_pct = 100 * record.h2d_s / total_wall if total_wall > 0 else None
        record.step_h2d_ms = copies
    record.step_wait_ms, record.step_compute_ms = waits, computes
    record.batch_bytes = measured[0].batch_bytes
    record.pinned = loader.pin_memory and resolve_device(bench.device).type == "cuda"
    if record.batch_bytes is not None:
        record.predicted_buffer_bytes = loader.processes * predicted_buffer_bytes(
            loader.num_workers, loader.prefetch_factor, record.batch_bytes, record.pinned
        )
    if loader.num_workers > 0:
        record.worker_rss_bytes = sum(m.worker_rss_bytes or 0 for m in measured)
        record.worker_uss_bytes = sum(m.worker_uss_bytes or 0 for m in measured)
        record.shm_bytes = max(m.shm_bytes or 0 for m in measured)
    if record.steps == 0:
        record.status, record.error = "error", "no full batch: fewer items than batch_size (per process)"
    record.notes = "; ".join(notes) or None
    return record


def configuration_notes(bench: BenchConfig, loader: LoaderConfig, device: torch.device, location_note: str | None):
    notes = []
    cores = os.cpu_count() or 1
    workers = loader.processes * max(1, loader.num_workers)
    if workers > cores:
        notes.append(
            f"{workers} fetching processes on {cores} CPU cores: fine while fetching waits (latency), "
            "harmful when decoding is CPU-bound"
        )
    if loader.pin_memory and device.type != "cuda":
        notes.append("pin_memory has no effect without a GPU (torch ignores it)")
    if location_note:
        notes.append(location_note)
    return notes


def records_for(bench, loader, per_process, env, compute_desc, ram_budget, notes) -> list[LoaderRecord]:
    return [
        epoch_record(bench, loader, [process[epoch] for process in per_process], env, compute_desc, ram_budget, notes)
        for epoch in range(bench.epochs)
    ]
