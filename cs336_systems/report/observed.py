"""Sections for the tools that watch a run rather than time a configuration: monitor (resources over
time), probe (the user's own loop, window by window), find_max (the largest that fits) and
loader_bench (the input pipeline). Not handout problems: they appear in a report of results."""

from __future__ import annotations

import pandas as pd

from .document import Section, Table, Text, sig3
from .grid import Value, grid
from .spec import Spec

# monitor's columns: header, scale (bytes shown in GiB, rates in MB/s as monitor prints them)
MONITOR_METRICS = {
    "gpu_util_pct": ("GPU utilisation (%)", 1),
    "gpu_memory_used_bytes": ("GPU memory used (GiB)", 2**30),
    "system_cpu_pct": ("CPU, whole machine (% of all cores)", 1),
    "tree_cpu_pct": ("CPU, process tree (% of all cores)", 1),
    "tree_rss_bytes": ("RSS, process tree (GiB)", 2**30),
    "system_ram_used_bytes": ("System RAM used (GiB)", 2**30),
    "net_recv_bytes_per_s": ("Network receive (MB/s)", 1e6),
    "net_sent_bytes_per_s": ("Network send (MB/s)", 1e6),
    "disk_read_bytes_per_s": ("Disk read (MB/s)", 1e6),
    "disk_write_bytes_per_s": ("Disk write (MB/s)", 1e6),
}


def monitor_frame(rows: pd.DataFrame) -> pd.DataFrame:
    """Mean, p50, p90 and max of each sampled metric of one monitored run (a pure function of its samples)."""
    body = {}
    for column, (header, scale) in MONITOR_METRICS.items():
        values = pd.to_numeric(rows.get(column, pd.Series(dtype=float)), errors="coerce").dropna() / scale
        cells = [values.mean(), values.quantile(0.5), values.quantile(0.9), values.max()] if len(values) else []
        body[header] = [sig3(v) for v in cells] if cells else [""] * 4
    table = pd.DataFrame(body, index=["mean", "p50", "p90", "max"]).T
    table.index.name = "metric"
    return table


def monitor_section(frame: pd.DataFrame | None, runs: pd.DataFrame | None) -> Section:
    section = Section("Resources over a run", None)
    section.add(Text("monitor samples, summarised per run; empty GPU rows mean no GPU or no NVML driver."))
    for _, run in (runs if runs is not None else pd.DataFrame()).iterrows():
        section.add(
            Text(
                f"{run['source']}: `{run['command']}` (exit status {run['exit_status']}, "
                f"{run['num_samples']} samples every {run['interval_s']} s)."
            )
        )
    for source, rows in (frame if frame is not None else pd.DataFrame(columns=["source"])).groupby(
        "source", sort=False
    ):
        heading = f"monitor: {source} ({len(rows)} samples over {sig3(rows['t_s'].max())} s)"
        caption = f"Source: {source}."
        spec = Spec("rebuild:monitor", [str(source)], {}, [], [], heading, caption)
        section.add(Table(f"monitor_{source}", heading, caption, monitor_frame(rows), spec=spec))
    return section


# Each of these tools' rows as one table: (section, what it shows, labels, values as (header, field, format)).
PROBE = (
    "Your training loop",
    "StepProbe windows: mean step, data wait and phases per window of steps.",
    [("run", "run"), ("window", "window")],
    [
        ("first step", "first_step", "text"),
        ("last step", "last_step", "text"),
        ("step (ms)", "step_ms", "sig3"),
        ("samples/s", "samples_per_s", "sig3"),
        ("data wait (%)", "data_wait_pct", "sig3"),
        ("verdict", "verdict", "text"),
        ("phases (ms)", "phases", "text"),
    ],
)
FIND_MAX = (
    "Largest that fits",
    "find_max: doubling, then bisection, each probe a fresh process.",
    [("search", "source"), ("dimension", "dimension")],
    [
        ("largest that ran", "largest_ok", "text"),
        ("smallest out of memory", "smallest_oom", "text"),
        ("configuration", "config", "text"),
    ],
)


def _one_table(frame: pd.DataFrame, tool: str, layout: tuple) -> Section:
    title, text, labels, values = layout
    table = grid(frame, tool, title=title, labels=labels, values=[Value(*v) for v in values])
    return Section(title, None).add(Text(text), table)


def probe_section(frame: pd.DataFrame) -> Section:
    return _one_table(frame, "probe", PROBE)


def find_max_section(frame: pd.DataFrame) -> Section:
    return _one_table(frame, "find_max", FIND_MAX)


LOADER_VALUES = (
    ("samples/s", "samples_per_s", "sig3"),
    ("predicted/s", "predicted_samples_per_s", "sig3"),
    ("data wait (%)", "data_wait_pct", "sig3"),
    ("verdict", "verdict", "text"),
)


def loader_section(frame: pd.DataFrame) -> Section:
    section = Section("Input pipeline", None)
    section.add(Text("loader_bench rows, one per measured epoch and configuration (the pipeline feeding the step)."))
    for source, rows in frame.groupby("source", sort=False):
        values = [Value(h, c, f) for h, c, f in LOADER_VALUES if c in rows and rows[c].notna().any()]
        section.add(
            grid(
                rows,
                "loader_bench",
                title=f"loader_bench: {source}",
                labels=[("storage", "storage"), ("workers", "num_workers"), ("epoch", "epoch")],
                values=values,
            )
        )
    return section


def rebuild_monitor(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    return monitor_frame(next(iter(frames.values())))
