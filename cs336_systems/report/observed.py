"""Sections for the tools that watch a run rather than time a configuration: monitor (resources
over time), probe (the user's own loop, window by window) and find_max (the largest that fits)."""

from __future__ import annotations

import json

import pandas as pd

from .document import Section, Table, device_caption, plain, sig3, slug

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

PROBE_COLUMNS = {
    "run": "run",
    "first_step": "first step",
    "last_step": "last step",
    "step_ms": "step (ms)",
    "samples_per_s": "samples/s",
    "data_wait_pct": "data wait (%)",
    "verdict": "verdict",
    "phases": "phases (ms)",
}


def monitor_section(frame: pd.DataFrame | None, runs: pd.DataFrame | None) -> Section:
    """Mean, p50, p90 and max of each sampled metric, one table per monitored run; the run records
    (monitor's .json) say which command ran."""
    section = Section(
        "Resources over a run",
        None,
        ["monitor samples, summarised per run; empty GPU rows mean no GPU or no NVML driver."],
    )
    for _, run in (runs if runs is not None else pd.DataFrame()).iterrows():
        section.paragraphs.append(
            f"{run['source']}: `{run['command']}` (exit status {plain(run['exit_status'])}, "
            f"{plain(run['num_samples'])} samples every {plain(run['interval_s'])} s)."
        )
    for source, rows in (frame if frame is not None else pd.DataFrame(columns=["source"])).groupby(
        "source", sort=False
    ):
        body = {}
        for column, (header, scale) in MONITOR_METRICS.items():
            values = pd.to_numeric(rows.get(column, pd.Series(dtype=float)), errors="coerce").dropna() / scale
            cells = [values.mean(), values.quantile(0.5), values.quantile(0.9), values.max()] if len(values) else []
            body[header] = [sig3(v) for v in cells] if cells else [""] * 4
        table = pd.DataFrame(body, index=["mean", "p50", "p90", "max"]).T
        table.index.name = "metric"
        heading = f"monitor: {source} ({len(rows)} samples over {sig3(rows['t_s'].max())} s)"
        section.tables.append(
            Table(slug(f"monitor {source}"), heading, "Device: the machine the command ran on.", table)
        )
    return section


def probe_section(frame: pd.DataFrame) -> Section:
    section = Section(
        "Your training loop", None, ["StepProbe windows: mean step, data wait and phases per window of steps."]
    )
    for source, rows in frame.groupby("source", sort=False):
        body = pd.DataFrame(
            {
                header: [_probe_cell(row, column) for _, row in rows.iterrows()]
                for column, header in PROBE_COLUMNS.items()
                if column in rows
            }
        )
        heading = f"probe: {source}"
        section.tables.append(Table(slug(heading), heading, device_caption(rows), body.set_index(body.columns[0])))
    return section


def _probe_cell(row, column: str) -> str:
    value = row.get(column)
    return sig3(value) if column in ("step_ms", "samples_per_s", "data_wait_pct") else plain(value)


def find_max_section(frame: pd.DataFrame) -> Section:
    """find_max's answers: the largest value that ran and the smallest that ran out of memory."""
    body = []
    for _, row in frame.iterrows():
        probes = json.loads(row["probes"]) if isinstance(row.get("probes"), str) else []
        body.append(
            {
                "search": plain(row.get("source")),
                "configuration": plain(row.get("config")),
                "dimension": plain(row["dimension"]),
                "largest that ran": plain(row["largest_ok"]),
                "smallest out of memory": plain(row["smallest_oom"]),
                "probes": ", ".join(f"{value} {status}" for value, status in probes),
            }
        )
    table = pd.DataFrame(body).set_index("search")
    return Section(
        "Largest that fits",
        None,
        ["find_max: doubling, then bisection, each probe a fresh process."],
        [Table("find_max", "find_max", "Device: as recorded in each search's configuration.", table)],
    )
