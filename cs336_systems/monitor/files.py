"""The monitor's files: the time-series CSV, the plot, the run's JSON record, and `monitored`."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import shlex
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ..argtypes import output_path, positive_float
from ..errors import UsageError
from ..identity import identity_field
from ..results.errors import ResultFileError, ResultWriteError
from ..results.origin import TOOL
from ..results.paths import check_distinct, check_output_path
from ..results.records import Record
from ..results.writing import append_line, write_whole
from ..terminal import show
from .sampling import (
    DEFAULT_INTERVAL_S,
    METRIC_DIVISORS,
    METRICS,
    PANELS,
    SAMPLE_FIELDS,
    ResourceMonitor,
    Sample,
)

# -- summaries and files -------------------------------------------------------------------


def summarize_samples(samples: Sequence[Sample]) -> dict[str, dict[str, float] | None]:
    """{metric: {mean, p50, p90, max}} in the metric's own unit (bytes, %, bytes/s); None if empty."""
    from ..stats import summarize

    out: dict[str, dict[str, float] | None] = {}
    for name, _, _ in METRICS:
        values = [getattr(s, name) for s in samples if getattr(s, name) is not None]
        if not values:
            out[name] = None
            continue
        summary = summarize(values)
        out[name] = {"mean": summary.mean, "p50": summary.median, "p90": summary.p90, "max": summary.max}
    return out


def summary_table(summary: dict[str, dict[str, float] | None]) -> str:
    from tabulate import tabulate

    rows = []
    for name, label, divisor in METRICS:
        stats = summary.get(name)
        cells = ["" if stats is None else f"{stats[k] / divisor:.2f}" for k in ("mean", "p50", "p90", "max")]
        rows.append([label, *cells])
    return tabulate(rows, headers=["metric", "mean", "p50", "p90", "max"], tablefmt="github", disable_numparse=True)


class MonitorPathError(UsageError):
    """A --monitor / --output path we refuse (wrong suffix, would overwrite a time series)."""


def check_monitor_path(path: str | Path, flag: str = "--monitor") -> Path:
    """The CSV path, checked before any work starts; its .png and .json go beside it."""
    if str(path).endswith("/"):
        raise MonitorPathError(f"{flag} {path}: ends in '/': give a file name, not a directory")
    path = Path(path)
    if path.suffix != ".csv":
        raise MonitorPathError(f"monitor output {path}: must end in .csv (the .png and .json go beside it)")
    for existing in (path, path.with_suffix(".png"), path.with_suffix(".json")):
        if existing.exists():
            raise MonitorPathError(f"monitor output {existing} already exists; choose a new name")
    for written in (path, path.with_suffix(".png"), path.with_suffix(".json")):
        try:
            check_output_path(written, flag)
        except ResultFileError as exc:
            raise MonitorPathError(str(exc)) from None
    return path


class SampleCsvWriter:
    """Appends each sample to the CSV as it is taken, one whole line per write, so a run killed
    midway keeps its rows. A failed write (a full disk) is truncated back to the last whole row
    and stops the file (the samples stay in memory for the summary); `error` says what happened."""

    def __init__(self, path: Path):
        self.path = path
        self.error: ResultWriteError | None = None
        self.rows = 0
        try:
            append_line(path, ",".join((TOOL, *SAMPLE_FIELDS)) + "\n", inject=False)
        except ResultWriteError as exc:  # a disk full from the start: the run is still measured and summarised
            self.error = exc

    def __call__(self, sample: Sample) -> None:
        if self.error is not None:
            return
        cells = (
            "" if v is None else (f"{v:.6f}" if isinstance(v, float) else str(v))
            for v in ("monitor", *dataclasses.astuple(sample))
        )
        try:
            append_line(self.path, ",".join(cells) + "\n", inject=False)
            self.rows += 1
        except ResultWriteError as exc:  # called on the sampling thread: never raise into it
            self.error = exc

    def close(self) -> None:
        pass  # each row is written and closed at once


def plot_samples(samples: Sequence[Sample], path: Path, title: str, gpu_note: str | None = None) -> None:
    """One panel per metric over time (the PNG written beside the CSV)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(PANELS), 1, figsize=(9, 2.0 * len(PANELS)), sharex=True)
    t = [s.t_s for s in samples]
    for ax, (label, names) in zip(axes, PANELS):
        drawn = False
        for name in names:
            values = [getattr(s, name) for s in samples]
            if all(v is None for v in values):
                continue
            ys = [math.nan if v is None else v / METRIC_DIVISORS[name] for v in values]
            ax.plot(t, ys, marker=".", markersize=3, linewidth=1, label=name)
            drawn = True
        if not drawn:
            ax.text(
                0.5,
                0.5,
                gpu_note if names[0].startswith("gpu") and gpu_note else "no data",
                ha="center",
                va="center",
                transform=ax.transAxes,
                color="gray",
            )
            ax.set_yticks([])
        elif len(names) > 1:
            ax.legend(loc="best", fontsize=7)
        ax.set_ylabel(label, fontsize=8)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("time since start (s)")
    fig.suptitle(title, fontsize=9, parse_math=False)  # a command's $ is text, not mathtext
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=90, format="png")
    plt.close(fig)
    write_whole(path, buffer.getvalue())  # whole, never through a link; ResultWriteError on a full disk


@dataclass
class MonitorReport(Record):
    """What is written to the .json beside the CSV: enough to reproduce and read the run.
    Its status is the command's: 'ok' when it exited 0 (or ran in-process), else 'error'."""

    tool: ClassVar[str] = "monitor_run"

    command: str = identity_field()
    interval_s: float = identity_field()
    exit_status: int | None
    started_unix_s: float | None
    duration_s: float | None
    num_samples: int
    cpu_count: int
    gpu: str
    gpu_names: list[str]
    monitor_cpu_s: float
    summary: dict


def write_report(
    monitor: ResourceMonitor, csv_path: Path, command: str, exit_status: int | None, unwritten: list
) -> MonitorReport:
    """JSON and PNG beside the CSV; returns the report (its summary is printed by the callers, whatever
    could be written). A file a full disk kept from being written is a ResultWriteError added to `unwritten`."""
    import torch

    from ..results import collect_environment

    summary = summarize_samples(monitor.samples)
    note = None if monitor.gpu.available else f"no GPU: {monitor.gpu.unavailable_reason}"
    title = " ".join(command.split())
    failed = exit_status not in (None, 0)
    report = MonitorReport(
        command=command,
        interval_s=monitor.interval_s,
        exit_status=exit_status,
        started_unix_s=monitor.started_unix_s,
        duration_s=monitor.duration_s,
        num_samples=len(monitor.samples),
        cpu_count=monitor.cpu_count,
        gpu=monitor.gpu.describe(),
        gpu_names=monitor.gpu.names,
        monitor_cpu_s=monitor.monitor_cpu_s,
        summary=summary,
        status="error" if failed else "ok",
        error=f"the command exited with status {exit_status}" if failed else None,
        environment=collect_environment(torch.device("cpu")),
    )
    # Nested JSON (summary per metric, environment as an object), not the flat row a table needs.
    text = json.dumps(dataclasses.asdict(report), indent=2, default=str) + "\n"
    for write in (
        lambda: write_whole(csv_path.with_suffix(".json"), text),
        lambda: plot_samples(
            monitor.samples, csv_path.with_suffix(".png"), title if len(title) < 120 else title[:117] + "...", note
        ),
    ):
        try:
            write()
        except ResultWriteError as exc:
            unwritten.append(exc)
    return report


def report_text(report: MonitorReport, csv_path: Path) -> str:
    lines = [
        f"monitor: {report.num_samples} samples every {report.interval_s:g} s over {report.duration_s or 0:.1f} s "
        f"of `{report.command}`" + ("" if report.exit_status is None else f" (exit status {report.exit_status})"),
        report.gpu,
        f"CPU percentages are of all {report.cpu_count} cores; the monitor itself used {report.monitor_cpu_s:.2f} s CPU",
        "",
        summary_table(report.summary),
        "",
        f"wrote {csv_path}, {csv_path.with_suffix('.png')}, {csv_path.with_suffix('.json')}",
    ]
    return "\n".join(lines)


@contextlib.contextmanager
def monitored(
    path: str | Path | None,
    interval_s: float = DEFAULT_INTERVAL_S,
    label: str | None = None,
    root_pid: int | None = None,
) -> Iterator[ResourceMonitor | None]:
    """Monitor the code inside the `with` (this process and its children) into `path`
    (.csv, plus .png and .json beside it) and print the summary on stderr. `path=None`
    does nothing, so a CLI can pass its optional --monitor straight through."""
    if path is None:
        yield None
        return
    csv_path = check_monitor_path(path)
    writer = SampleCsvWriter(csv_path)
    monitor = ResourceMonitor(interval_s, root_pid=root_pid, on_sample=writer)
    try:
        with monitor:
            yield monitor
    finally:
        writer.close()
        unwritten = [writer.error] if writer.error is not None else []
        report = write_report(monitor, csv_path, label or shlex.join(sys.argv), None, unwritten)
        show(report_text(report, csv_path), sys.stderr)  # the summary, whatever a full disk kept from the files
        for exc in unwritten:  # a full disk: said; the tool's own results go on
            show(f"monitor: error: {exc.strerror}", sys.stderr)


def add_monitor_arguments(parser) -> None:
    """`--monitor PATH.csv` and `--monitor-interval S`, the same in every command."""
    group = parser.add_argument_group("resource monitor")
    group.add_argument(
        "--monitor",
        type=output_path,
        metavar="PATH.csv",
        help="sample GPU/CPU/memory/network/disk during the run into PATH.csv (+ .png, .json beside it)",
    )
    group.add_argument(
        "--monitor-interval",
        type=positive_float,
        default=DEFAULT_INTERVAL_S,
        metavar="SECONDS",
        help=f"seconds between samples ({DEFAULT_INTERVAL_S:g})",
    )


def check_monitor_arguments(args) -> None:
    """Raise MonitorPathError (a ValueError) for a bad --monitor path or interval."""
    if args.monitor is not None:
        if not args.monitor_interval > 0:
            raise MonitorPathError(f"--monitor-interval must be positive, got {args.monitor_interval}")
        csv_path = check_monitor_path(args.monitor)
        outputs = [Path(path) for path in args.output]  # every tool with --monitor has --output
        try:  # the monitor's three files and the tool's results must be different files
            check_distinct(
                [
                    ("--monitor", csv_path),
                    ("--monitor's JSON", csv_path.with_suffix(".json")),
                    ("--monitor's PNG", csv_path.with_suffix(".png")),
                    *(("--output", o) for o in outputs),
                ]
            )
        except ResultFileError as exc:
            raise MonitorPathError(str(exc)) from None
