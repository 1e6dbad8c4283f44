"""The row of one (world size, strategy, bucket size): DdpRecord, scaling and its Markdown view."""

from __future__ import annotations

import ast
import importlib.machinery
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ..config import ModelShape
from ..distributed import GroupResult, max_over_ranks, mean_over_ranks, oversubscription_note
from ..distributed.links import RankColumns
from ..results import Environment, Record, Timing, fill_timing, identity_field, samples_field, timing_columns
from ..results.records import markdown_timing
from ..stats import per_second, percent_of, summarize
from .accounting import measured_sharding, predicted_peak_bytes
from .strategies import SHARDING
from .trainer import DDP_DEFAULT_BUCKET_CAP_MB, NONFINITE_DIFF, DdpUnit

COMM_METHODS = {
    "naive": "all-reduce loop timed (mean over ranks)",
    "flat": "all-reduce loop timed (mean over ranks; one flat buffer)",
    "adapter-sharded-optimizer": "all-reduce loop timed (mean over ranks; one flat buffer)",
    "ddp": "step - no_sync step (exposed)",
    "zero1": "step - no_sync step (gradient all-reduce exposed; ZeRO's parameter broadcast not included)",
    "fsdp2": "all-gather + reduce-scatter time of one profiled step (not only the exposed part)",
}
# the student's on_after_backward, timed: the communication their backward hooks did not hide
TIMED_COMM_METHOD = "on_after_backward timed (mean over ranks): communication not hidden by backward"


# per rank, each measured step's phase averaged over the ranks: the phases alone, not the strategy's hooks
ForwardTiming, BackwardTiming = timing_columns("forward_"), timing_columns("backward_")


@dataclass
class DdpRecord(RankColumns, BackwardTiming, ForwardTiming, Timing, Record, ModelShape):
    """One (world size, strategy, bucket size) of the DDP benchmark; step-time statistics, each
    step's time being the slowest rank's (model shape: ModelShape's; status, error, notes: Record's).
    Rates and shares are on the median step (stats.per_second, stats.percent_of)."""

    tool: ClassVar[str] = "ddp_bench"

    strategy: str = identity_field()
    backend: str = identity_field()
    device: str = identity_field()
    launcher: str = identity_field()
    world_size: int = identity_field()
    context_length: int = identity_field()
    batch_size: int = identity_field()  # per rank, as everyone's batch_size (global_batch = x world_size)
    precision: str = identity_field()
    optimizer: str = identity_field()
    bucket_cap_mb: float | None = identity_field()
    compute_dtype: str = identity_field()  # fsdp2 / adapter-fsdp: --fsdp-compute-dtype
    adapters: str | None = identity_field()
    threads_per_rank: int = identity_field()
    warmup_steps: int = identity_field()
    measure_steps: int = identity_field()
    seed: int = identity_field()
    base_lr: float = identity_field()
    base_batch_size: int = identity_field()
    global_batch: int
    lr_linear: float
    lr_sqrt: float
    size_table: str | None = None  # the handout edition whose table named model_size (2025, 2026)
    num_params: int | None = None
    no_sync_median_ms: float | None = None
    comm_ms: float | None = None  # the median of the steps' communication
    comm_pct: float | None = None
    comm_method: str | None = None
    # the gradients' all-reduces on the probed links (distributed/links.py): all of it, hidden or not
    predicted_comm_ms: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    baseline_samples_per_s: float | None = None
    scaling_efficiency: float | None = None
    compute_slowdown: float | None = None  # no_sync step / single step: ranks slowing each other down
    check_max_diff: float | None = None  # max |param - single-process param| after one SGD step
    check_tolerance: float | None = None
    # fsdp2 / adapter-fsdp: time in the collectives over one profiled step (forward's and backward's
    # all-gathers together), mean over ranks; compare with forward_median_ms in the same row
    fsdp_all_gather_ms: float | None = None
    fsdp_reduce_scatter_ms: float | None = None
    # memory per rank: the max over ranks
    param_bytes_per_rank: int | None = None  # counted from the tensors each rank holds
    grad_bytes_per_rank: int | None = None
    optimizer_state_bytes_per_rank: int | None = None
    # a rank's tensors at the peak of each phase (memory.measure.TensorMemory: torch's MemTracker, counted from zero)
    peak_model_bytes: int | None = None  # building the model, wrapping it, making the optimizer
    peak_before_optimizer_bytes: int | None = None  # forward and backward
    peak_optimizer_bytes: int | None = None  # gradient sync (naive/flat/adapters) and optimizer step
    process_peak_bytes: int | None = None  # secondary: the process's own, above its start (memory_source's)
    memory_source: str | None = None  # rss_high_water_mark or cuda_allocator
    predicted_peak_bytes: int | None = None  # the estimator, state divided as the strategy divides it
    step_ms: list[float] = samples_field()  # per step, the slowest rank
    warmup_step_ms: list[float] = samples_field()
    no_sync_step_ms: list[float] = samples_field()
    comm_step_ms: list[float] = samples_field()
    rank_step_ms: list[list[float]] = samples_field()  # [rank][step]
    memory_breakdown: list[dict] = samples_field()  # {"phase", "parameters", ..., "total"}: the largest rank's

    title: ClassVar[str] = "DDP benchmark"
    markdown_columns: ClassVar[tuple[str, ...]] = (
        "strategy",
        "world_size",
        "nodes",
        "batch_size",
        "global_batch",
        "bucket_cap_mb",
        "status",
        *markdown_timing()[:4],
        "no_sync_median_ms",
        "comm_ms",
        "predicted_comm_ms",
        "comm_pct",
        "samples_per_s",
        "scaling_efficiency",
        "compute_slowdown",
        "check_max_diff",
        "param_bytes_per_rank",
        "grad_bytes_per_rank",
        "optimizer_state_bytes_per_rank",
        "peak_before_optimizer_bytes",
        "peak_optimizer_bytes",
        "predicted_peak_bytes",
        "lr_linear",
        "lr_sqrt",
    )
    label_columns: ClassVar[tuple[str, ...]] = ("strategy", "world_size", "bucket_cap_mb")

    @classmethod
    def markdown(cls, rows: Sequence[dict]) -> str:
        """Learning rates in 3 significant digits (the table's default of 3 decimals would print
        1e-4 as 0.000), labels without the bucket size where there is none."""

        def display(row: dict) -> dict:
            lrs = {name: f"{row[name]:.3g}" for name in ("lr_linear", "lr_sqrt") if _is_number(row.get(name))}
            shown = {**row, **lrs}
            if not _is_number(row.get("bucket_cap_mb")):
                shown.pop("bucket_cap_mb", None)
            return shown

        return super().markdown([display(row) for row in rows])


def scaled_learning_rates(base_lr: float, base_batch_size: int, global_batch: int) -> tuple[float, float]:
    """(linear, square-root) scaling of a learning rate tuned at `base_batch_size` (Goyal et al.
    2017 scale linearly; Krizhevsky 2014 and Hoffer et al. 2017 by the square root)."""
    ratio = global_batch / base_batch_size
    return base_lr * ratio, base_lr * math.sqrt(ratio)


def scaling_efficiency(samples_per_s: float, world_size: int, baseline_samples_per_s: float) -> float:
    return samples_per_s / (world_size * baseline_samples_per_s)


def record_for(unit: DdpUnit, result: GroupResult, base: dict, environment: Environment | None) -> DdpRecord:
    config = unit.config
    uses_buckets = unit.strategy in ("ddp", "zero1", "adapter-ddp-bucketed")
    world_size = 1 if unit.strategy == "single" else base["world_size"]
    if world_size == 1 and base.get("rank_hosts"):  # the baseline ran on rank 0 alone
        base = {**base, "nodes": 1, "tasks_per_node": 1, "rank_hosts": base["rank_hosts"].split(",")[0]}
    global_batch = config.batch_size * world_size
    lr_linear, lr_sqrt = scaled_learning_rates(base["base_lr"], base["base_batch_size"], global_batch)
    record = DdpRecord(
        **{**base, "world_size": world_size},
        strategy=unit.strategy,
        **config.shape(),
        context_length=config.context_length,
        batch_size=config.batch_size,
        global_batch=global_batch,
        size_table=config.model.size_table,
        precision=config.precision,
        optimizer=unit.optimizer,
        bucket_cap_mb=(unit.bucket_cap_mb or DDP_DEFAULT_BUCKET_CAP_MB) if uses_buckets else None,
        compute_dtype=unit.compute_dtype,
        adapters=unit.adapters,
        warmup_steps=config.warmup_steps,
        measure_steps=config.measure_steps,
        seed=config.seed,
        lr_linear=lr_linear,
        lr_sqrt=lr_sqrt,
        status=result.status,
        error=result.error,
        environment=result.environment or environment,
    )
    note = oversubscription_note(record.backend, world_size, record.threads_per_rank)
    record.notes = note
    record.predicted_peak_bytes = predicted_peak_bytes(config, SHARDING[unit.strategy], world_size, unit.optimizer)
    if result.status != "ok":
        return record
    messages = [message for message in result.messages if message is not None]
    first = messages[0]
    if "skipped" in first:
        record.status, record.error = "skipped", first["skipped"]
        return record
    record.check_max_diff, record.check_tolerance = first["check_max_diff"], first["check_tolerance"]
    if first.get("wrong"):
        record.status = "wrong"
        if record.check_max_diff >= NONFINITE_DIFF:
            record.error = "after one SGD step a parameter is NaN, infinite, missing or misshapen; not timed"
        else:
            record.error = (
                f"after one SGD step a parameter differs from the single-process step by "
                f"{record.check_max_diff:.3g} (tolerance {record.check_tolerance:g}); not timed"
            )
        return record
    if any(message.get("nonfinite") for message in messages):
        record.status, record.error = "wrong", "parameters are NaN or infinite after the timed steps; times not kept"
        return record
    _fill_memory(record, messages)
    _check_sharding(record, unit, messages, world_size)
    record.num_params = messages[0]["num_params"]
    record.rank_step_ms = [message["step_ms"] for message in messages]
    record.step_ms = max_over_ranks(record.rank_step_ms)
    record.warmup_step_ms = max_over_ranks([message["warmup_ms"] for message in messages])
    summary = summarize(record.step_ms)
    fill_timing(record, summary)
    for phase in ("forward", "backward"):
        per_rank = [message["phase_ms"][phase] for message in messages if phase in message.get("phase_ms", {})]
        if per_rank:
            fill_timing(record, summarize(mean_over_ranks(per_rank)), prefix=f"{phase}_")
    record.samples_per_s = per_second(global_batch, summary.median)
    record.tokens_per_s = per_second(global_batch * config.context_length, summary.median)
    if unit.strategy != "single":
        if first["no_sync_ms"]:
            record.no_sync_step_ms = max_over_ranks([message["no_sync_ms"] for message in messages])
            record.no_sync_median_ms = summarize(record.no_sync_step_ms).median
        if first["comm_ms"]:
            record.comm_step_ms = mean_over_ranks([message["comm_ms"] for message in messages])
            record.comm_method = COMM_METHODS.get(unit.strategy, TIMED_COMM_METHOD)
        elif record.no_sync_step_ms:
            record.comm_step_ms = [a - b for a, b in zip(record.step_ms, record.no_sync_step_ms, strict=True)]
            record.comm_method = COMM_METHODS[unit.strategy]
        if first["collective_ms"] is not None:
            record.fsdp_all_gather_ms = sum(m["collective_ms"]["all_gather"] for m in messages) / len(messages)
            record.fsdp_reduce_scatter_ms = sum(m["collective_ms"]["reduce_scatter"] for m in messages) / len(messages)
            if not record.comm_step_ms:  # fsdp2: no exposed time of its own (a student's on_after_backward has)
                record.comm_step_ms = [record.fsdp_all_gather_ms + record.fsdp_reduce_scatter_ms]
                record.comm_method = COMM_METHODS["fsdp2"]
        if record.comm_step_ms:
            record.comm_ms = summarize(record.comm_step_ms).median
            record.comm_pct = percent_of(record.comm_ms, summary.median)
        if result.links is not None and first.get("allreduces"):
            record.predicted_comm_ms = result.links.ring_allreduce_ms(
                first["grad_bytes"], world_size, first["allreduces"]
            )
    return record


NOTHING_SHARDED_STATUS = "not-sharded"
# The handout's model, then a student's own of the same module, by the names they are known by.
HANDOUT_MODEL_MODULE, HANDOUT_MODEL_NAMES = "cs336_basics.model", ("BasicsTransformerLM", "TransformerLM")


def handout_model_spec() -> str | None:
    """`cs336_basics.model:NAME` where the cs336_basics first on the path defines one of
    HANDOUT_MODEL_NAMES at its top level (read, not imported: a hint never runs the student's code)."""
    package, _, module = HANDOUT_MODEL_MODULE.partition(".")
    try:
        spec = importlib.machinery.PathFinder.find_spec(package)
        locations = list(spec.submodule_search_locations or []) if spec else []
        source = next((Path(d) / f"{module}.py" for d in locations if (Path(d) / f"{module}.py").is_file()), None)
        tree = ast.parse(source.read_bytes()) if source else None
    except (OSError, SyntaxError, ValueError, ImportError):
        return None
    defined = {node.name for node in getattr(tree, "body", []) if isinstance(node, ast.ClassDef | ast.FunctionDef)}
    name = next((name for name in HANDOUT_MODEL_NAMES if name in defined), None)
    return f"{HANDOUT_MODEL_MODULE}:{name}" if name else None


def _check_sharding(record: DdpRecord, unit: DdpUnit, messages: list[dict], world_size: int) -> None:
    """A student's FSDP or sharded optimizer that divided nothing on this model: a status of its own,
    a note, and a prediction without the sharding it did not do (the bytes are each rank's own)."""
    declared = SHARDING[unit.strategy]
    if world_size < 2 or not unit.strategy.startswith("adapter-") or not any(declared):
        return
    biggest = max(messages, key=lambda message: message["param_bytes"])
    measured = measured_sharding(
        unit.strategy,
        biggest["full_param_bytes"],
        biggest["param_bytes"],
        max(message["stateful_param_bytes"] for message in messages),
        declared,
    )
    record.predicted_peak_bytes = predicted_peak_bytes(unit.config, measured, world_size, unit.optimizer)
    if unit.strategy == "adapter-fsdp" and not measured[0]:
        what = f"every rank holds all {biggest['full_param_bytes']:,} parameter bytes"
    elif unit.strategy == "adapter-sharded-optimizer" and not measured[2] and biggest["stateful_param_bytes"]:
        what = "every rank keeps optimizer state for every parameter"
    else:
        return
    hint = ""
    if not unit.config.model_factory:
        model = handout_model_spec()
        hint = "; an FSDP that shards the handout's own layer classes needs a model built of them: " + (
            f"--model-factory {model}" if model else "--model-factory package.module:callable"
        )
    record.status = NOTHING_SHARDED_STATUS
    record.notes = "; ".join(filter(None, [record.notes, f"nothing sharded: {what}{hint}"]))


def _fill_memory(record: DdpRecord, messages: list[dict]) -> None:
    """Each memory column is the max over ranks (the rank that needs the most sets the limit)."""
    for column, key in (
        ("param_bytes_per_rank", "param_bytes"),
        ("grad_bytes_per_rank", "grad_bytes"),
        ("optimizer_state_bytes_per_rank", "optimizer_state_bytes"),
        ("process_peak_bytes", "process_peak_bytes"),
    ):
        values = [message[key] for message in messages if message[key] is not None]
        setattr(record, column, max(values) if values else None)
    record.memory_source = messages[0]["memory_source"]
    by_phase = zip(*(message["memory_breakdown"] for message in messages), strict=True)
    record.memory_breakdown = [max(ranks, key=lambda phase: phase["total"]) for ranks in by_phase]
    record.peak_model_bytes, record.peak_before_optimizer_bytes, record.peak_optimizer_bytes = (
        phase["total"] for phase in record.memory_breakdown
    )


def attach_baseline(record: DdpRecord, baseline: dict | None) -> None:
    """Scaling against the one-process row (this run's, or one read with --baseline)."""
    per_s, median_ms = ((baseline or {}).get(name) for name in ("samples_per_s", "median_ms"))
    if not (_is_number(per_s) and _is_number(median_ms)) or record.samples_per_s is None:
        if record.status == "ok":
            record.notes = "; ".join(filter(None, [record.notes, "no scaling efficiency: the single baseline failed"]))
        return
    record.baseline_samples_per_s = per_s
    record.scaling_efficiency = scaling_efficiency(record.samples_per_s, record.world_size, per_s)
    if record.no_sync_median_ms is not None:
        record.compute_slowdown = record.no_sync_median_ms / median_ms


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def describe(unit: DdpUnit, record: DdpRecord) -> str:
    """The progress line of one row."""
    label = f"n={record.world_size} {unit.strategy}"
    if record.status == NOTHING_SHARDED_STATUS:
        label += " (nothing sharded)"
    elif record.status != "ok":
        return f"{label}: {record.status}: {record.error}"
    efficiency = f", efficiency {record.scaling_efficiency:.2f}" if record.scaling_efficiency is not None else ""
    return f"{label}: median {record.median_ms:.1f} ms/step, {record.samples_per_s:.1f} samples/s{efficiency}"
