"""The result record, the environment it ran in, and the CSV / Markdown / JSONL writers.

Every row carries its full configuration and environment, so a number pasted into a
write-up can be traced back to the machine, library versions, numeric flags and commit
that produced it. CSV and JSONL files accumulate rows (each appended and flushed the
moment it exists); a Markdown file is a rendering, rewritten after every row.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import math
import os
import platform
import socket
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pandas as pd
import torch
from tabulate import tabulate

from cs336_systems.anomalies import flag_anomalies
from cs336_systems.profiling import StepProfile
from cs336_systems.stats import Summary, is_noisy, summarize

STATUSES = ("ok", "oom", "error", "unsupported", "timeout")
OUTPUT_SUFFIXES = (".csv", ".md", ".jsonl")
GIT_COMMIT_ENV = "CS336_SYSTEMS_GIT_COMMIT"  # set where the harness runs from a copy without .git


class ResultFileError(ValueError):
    """An output path we cannot write to as asked (bad suffix, mismatched columns)."""


@dataclass(frozen=True)
class Environment:
    """Where a row was measured. Collected once per process and device."""

    device_name: str
    torch_version: str
    cuda_version: str | None
    cudnn_version: int | None
    python_version: str
    platform: str
    cpu_name: str
    device_memory_bytes: int | None
    num_threads: int
    hostname: str
    git_commit: str
    git_dirty: bool | None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _physical_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


# The harness's own outputs: a checkout that differs only here still runs committed code.
OUTPUT_DIRS = ("results", "writeup")


def checkout_state(root: Path) -> tuple[str, bool | None]:
    """(commit, dirty) of the git checkout at `root`; dirty means tracked files differ from
    HEAD outside OUTPUT_DIRS, so regenerating results one after another stays clean."""
    if not (root / ".git").exists():
        return "unknown", None
    excludes = [f":(exclude){name}" for name in OUTPUT_DIRS]
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--", ".", *excludes],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown", None
    return commit, bool(status.strip())


@functools.cache
def harness_commit() -> tuple[str, bool | None]:
    """(commit, dirty) of the checkout this package runs from; 'unknown' outside git."""
    if os.environ.get(GIT_COMMIT_ENV):
        return os.environ[GIT_COMMIT_ENV], None
    return checkout_state(Path(__file__).resolve().parent.parent)


def collect_environment(device: torch.device) -> Environment:
    commit, dirty = harness_commit()
    cpu_name = _cpu_name()
    if device.type == "cuda":
        device_memory = torch.cuda.get_device_properties(device).total_memory
    else:
        device_memory = _physical_memory_bytes()
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name
    return Environment(
        device_name=device_name,
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda,
        cudnn_version=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        python_version=platform.python_version(),
        platform=platform.platform(),
        cpu_name=cpu_name,
        device_memory_bytes=device_memory,
        num_threads=torch.get_num_threads(),
        hostname=socket.gethostname(),
        git_commit=commit,
        git_dirty=dirty,
    )


def utc_timestamp() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


class ResultRecord(Protocol):
    def to_row(self) -> dict[str, object]:
        """Flat scalar fields: one CSV / Markdown row."""
        ...

    def to_json(self) -> dict[str, object]:
        """The row plus raw samples: one JSONL line."""
        ...


def samples_field():
    """A list of raw samples: kept in JSONL, left out of CSV and Markdown rows."""
    return field(default_factory=list, metadata={"samples": True})


class Record:
    """Base of every result record (a dataclass with an `environment` field).

    The row is the record's scalar fields followed by the environment's fields; raw
    samples (fields made with `samples_field`) go to JSONL only.
    """

    environment: Environment | None

    @classmethod
    def _scalar_fields(cls) -> list[dataclasses.Field]:
        return [f for f in dataclasses.fields(cls) if f.name != "environment" and not f.metadata.get("samples")]

    @classmethod
    def row_fields(cls) -> tuple[str, ...]:
        return tuple(f.name for f in cls._scalar_fields()) + ENVIRONMENT_FIELDS

    def to_row(self) -> dict[str, object]:
        row = {f.name: getattr(self, f.name) for f in self._scalar_fields()}
        env = dataclasses.asdict(self.environment) if self.environment else dict.fromkeys(ENVIRONMENT_FIELDS)
        return {**row, **env}

    def to_json(self) -> dict[str, object]:
        samples = {f.name: list(getattr(self, f.name)) for f in dataclasses.fields(self) if f.metadata.get("samples")}
        return {**self.to_row(), **samples}


ENVIRONMENT_FIELDS = tuple(f.name for f in dataclasses.fields(Environment))


@dataclass
class BenchmarkRecord(Record):
    """One configuration of `benchmark`: what was asked, what happened, where."""

    # configuration (the fields before `num_params` identify a configuration; see CONFIG_FIELDS)
    model_size: str
    d_model: int
    d_ff: int
    num_layers: int
    num_heads: int
    vocab_size: int
    rope_theta: float
    attention: str
    model_factory: str | None
    context_length: int
    batch_size: int
    pass_type: str
    precision: str
    compile: bool
    compile_scope: str | None
    compile_mode: str | None
    cuda_graphs: bool
    device: str
    timer: str
    warmup_steps: int
    measure_steps: int
    seed: int
    # outcome
    num_params: int | None
    model_context_length: int  # longest sequence the model was built for (sweeps: the longest context)
    status: str
    error: str | None = None
    mean_ms: float | None = None
    std_ms: float | None = None
    cv_pct: float | None = None
    median_ms: float | None = None
    min_ms: float | None = None
    max_ms: float | None = None
    p10_ms: float | None = None
    p90_ms: float | None = None
    tokens_per_s: float | None = None
    compile_s: float | None = None
    # per phase, from the measured steps (timing.py): mean and median ms; forward rows have
    # only forward, forward-backward rows no optimizer, CUDA-graph rows none
    forward_ms: float | None = None
    backward_ms: float | None = None
    optimizer_ms: float | None = None
    forward_median_ms: float | None = None
    backward_median_ms: float | None = None
    optimizer_median_ms: float | None = None
    # the profiled step after the measured ones (profiling.py); None with --no-profile-step
    kernels_per_step: int | None = None
    device_busy_pct: float | None = None
    # work and utilisation (cs336_systems.flops)
    flops_per_step: int | None = None
    flops_source: str | None = None
    achieved_tflops: float | None = None
    peak_tflops: float | None = None
    peak_source: str | None = None
    mfu: float | None = None
    # memory (cs336_systems.memory): steady state = the last step, first = the first step run
    memory_source: str | None = None
    peak_memory_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    predicted_memory_bytes: int | None = None
    forward_peak_bytes: int | None = None
    backward_peak_bytes: int | None = None
    optimizer_peak_bytes: int | None = None
    first_step_peak_bytes: int | None = None
    first_step_reserved_bytes: int | None = None
    first_forward_peak_bytes: int | None = None
    first_backward_peak_bytes: int | None = None
    first_optimizer_peak_bytes: int | None = None
    memory_baseline_bytes: int | None = None
    notes: str | None = None
    # numeric mode really in effect (read back from torch while the configuration ran)
    autocast_dtype: str | None = None
    matmul_precision: str | None = None
    cuda_matmul_allow_tf32: bool | None = None
    cudnn_allow_tf32: bool | None = None
    grad_scaler: bool | None = None
    timestamp: str = field(default_factory=utc_timestamp)
    environment: Environment | None = None
    step_ms: list[float] = samples_field()
    warmup_step_ms: list[float] = samples_field()
    forward_samples_ms: list[float] = samples_field()
    backward_samples_ms: list[float] = samples_field()
    optimizer_samples_ms: list[float] = samples_field()
    top_kernels: list[dict] = samples_field()  # {"name", "calls", "total_ms"} of the profiled step

    def add_summary(self, summary: Summary) -> None:
        for name, value in summary.as_dict(suffix="_ms").items():
            setattr(self, name, value)

    def add_phases(self, phase_ms: dict[str, Sequence[float]]) -> None:
        """Per-phase samples (forward, backward, optimizer) with their mean and median."""
        for name, samples in phase_ms.items():
            summary = summarize(samples)
            setattr(self, f"{name}_samples_ms", list(samples))
            setattr(self, f"{name}_ms", summary.mean)
            setattr(self, f"{name}_median_ms", summary.median)

    def add_profile(self, profile: StepProfile) -> None:
        self.kernels_per_step, self.device_busy_pct = profile.kernels_per_step, profile.device_busy_pct
        self.top_kernels = list(profile.top_kernels)


BENCHMARK_FIELDS = BenchmarkRecord.row_fields()
# What identifies a configuration: resume skips rows with these equal, compare matches on them.
CONFIG_FIELDS = BENCHMARK_FIELDS[: BENCHMARK_FIELDS.index("num_params")]


# -- Markdown rendering -------------------------------------------------------------

# Columns of the human-readable table; headers are the record's field names so the
# table parses back (read_markdown).
MARKDOWN_COLUMNS = (
    "model_size",
    "num_params",
    "context_length",
    "batch_size",
    "pass_type",
    "precision",
    "compile",
    "attention",
    "device",
    "status",
    "mean_ms",
    "std_ms",
    "cv_pct",
    "median_ms",
    "p10_ms",
    "p90_ms",
    "forward_ms",
    "backward_ms",
    "optimizer_ms",
    "tokens_per_s",
    "achieved_tflops",
    "mfu",
    "peak_memory_gib",
    "predicted_memory_gib",
    "compile_s",
    "kernels_per_step",
    "device_busy_pct",
)
MARKDOWN_ENVIRONMENT = (
    "device_name",
    "device_memory_bytes",
    "torch_version",
    "cuda_version",
    "cudnn_version",
    "matmul_precision",
    "cuda_matmul_allow_tf32",
    "cudnn_allow_tf32",
    "num_threads",
    "cpu_name",
    "hostname",
    "git_commit",
    "git_dirty",
)


def _gib(name: str) -> Callable[[dict], float | None]:
    def convert(row: dict) -> float | None:
        value = row.get(name)
        return None if _is_missing(value) else float(value) / 2**30

    return convert


# Display columns computed from a row's fields (bytes are easier to read in GiB).
DERIVED_COLUMNS: dict[str, Callable[[dict], object]] = {
    "peak_memory_gib": _gib("peak_memory_bytes"),
    "predicted_memory_gib": _gib("predicted_memory_bytes"),
}
_DECIMALS = {"tokens_per_s": 1, "cv_pct": 1, "compile_s": 2, "achieved_tflops": 4, "peak_tflops": 4}
_DECIMALS["device_busy_pct"] = 1


def _is_missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA


def format_cell(name: str, value: object) -> str:
    if _is_missing(value):
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.{_DECIMALS.get(name, 3)}f}"
    return str(value)


# Any `<name>_gib` / `<name>_mib` column not in a row shows the row's `<name>_bytes` in that unit.
_BYTE_UNITS = {"_gib": 2**30, "_mib": 2**20}


def _in_byte_unit(row: dict, column: str) -> float | None:
    for suffix, scale in _BYTE_UNITS.items():
        if column.endswith(suffix):
            value = row.get(column.removesuffix(suffix) + "_bytes")
            return None if _is_missing(value) else float(value) / scale
    return None


def markdown_table(rows: Sequence[dict], columns: Sequence[str] = MARKDOWN_COLUMNS) -> str:
    def value(row: dict, column: str) -> object:
        if column not in row and column in DERIVED_COLUMNS:
            return DERIVED_COLUMNS[column](row)
        if column not in row:
            return _in_byte_unit(row, column)
        return row.get(column)

    body = [[format_cell(c, value(row, c)) for c in columns] for row in rows]
    return tabulate(body, headers=list(columns), tablefmt="github", disable_numparse=True)


LABEL_COLUMNS = ("model_size", "context_length", "batch_size", "pass_type", "precision")


def row_label(row: dict, label_columns: Sequence[str] = LABEL_COLUMNS) -> str:
    return " ".join(f"{name}={format_cell(name, row.get(name))}" for name in label_columns if name in row)


def row_warnings(row: dict, label_columns: Sequence[str] = LABEL_COLUMNS) -> list[str]:
    """Lines a reader must see below the table: noise, failures, caveats."""
    label = row_label(row, label_columns)
    lines = []
    if row.get("status") not in (None, "ok"):
        lines.append(f"{label}: status {row['status']}: {row.get('error') or ''}".rstrip(": "))
    if is_noisy(None if _is_missing(row.get("cv_pct")) else float(row["cv_pct"])):
        lines.append(f"{label}: WARNING high variance, CV {float(row['cv_pct']):.1f}% > 10%; treat the mean with care")
    if not _is_missing(row.get("notes")) and row.get("notes"):
        lines.append(f"{label}: note: {row['notes']}")
    return lines


def environment_lines(rows: Sequence[dict]) -> list[str]:
    lines = []
    for name in MARKDOWN_ENVIRONMENT:
        values = sorted({format_cell(name, row.get(name)) for row in rows} - {""})
        if values:
            lines.append(f"- {name}: {', '.join(values)}")
    return lines


def render_markdown(
    rows: Sequence[dict],
    title: str = "cs336-systems benchmark results",
    columns: Sequence[str] = MARKDOWN_COLUMNS,
    label_columns: Sequence[str] = LABEL_COLUMNS,
) -> str:
    """Title, table, per-row notes (failures, noise, caveats), environment, conventions."""
    parts = [f"# {title}", "", markdown_table(rows, columns), ""]
    warnings = [line for row in rows for line in row_warnings(row, label_columns)]
    anomalies = flag_anomalies(rows)
    warnings += [f"{row_label(rows[i], label_columns)}: SLOW: {why}" for i, why in sorted(anomalies.items())]
    if warnings:
        parts += ["Notes:", "", *(f"- {line}" for line in warnings), ""]
    env = environment_lines(rows)
    if env:
        parts += ["Environment:", "", *env, ""]
    parts.append("std is the sample standard deviation (ddof=1); cv_pct = 100*std/mean; p10/p90 interpolate linearly.")
    return "\n".join(parts) + "\n"


# -- writers ------------------------------------------------------------------------


class CsvWriter:
    """Appends rows; writes the header only to a new file; refuses a file with other columns."""

    def __init__(self, path: Path, fields: Sequence[str]):
        self.path, self.fields = path, list(fields)
        existing = _read_csv_header(path)
        if existing is not None and existing != self.fields:
            raise ResultFileError(f"{path} already holds results with different columns; write to a new file")
        self._needs_header = existing is None

    def write(self, record: ResultRecord) -> None:
        row = record.to_row()
        frame = pd.DataFrame([[row.get(name) for name in self.fields]], columns=self.fields)
        with self.path.open("a", newline="") as handle:
            frame.to_csv(handle, header=self._needs_header, index=False)
            handle.flush()
        self._needs_header = False


def _read_csv_header(path: Path) -> list[str] | None:
    if not path.exists() or path.stat().st_size == 0:
        return None
    with path.open(newline="") as handle:
        return pd.read_csv(handle, nrows=0).columns.tolist()


class JsonlWriter:
    def __init__(self, path: Path):
        self.path = path

    def write(self, record: ResultRecord) -> None:
        line = json.dumps(record.to_json(), default=str, allow_nan=True)
        with self.path.open("a") as handle:
            handle.write(line + "\n")
            handle.flush()


class MarkdownWriter:
    """Re-renders the whole document after each row, atomically (temp file + rename)."""

    def __init__(self, path: Path, render: Callable[[Sequence[dict]], str], rows: Iterable[dict] = ()):
        self.path, self.render, self.rows = path, render, list(rows)

    def write(self, record: ResultRecord) -> None:
        self.rows.append(record.to_row())
        temporary = self.path.with_name(self.path.name + ".tmp")
        temporary.write_text(self.render(self.rows))
        os.replace(temporary, self.path)


def check_output_paths(paths: Iterable[str | Path]) -> list[Path]:
    """Validate suffixes and parent directories before any work starts."""
    checked = []
    for raw in paths:
        path = Path(raw)
        if path.suffix not in OUTPUT_SUFFIXES:
            raise ResultFileError(f"--output {raw}: unknown suffix, use one of {', '.join(OUTPUT_SUFFIXES)}")
        if path.parent and not path.parent.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
        checked.append(path)
    return checked


class ResultSink:
    """Sends each finished record to every output file at once."""

    def __init__(
        self,
        paths: Iterable[str | Path],
        fields: Sequence[str] = BENCHMARK_FIELDS,
        render: Callable[[Sequence[dict]], str] = render_markdown,
        previous_rows: Iterable[dict] = (),
    ):
        self.writers = []
        for path in check_output_paths(paths):
            if path.suffix == ".csv":
                self.writers.append(CsvWriter(path, fields))
            elif path.suffix == ".jsonl":
                self.writers.append(JsonlWriter(path))
            else:
                self.writers.append(MarkdownWriter(path, render, previous_rows))

    def write(self, record: ResultRecord) -> None:
        for writer in self.writers:
            writer.write(record)


# -- readers ------------------------------------------------------------------------


def read_markdown(path: str | Path) -> pd.DataFrame:
    """The first pipe table of a Markdown file, with numbers parsed back."""
    lines = [line.strip() for line in Path(path).read_text().splitlines()]
    table = []
    for line in lines:
        if line.startswith("|"):
            table.append(line)
        elif table:
            break
    if len(table) < 2:
        return pd.DataFrame()
    split = [[cell.strip() for cell in line.strip("|").split("|")] for line in table]
    header, body = split[0], split[2:]
    frame = pd.DataFrame(body, columns=header).replace("", None)
    for column in frame.columns:
        converted = pd.to_numeric(frame[column], errors="coerce")
        if converted.notna().sum() == frame[column].notna().sum():
            frame[column] = converted
    return frame


def read_results(path: str | Path) -> pd.DataFrame:
    """Rows of a .csv, .jsonl or .md result file as a DataFrame."""
    path = Path(path)
    if path.suffix == ".csv":
        return _with_added_config_columns(pd.read_csv(path))
    if path.suffix == ".jsonl":
        return _with_added_config_columns(pd.read_json(path, lines=True, dtype=False))
    if path.suffix == ".md":
        return read_markdown(path)  # a rendering: only its columns
    raise ResultFileError(f"{path}: unknown suffix, expected one of {', '.join(OUTPUT_SUFFIXES)}")


def _with_added_config_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """Benchmark files written before compile_mode and cuda_graphs existed: their rows ran
    torch.compile's default mode (when compiled) and no CUDA graph, so they still match."""
    if "compile" not in frame.columns:
        return frame
    if "compile_mode" not in frame.columns:
        compiled = frame["compile"].astype(str).str.lower() == "true"
        frame["compile_mode"] = compiled.map({True: "default", False: None}).astype(object)
    if "cuda_graphs" not in frame.columns:
        frame["cuda_graphs"] = False
    return frame
