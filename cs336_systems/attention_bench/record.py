"""The row of one (implementation, head dim, seq len): AttentionRecord and its Markdown view."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from cs336_systems.attention_bench.config import AttentionConfig
from cs336_systems.results import (
    STATS_CONVENTIONS,
    Environment,
    Record,
    identity_field,
    samples_field,
    timing_columns,
)

ForwardTiming, BackwardTiming = timing_columns("forward_"), timing_columns("backward_")


@dataclass
class AttentionRecord(BackwardTiming, ForwardTiming, Record):
    """One (implementation, head dim, seq len) of attention_bench; forward_* and backward_* timing
    statistics from the one declaration in results (status, error, notes, environment: Record's)."""

    implementation: str = identity_field()
    head_dim: int = identity_field()
    seq_len: int = identity_field()
    batch_size: int = identity_field()
    precision: str = identity_field()
    device: str = identity_field()
    timer: str = identity_field()
    warmup_steps: int = identity_field()
    steps: int = identity_field()
    max_seconds: float | None = identity_field()
    seed: int = identity_field()
    # outcome
    forward_steps: int | None = None  # measured (fewer than `steps` when the time budget ran out)
    backward_steps: int | None = None
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
    # numeric mode in effect
    matmul_precision: str | None = None
    cuda_matmul_allow_tf32: bool | None = None
    forward_ms: list[float] = samples_field()
    backward_ms: list[float] = samples_field()
    forward_warmup_ms: list[float] = samples_field()
    backward_warmup_ms: list[float] = samples_field()

    title: ClassVar[str] = "Attention forward and backward"
    markdown_columns: ClassVar[tuple[str, ...]] = (
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
    label_columns: ClassVar[tuple[str, ...]] = ("implementation", "head_dim", "seq_len")
    conventions: ClassVar[str] = STATS_CONVENTIONS + "\n\n" + (
        "forward: autograd recording, as in training; backward: against a fixed random output gradient, after an "
        "untimed fresh forward. FLOPs count the QK^T and PV matmuls over the full T x T square (backward = 2x forward). "
        "Memory is counted from just before the inputs were made: CUDA allocator bytes, or on a CPU the growth of the "
        "resident set (includes what glibc keeps after frees). saved_for_backward counts the distinct storages autograd "
        "saved, inputs included. compile_s = first forward + first backward call of torch.compile(naive)."
    )


ATTENTION_FIELDS = AttentionRecord.row_fields()


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
