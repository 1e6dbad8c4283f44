"""From result files to one Document: a report of the results as they are, a section per kind of
row, every table one row per cell (grid.py)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import attention, benchmark, distributed, observed, plots
from .document import Document, Section, Text
from .fields import label_text
from .observe import NOT_COMPARED, describe_rows, maker, number, observations, ok, say, times, versus
from .summary import environment_table


def build_document(
    frames: dict[str, pd.DataFrame],
    directory: Path,
    stem: str,
    paragraphs: list[str],
) -> Document:
    """`frames` maps a tool (its rows' `tool` column) to its rows, each with its file's name in `source`;
    plots go to `directory` as `stem`_*.png."""
    sections: list[Section] = []
    by_file = {str(s): rows for tool, frame in frames.items() for s, rows in frame.groupby("source", sort=False)}
    used = {
        name: rows
        for name, rows in by_file.items()
        if "device_name" in rows.columns and "torch_version" in rows.columns
    }
    if used:  # where, and how busy the machine was: no sentence below compares rows measured busy
        load = observations(describe_rows, pd.concat(list(used.values()), ignore_index=True))
        sections.append(Section("Environment").add(environment_table(used), load))
    if "benchmark" in frames:
        sections += benchmark_sections(frames["benchmark"], directory, stem)
    if "warmup_study" in frames:
        warmup = frames["warmup_study"]
        sections.append(
            _section("Warmup effect", "warmup").add(
                benchmark.warmup_table(warmup), *plots.warmup_plot(warmup, directory, stem)
            )
        )
    if "attention_bench" in frames:
        sections.append(attention_section(frames["attention_bench"], directory, stem))
    if "allreduce_bench" in frames:
        rows = frames["allreduce_bench"]
        sections.append(
            _section("All-reduce", "allreduce").add(
                *distributed.allreduce_tables(rows), *plots.allreduce_plot(rows, directory, stem)
            )
        )
    if "ddp_bench" in frames:
        sections.append(ddp_section(frames["ddp_bench"]))
    for tool, make in (
        ("loader_bench", observed.loader_section),
        ("find_max", observed.find_max_section),
        ("probe", observed.probe_section),
    ):
        if tool in frames:
            sections.append(make(frames[tool]))
    if "monitor" in frames or "monitor_run" in frames:
        sections.append(observed.monitor_section(frames.get("monitor"), frames.get("monitor_run")))
    return Document("Benchmark report", paragraphs, sections)


def _section(title: str, anchor: str) -> Section:
    return Section(title, anchor)


def benchmark_sections(frame: pd.DataFrame, directory: Path, stem: str) -> list[Section]:
    """Step time per context (one table per device and pass), phases, speedups, memory, MFU."""
    timing = _section("Step time", "step-time")
    for (device, pass_type), rows in frame.groupby(["device_name", "pass_type"], dropna=False, sort=False):
        title = f"{pass_type} step time, {device}"
        timing.add(benchmark.context_table(rows, title))
        first = rows.iloc[0].to_dict()
        where = {key: label_text(key, first) for key in ("device_name", "pass_type")}
        timing.add(observations(floor_observations, rows, "benchmark", where))
        timing.add(*plots.context_plot(rows, directory, f"{stem}_{_slug(device)}_{_slug(pass_type)}", title))
    sections = [timing]
    phased = frame[
        [
            any(pd.notna(r.get(f"{p}_mean_ms")) for p in ("forward", "backward", "optimizer"))
            for r in frame.to_dict("records")
        ]
    ]
    if not phased.empty:
        sections.append(_section("Phases", "phases").add(benchmark.phase_table(phased, "Time per phase")))
    for key, base, others, title in (
        ("precision", "fp32", ("bf16", "fp16", "tf32"), "Mixed precision"),
        ("compile", "eager", ("compiled",), "torch.compile of the whole model"),
    ):
        section = _section(title, key)
        for other in others:
            if benchmark.has(frame, key, base) and benchmark.has(frame, key, other):
                both = frame[[label_text(key, r) in (base, other) for r in frame.to_dict("records")]]
                section.add(
                    benchmark.speedup_table(
                        both,
                        key,
                        base,
                        other,
                        f"{other} against {base}",
                        labels=[("model", "model"), ("context", "context_length"), ("pass", "pass_type")],
                    )
                )
        if section.blocks:
            sections.append(section)
    if "peak_memory_bytes" in frame and frame["peak_memory_bytes"].notna().any():
        memory = _section("Memory", "memory")
        for device, rows in frame.groupby("device_name", dropna=False, sort=False):
            memory.add(
                benchmark.memory_table(
                    rows,
                    f"Peak memory, {device}",
                    benchmark.peak_columns(rows),
                    labels=[("model", "model"), ("context", "context_length")],
                )
            )
        sections.append(memory)
    if "mfu" in frame and frame["mfu"].notna().any():
        mfu = Section("Model FLOP utilisation", None)
        for (device, pass_type), rows in frame.groupby(["device_name", "pass_type"], dropna=False, sort=False):
            mfu.add(benchmark.mfu_table(rows, f"{pass_type}, {device}"))
        sections.append(mfu)
    return sections


@maker
def floor_observations(rows: list[dict]) -> list[str]:
    """Where a model's step time stops growing with the work: a floor the device's work does not set
    (kernel launches and the host, when the rows say how many kernels a step launches). The time ratio
    is a claim: said only where its whole interval lies below 1.15x (none from rows measured busy)."""
    lines = []
    for (model, precision), group in _by(ok(rows), ("model", "precision")).items():
        ordered = sorted(group, key=lambda r: number(r, "context_length") or 0)
        for a, b in zip(ordered, ordered[1:], strict=False):
            work = (number(b, "flops_per_step") or 0) / (number(a, "flops_per_step") or 1)
            claim = versus(b, a)
            if claim is None or claim.verdict == NOT_COMPARED or work < 1.8 or claim.high >= 1.15:
                continue
            contexts = [f"context {label_text('context_length', r)}" for r in (b, a)]
            text = f"{model}, {precision}: {times(work)} the FLOPs; {say(claim, *contexts, 'time')}: a floor the arithmetic does not set"
            kernels, median = number(a, "kernels_per_step"), number(a, "median_ms")
            if kernels and median:
                text += f"; {kernels:.0f} kernels per step at {1000 * median / kernels:.1f} us each would make it"
            lines.append(text + ".")
            break
    return lines


def _by(rows: list[dict], keys: tuple[str, ...]) -> dict[tuple, list[dict]]:
    found: dict[tuple, list[dict]] = {}
    for row in rows:
        found.setdefault(tuple(label_text(k, row) if k != "model" else row["model"] for k in keys), []).append(row)
    return found


def _slug(text: object) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in str(text).lower()).strip("_")


def attention_section(frame: pd.DataFrame, directory: Path, stem: str) -> Section:
    section = _section("Attention", "attention")
    section.add(attention.timing_table(frame, "Attention: time and memory per shape"))
    names = attention.implementations(frame)
    for base in ("naive", "sdpa"):
        for other in names:
            if base in names and other != base and (other == "compiled" or other.startswith("flash")):
                section.add(attention.speedup_only_table(frame, base, other, f"Speedup of {other} over {base}"))
    section.add(*plots.attention_plot(frame, directory, f"{stem}_attention"))
    return section


def ddp_section(frame: pd.DataFrame) -> Section:
    section = _section("Data-parallel training", "data-parallel")
    section.add(Text("One table row per measured configuration: strategies are never folded together."))
    for source, rows in frame.groupby("source", sort=False):
        section.add(distributed.ddp_time_table(rows, f"Time per training step: {source}"))
        section.add(distributed.held_table(rows, f"Bytes each rank holds: {source}"))
        section.add(distributed.peaks_table(rows, f"Peak memory of a rank: {source}"))
        section.add(distributed.breakdown_table(rows, f"What a rank's memory holds at each peak: {source}"))
    return section
