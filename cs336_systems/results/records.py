"""Result records: one base schema, the timing statistics declared once, identity marked.

A record is a dataclass whose fields are its columns. The base `Record` declares what every
row has (`status`, `error`, `notes`, `timestamp`, the environment); `timing_columns(prefix)`
declares the step-time statistics once (mix it in, once per prefix); `identity_field()`
marks the columns that identify a configuration, so resume and compare match on
`key()` instead of slicing the row. Each record type also says how it is shown in Markdown
(`title`, `markdown_columns`, `label_columns`, `conventions`), so one sink writes every tool.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from .. import identity
from ..config import BenchmarkConfig, BenchmarkIdentity
from ..profiling import StepProfile
from ..stats import CONVENTIONS, Summary, summarize
from . import plausibility
from .environment import ENVIRONMENT_FIELDS, Environment, utc_timestamp
from .markdown import BENCHMARK_LABEL_COLUMNS, console_table, is_missing, render_document, row_label
from .origin import TOOL

if TYPE_CHECKING:  # for type names only
    import torch

# Summary fields in column order, the median first (tables lead with it); the *_pct are ratios,
# the rest milliseconds.
TIMING_STATISTICS = ("median", "iqr", "iqr_pct", "mean", "std", "cv_pct", "min", "max", "p10", "p90")

# A 'wrong' row's error when its loss came out NaN or inf (older files carried it as a note: compare never ranks those).
NONFINITE_LOSS_NOTE = "loss is not finite (NaN/inf)"


def samples_field():
    """A list of raw samples: kept in JSONL, left out of CSV and Markdown rows."""
    return field(default_factory=list, metadata={"samples": True})


def timing_names(prefix: str = "") -> tuple[str, ...]:
    """median_ms, iqr_ms, iqr_pct, mean_ms, ... each with `prefix` (e.g. forward_median_ms)."""
    return tuple(f"{prefix}{s}" if s.endswith("_pct") else f"{prefix}{s}_ms" for s in TIMING_STATISTICS)


def markdown_timing(prefix: str = "") -> tuple[str, ...]:
    """The statistics a Markdown table shows, the median and its spread first; the rest stay in the files."""
    return tuple(f"{prefix}{name}" for name in ("median_ms", "iqr_pct", "mean_ms", "std_ms", "p10_ms", "p90_ms"))


MARKDOWN_TIMING = markdown_timing()


def timing_columns(prefix: str = "") -> type:
    """A dataclass to mix into a record: the timing statistics' columns, named with `prefix`."""
    name = "".join(part.title() for part in prefix.split("_")) + "Timing"
    columns = [(column, float | None, field(default=None)) for column in timing_names(prefix)]
    return dataclasses.make_dataclass(name, columns, kw_only=True)


Timing = timing_columns()
# Per phase of a benchmark step, from the measured steps (timing.py): forward rows have only
# forward, forward-backward rows no optimizer, CUDA-graph rows none.
PHASES = ("forward", "backward", "optimizer")
ForwardTiming, BackwardTiming, OptimizerTiming = (timing_columns(f"{phase}_") for phase in PHASES)


def timing_values(summary: Summary, prefix: str = "") -> dict[str, float]:
    """A stats.Summary as the `prefix` timing columns' values (a record's, or a self-check's row)."""
    return dict(zip(timing_names(prefix), (getattr(summary, s) for s in TIMING_STATISTICS), strict=True))


def fill_timing(record: object, summary: Summary, prefix: str = "") -> None:
    """Copy a stats.Summary into the record's `prefix` timing columns (the only place that does)."""
    for name, value in timing_values(summary, prefix).items():
        if not hasattr(record, name):
            raise AttributeError(f"{type(record).__name__} declares no timing column {name!r}")
        setattr(record, name, value)


@dataclass(kw_only=True)
class Record:
    """Base of every result record.

    Row columns: identity columns, the record's other fields, then the fields below, then the
    environment's fields. Raw samples (`samples_field`) go to JSONL only.
    """

    status: str
    error: str | None = None
    notes: str | None = None
    timestamp: str = field(default_factory=utc_timestamp)
    environment: Environment | None = None

    # the tool whose rows these are, every row's first column (results/origin.py); None: the harness
    # checking itself (scripts/checks/), whose rows are no tool's results
    tool: ClassVar[str | None] = None
    # The Markdown view; a record type sets these (and may override `markdown`).
    title: ClassVar[str] = "cs336-bench results"
    markdown_columns: ClassVar[tuple[str, ...]] = ("status",)
    label_columns: ClassVar[tuple[str, ...]] = ()
    console_columns: ClassVar[tuple[str, ...]] = ()  # what a terminal shows of a row (default: markdown_columns)
    conventions: ClassVar[str] = CONVENTIONS

    @classmethod
    def _scalar_fields(cls) -> list[dataclasses.Field]:
        fields = [f for f in dataclasses.fields(cls) if f.name != "environment" and not f.metadata.get("samples")]
        common = {f.name for f in dataclasses.fields(Record)}
        identity = [f for f in fields if f.metadata.get("identity")]
        rest = [f for f in fields if not f.metadata.get("identity") and f.name not in common]
        return identity + rest + [f for f in fields if f.name in common]

    @classmethod
    def row_fields(cls) -> tuple[str, ...]:
        return (*((TOOL,) if cls.tool else ()), *(f.name for f in cls._scalar_fields()), *ENVIRONMENT_FIELDS)

    @classmethod
    def identity_fields(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("identity"))

    @classmethod
    def row_key(cls, row: dict) -> tuple[str, ...]:
        """The identity of a row read back from a file (equal to `key()` of the record written)."""
        return identity.row_key(row, cls.identity_fields())

    def key(self) -> tuple[str, ...]:
        return self.row_key(self.to_row())

    @classmethod
    def label(cls, row: dict) -> str:
        return row_label(row, cls.label_columns)

    def to_row(self) -> dict[str, object]:
        row = {f.name: getattr(self, f.name) for f in self._scalar_fields()}
        row["notes"] = plausibility.with_note(row["notes"], {**row, **self._samples()})  # what cannot be a result
        env = dataclasses.asdict(self.environment) if self.environment else dict.fromkeys(ENVIRONMENT_FIELDS)
        return {**({TOOL: self.tool} if self.tool else {}), **row, **env}

    def _samples(self) -> dict[str, list]:
        return {f.name: list(getattr(self, f.name)) for f in dataclasses.fields(self) if f.metadata.get("samples")}

    def to_json(self) -> dict[str, object]:
        return {**self.to_row(), **self._samples()}

    @classmethod
    def console(cls, rows: Sequence[dict], all_columns: bool = False) -> str:
        """The rows on a terminal: narrow (console_table), or the Markdown document with `all_columns`."""
        if all_columns:
            return cls.markdown(rows)
        columns, settings = cls.console_columns or cls.markdown_columns, cls.identity_fields()
        return console_table(rows, title=cls.title, columns=columns, label_columns=cls.label_columns, settings=settings)

    @classmethod
    def markdown(cls, rows: Sequence[dict]) -> str:
        """The Markdown document for rows of this record type."""
        return render_document(
            rows,
            title=cls.title,
            columns=cls.markdown_columns,
            label_columns=cls.label_columns,
            conventions=cls.conventions,
        )


@dataclass
class BenchmarkRecord(OptimizerTiming, BackwardTiming, ForwardTiming, Timing, Record, BenchmarkIdentity):
    """One configuration of `benchmark`: what was asked (config.BenchmarkIdentity's columns,
    filled by `BenchmarkRecord(**config.identity(), ...)`), what happened, where."""

    tool: ClassVar[str] = "benchmark"

    # outcome
    num_params: int | None
    model_context_length: int  # longest sequence the model was built for (sweeps: the longest context)
    size_table: str | None = None  # the handout edition whose table named model_size (2025, 2026)
    checkpoint_group_size: int = 0  # blocks per checkpointed group (0: off)
    optimizer: str | None = None  # train-step: the optimizer class that really ran
    iqr_target_reached: bool | None = None  # with a target_iqr_pct: whether the steps got there before the cap
    tokens_per_s: float | None = None  # on the median step, as every rate (stats.per_second)
    compile_s: float | None = None
    # the profiled steps after the measured ones (profiling.py); None with --no-profile-step
    kernels_per_step: int | None = None
    device_busy_pct: float | None = None
    # work and utilisation (cs336_systems.flops), on the median step as tokens_per_s
    flops_per_step: int | None = None
    flops_source: str | None = None
    achieved_tflops: float | None = None
    peak_tflops: float | None = None
    peak_source: str | None = None  # table, calibrated (this machine's, kept), measured (this run's), user
    peak_measured_at: str | None = None  # calibrated or measured: when (rows with one time compare)
    peak_low: str | None = None  # why that peak reads low (peak_flops.Peak.low): an MFU over it reads high
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
    # numeric mode really in effect (read back from torch while the configuration ran)
    autocast_dtype: str | None = None
    matmul_precision: str | None = None
    cuda_matmul_allow_tf32: bool | None = None
    cudnn_allow_tf32: bool | None = None
    grad_scaler: bool | None = None
    step_ms: list[float] = samples_field()
    warmup_step_ms: list[float] = samples_field()
    forward_samples_ms: list[float] = samples_field()
    backward_samples_ms: list[float] = samples_field()
    optimizer_samples_ms: list[float] = samples_field()
    # the profiled steps' operators by median time, and their families (matmul, softmax, ...): profiling.py
    top_kernels: list[dict] = samples_field()
    kernel_families: list[dict] = samples_field()

    title: ClassVar[str] = "cs336-bench benchmark results"
    markdown_columns: ClassVar[tuple[str, ...]] = (
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
        *MARKDOWN_TIMING,
        "forward_median_ms",
        "backward_median_ms",
        "optimizer_median_ms",
        "tokens_per_s",
        "achieved_tflops",
        "mfu",
        "peak_memory_gib",
        "predicted_memory_gib",
        "compile_s",
        "kernels_per_step",
        "device_busy_pct",
    )
    label_columns: ClassVar[tuple[str, ...]] = BENCHMARK_LABEL_COLUMNS
    # What a terminal shows besides the settings that differ between rows; every column stays in the files.
    console_columns: ClassVar[tuple[str, ...]] = (
        "model_size",
        "context_length",
        "batch_size",
        "pass_type",
        "precision",
        "compile",
        "median_ms",
        "iqr_pct",
        "tokens_per_s",
        "mfu",
        "peak_memory_gib",
        "status",
    )

    @classmethod
    def console(cls, rows: Sequence[dict], all_columns: bool = False) -> str:
        """Record.console, where an MFU over a peak read on a busy machine says on its line that it reads high."""
        high = [not is_missing(row.get("mfu")) and bool(row.get("peak_low")) for row in rows]
        rows = [{**row, "mfu": f"{row['mfu']:.3f} (high)"} if busy else row for row, busy in zip(rows, high)]
        return super().console(rows, all_columns)

    @classmethod
    def for_config(
        cls, config: BenchmarkConfig, device: torch.device, env: Environment | None, num_params: int | None
    ) -> BenchmarkRecord:
        """A record holding `config` (run on `device`) with status 'ok' and nothing measured yet."""
        m = config.model
        return cls(
            **{**config.identity(), "device": str(device)},
            model_context_length=m.context_length,
            size_table=m.size_table,
            checkpoint_group_size=m.checkpoint_group_size,
            num_params=num_params,
            status="ok",
            environment=env,
        )

    def add_summary(self, summary: Summary) -> None:
        fill_timing(self, summary)

    def add_phases(self, phase_ms: dict[str, Sequence[float]]) -> None:
        """Per-phase samples (forward, backward, optimizer) and their statistics."""
        for name, samples in phase_ms.items():
            setattr(self, f"{name}_samples_ms", list(samples))
            fill_timing(self, summarize(samples), prefix=f"{name}_")

    def add_profile(self, profile: StepProfile) -> None:
        self.kernels_per_step, self.device_busy_pct = profile.kernels_per_step, profile.device_busy_pct
        self.top_kernels, self.kernel_families = list(profile.top_kernels), list(profile.families)
