"""The row of one (implementation, head dim, seq len): AttentionRecord and its Markdown view."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..results import (
    Environment,
    Record,
    identity_field,
    samples_field,
    timing_columns,
)
from ..stats import CONVENTIONS
from .config import AttentionConfig

ForwardTiming, BackwardTiming = timing_columns("forward_"), timing_columns("backward_")
EndToEndTiming = timing_columns("end_to_end_")


@dataclass
class AttentionRecord(EndToEndTiming, BackwardTiming, ForwardTiming, Record):
    """One (implementation, head dim, seq len) of attention_bench; forward_*, backward_* and
    end_to_end_* timing statistics from the one declaration in results (status, error, notes,
    environment: Record's)."""

    tool: ClassVar[str] = "attention_bench"

    implementation: str = identity_field()
    head_dim: int = identity_field()
    context_length: int = identity_field()
    batch_size: int = identity_field()
    num_heads: int = identity_field()
    layout: str = identity_field()
    causal: bool = identity_field()
    precision: str = identity_field()
    device: str = identity_field()
    timer: str = identity_field()
    warmup_steps: int = identity_field()
    measure_steps: int = identity_field()
    max_seconds: float | None = identity_field()
    seed: int = identity_field()
    adapters: str | None = identity_field()
    # outcome
    timer_used: str | None = None  # what --timer do-bench ran: triton.do_bench, cuda-event or host
    forward_steps: int | None = None  # measured (fewer than `measure_steps` when the time budget ran out)
    backward_steps: int | None = None
    end_to_end_steps: int | None = None
    # against the fp32 naive reference on the same inputs (status 'wrong' above check_tolerance)
    max_abs_err_out: float | None = None
    max_abs_err_grad: float | None = None  # the largest of dq, dk, dv
    check_tolerance: float | None = None  # times max(1, max |reference|) of each tensor
    compile_s: float | None = None
    # work
    forward_flops: int | None = None
    backward_flops: int | None = None
    forward_tflops: float | None = None  # on the median, as every rate (stats.per_second)
    backward_tflops: float | None = None
    end_to_end_tflops: float | None = None
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
    forward_samples_ms: list[float] = samples_field()
    backward_samples_ms: list[float] = samples_field()
    forward_warmup_ms: list[float] = samples_field()
    backward_warmup_ms: list[float] = samples_field()
    end_to_end_samples_ms: list[float] = samples_field()
    end_to_end_warmup_ms: list[float] = samples_field()

    title: ClassVar[str] = "Attention forward and backward"
    markdown_columns: ClassVar[tuple[str, ...]] = (
        "implementation",
        "head_dim",
        "context_length",
        "batch_size",
        "precision",
        "status",
        "forward_median_ms",
        "forward_iqr_pct",
        "backward_median_ms",
        "backward_iqr_pct",
        "end_to_end_median_ms",
        "max_abs_err_out",
        "max_abs_err_grad",
        "forward_tflops",
        "memory_before_backward_mib",
        "saved_for_backward_mib",
        "backward_peak_mib",
        "compile_s",
    )
    label_columns: ClassVar[tuple[str, ...]] = ("implementation", "head_dim", "context_length")
    conventions: ClassVar[str] = (
        CONVENTIONS
        + "\n\n"
        + (
            "forward: autograd recording, as in training; backward: against a fixed random output gradient, after an "
            "untimed fresh forward; end_to_end: forward and backward in one step. Each row is checked once, outside the "
            "timed loop, against fp32 naive attention on the same inputs: max_abs_err_out and max_abs_err_grad (largest of "
            "dq, dk, dv); status wrong when an error exceeds check_tolerance x max(1, max |reference|). FLOPs count the QK^T and PV matmuls over the full T x T square (backward = 2x forward, end_to_end = 3x). "
            "Memory is counted from just before the inputs were made: CUDA allocator bytes, or on a CPU the growth of the "
            "resident set (includes what glibc keeps after frees), except memory_before_backward, which on a CPU sums the "
            "distinct storages of the inputs, what autograd saved and the output. saved_for_backward counts the distinct storages autograd "
            "saved, inputs included. compile_s = first forward + first backward call of torch.compile(naive)."
        )
    )


ATTENTION_FIELDS = AttentionRecord.row_fields()


def new_record(config: AttentionConfig, device: torch.device, env: Environment | None) -> AttentionRecord:
    """A record holding `config` (its every field is an identity column) with nothing measured yet."""
    return AttentionRecord(
        **{**dataclasses.asdict(config), "device": str(device)},
        status="ok",
        forward_flops=config.forward_flops,
        backward_flops=2 * config.forward_flops,
        scores_bytes=config.scores_bytes,
        environment=env,
    )
