"""From the rows of every tool to one Document, sections in the handout's order."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import attention, benchmark, distributed, handout, observed, plots
from .document import Document, Section
from .environment import environment_section

# The handout's order; a section exists only when its rows do.
ORDER = (
    "Handout plan",
    "Environment",
    "End-to-end benchmarking",
    "Warmup effect",
    "Mixed-precision accumulation",
    "Mixed precision",
    "Memory",
    "Residuals saved for backward",
    "Attention",
    "torch.compile of attention",
    "torch.compile of the whole model",
    "FlashAttention against PyTorch attention",
    "All-reduce",
    "Data-parallel training",
    "Input pipeline",
    "Largest that fits",
    "Your training loop",
    "Resources over a run",
    "Notes",
)


def build_document(frames: dict[str, pd.DataFrame], directory: Path, stem: str, paragraphs: list[str]) -> Document:
    """`frames` maps a tool (load.TOOLS) to its rows; plots are written to `directory` as `stem`_*.png."""
    sections: list[Section] = []
    notes: list[str] = []
    if "handout" in frames:
        sections += handout.plan_sections(frames["handout"], directory)
    if "benchmark" in frames:
        found, found_notes = benchmark.sections(frames["benchmark"])
        found[0].figures = plots.benchmark_plots(frames["benchmark"], directory, stem)
        sections += found
        notes += found_notes
    if "warmup_study" in frames:
        section = distributed.warmup_section(frames["warmup_study"])
        section.figures = plots.warmup_plot(frames["warmup_study"], directory, stem)
        sections.append(section)
    if "attention_bench" in frames:
        found, found_notes = attention.sections(frames["attention_bench"])
        sections += found
        notes += found_notes
    if "allreduce_bench" in frames:
        section, found_notes = distributed.allreduce_section(frames["allreduce_bench"])
        section.figures = plots.allreduce_plot(frames["allreduce_bench"], directory, stem)
        sections.append(section)
        notes += found_notes
    for tool, make in (("ddp_bench", distributed.ddp_section), ("loader_bench", distributed.loader_section)):
        if tool in frames:
            section, found_notes = make(frames[tool])
            sections.append(section)
            notes += found_notes
    for tool, make in (("find_max", observed.find_max_section), ("probe", observed.probe_section)):
        if tool in frames:
            sections.append(make(frames[tool]))
    if "monitor" in frames or "monitor_run" in frames:
        sections.append(observed.monitor_section(frames.get("monitor"), frames.get("monitor_run")))
    environment = environment_section([frames[t] for t in frames if t not in ("monitor", "monitor_run", "find_max")])
    if environment:
        sections.append(environment)
    if notes:
        sections.append(
            Section("Notes", None, ["Failures, noisy rows, slow rows and caveats, row by row."], bullets=notes)
        )
    sections.sort(key=lambda s: ORDER.index(s.title))
    return Document("Benchmark report", paragraphs, sections)
