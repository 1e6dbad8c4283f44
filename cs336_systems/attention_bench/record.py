"""The row of one (implementation, head dim, seq len): AttentionRecord and its Markdown view."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from cs336_systems.attention_bench.config import AttentionConfig
from cs336_systems.results import Environment, Record, render_markdown, samples_field, utc_timestamp


@dataclass
class AttentionRecord(Record):
    """One (implementation, head dim, seq len) of attention_bench."""

    # configuration
    implementation: str
    head_dim: int
    seq_len: int
    batch_size: int
    precision: str
    device: str
    timer: str
    warmup_steps: int
    steps: int
    max_seconds: float | None
    seed: int
    # outcome
    status: str
    error: str | None = None
    forward_steps: int | None = None  # measured (fewer than `steps` when the time budget ran out)
    forward_mean_ms: float | None = None
    forward_std_ms: float | None = None
    forward_cv_pct: float | None = None
    forward_median_ms: float | None = None
    forward_min_ms: float | None = None
    forward_max_ms: float | None = None
    forward_p10_ms: float | None = None
    forward_p90_ms: float | None = None
    backward_steps: int | None = None
    backward_mean_ms: float | None = None
    backward_std_ms: float | None = None
    backward_cv_pct: float | None = None
    backward_median_ms: float | None = None
    backward_min_ms: float | None = None
    backward_max_ms: float | None = None
    backward_p10_ms: float | None = None
    backward_p90_ms: float | None = None
    compile_s: float | None = None
    # work
    forward_flops: int | None = None
    backward_flops: int | None = None
    forward_tflops: float | None = None
    backward_tflops: float | None = None
    scores_bytes: int | None = None
    sdpa_backend: str | None = None
    # memory
    memory_source: str | None = None
    memory_before_backward_bytes: int | None = None
    forward_peak_bytes: int | None = None
    backward_peak_bytes: int | None = None
    saved_for_backward_bytes: int | None = None
    memory_limit_bytes: int | None = None  # CPU: address space allowed beyond what was mapped at start
    notes: str | None = None
    # numeric mode in effect
    matmul_precision: str | None = None
    cuda_matmul_allow_tf32: bool | None = None
    timestamp: str = field(default_factory=utc_timestamp)
    environment: Environment | None = None
    forward_ms: list[float] = samples_field()
    backward_ms: list[float] = samples_field()
    forward_warmup_ms: list[float] = samples_field()
    backward_warmup_ms: list[float] = samples_field()


ATTENTION_FIELDS = AttentionRecord.row_fields()
MARKDOWN_COLUMNS = (
    "implementation",
    "head_dim",
    "seq_len",
    "batch_size",
    "precision",
    "status",
    "forward_mean_ms",
    "forward_cv_pct",
    "backward_mean_ms",
    "backward_cv_pct",
    "forward_tflops",
    "backward_tflops",
    "memory_before_backward_mib",
    "saved_for_backward_mib",
    "backward_peak_mib",
    "compile_s",
)
LABEL_COLUMNS = ("implementation", "head_dim", "seq_len")
CONVENTIONS = (
    "forward: autograd recording, as in training; backward: against a fixed random output gradient, after an "
    "untimed fresh forward. FLOPs count the QK^T and PV matmuls over the full T x T square (backward = 2x forward). "
    "Memory is counted from just before the inputs were made: CUDA allocator bytes, or on a CPU the growth of the "
    "resident set (includes what glibc keeps after frees). saved_for_backward counts the distinct storages autograd "
    "saved, inputs included. compile_s = first forward + first backward call of torch.compile(naive)."
)


def render(rows: Sequence[dict], title: str = "Attention forward and backward") -> str:
    text = render_markdown(rows, title=title, columns=MARKDOWN_COLUMNS, label_columns=LABEL_COLUMNS)
    return text + "\n" + CONVENTIONS + "\n"


def new_record(config: AttentionConfig, device: torch.device, env: Environment | None) -> AttentionRecord:
    return AttentionRecord(
        implementation=config.implementation,
        head_dim=config.head_dim,
        seq_len=config.seq_len,
        batch_size=config.batch_size,
        precision=config.precision,
        device=str(device),
        timer=config.timer,
        warmup_steps=config.warmup_steps,
        steps=config.steps,
        max_seconds=config.max_seconds,
        seed=config.seed,
        status="ok",
        forward_flops=config.forward_flops,
        backward_flops=2 * config.forward_flops,
        scores_bytes=config.scores_bytes,
        environment=env,
    )
