"""Every problem of the CS336 assignment 2 (systems) handout as one object (base.Problem): its kind,
title, official test, how the plan measures it and how the write-up answers it. One module per
problem or small group; `EDITIONS` lists each edition's problems in the handout's order, and
`PROBLEMS` is the one registry.
"""

from __future__ import annotations

from ...errors import UsageError
from ..parameters import Options
from ..plan import Step, fit_verdict, predict
from ..target import Target
from . import (
    attention,
    benchmarking,
    checkpointing,
    communication,
    data_parallel,
    leaderboard,
    memory,
    nsys,
    paper,
    precision,
)
from .base import ANALYTIC, IMPLEMENTATION, KIND_MEANING, MEASURED, Problem

PROBLEMS: dict[str, Problem] = {
    problem.label: problem
    for problem in (
        benchmarking.PROBLEM,
        nsys.PROBLEM,
        precision.ACCUMULATION_PROBLEM,
        precision.BENCHMARKING_PROBLEM,
        memory.PROBLEM,
        checkpointing.PROBLEM,
        attention.PYTORCH_ATTENTION_PROBLEM,
        attention.TORCH_COMPILE_PROBLEM,
        attention.FLASH_BENCHMARKING_PROBLEM,
        communication.PROBLEM,
        *data_parallel.PROBLEMS,
        leaderboard.PROBLEM,
        *paper.PROBLEMS,
    )
}

# The runs of problems both handouts have, in the same order.
_PROFILING = (
    "benchmarking_script",
    "nsys_profile",
    "mixed_precision_accumulation",
    "benchmarking_mixed_precision",
    "memory_profiling",
)
_ATTENTION = ("pytorch_attention", "torch_compile", "flash_forward", "flash_backward", "flash_benchmarking")
_DDP = (
    "distributed_communication_single_node",
    "naive_ddp",
    "naive_ddp_benchmarking",
    "minimal_ddp_flat_benchmarking",
    "ddp_overlap_individual_parameters",
    "ddp_overlap_individual_parameters_benchmarking",
)
_SHARDING = ("optimizer_state_sharding", "optimizer_state_sharding_accounting")
# Every problem of each edition, in the handout's order (2025's leaderboard is its section 1.3.3,
# right after flash_benchmarking; 2026's is the last problem).
EDITIONS: dict[str, tuple[str, ...]] = {
    "2025": (
        *_PROFILING,
        *_ATTENTION,
        "leaderboard",
        *_DDP,
        "ddp_overlap_bucketed",
        "ddp_bucketed_benchmarking",
        "communication_accounting",
        *_SHARDING,
    ),
    "2026": (
        *_PROFILING,
        "gradient_checkpointing",
        *_ATTENTION,
        *_DDP,
        *_SHARDING,
        "fsdp",
        "fsdp_accounting",
        "alternate_ring_all_reduce",
        "data_parallel_calcs",
        "fsdp_calcs",
        "tp_calcs",
        "fsdp_tp_calcs",
        "leaderboard",
    ),
}


def of_edition(edition: str, kind: str | None = None) -> list[Problem]:
    """The edition's problems in the handout's order (of one kind, if given)."""
    return [PROBLEMS[label] for label in EDITIONS[edition] if kind is None or PROBLEMS[label].kind == kind]


def build_steps(options: Options, target: Target, labels: list[str]) -> list[Step]:
    """The plan: every step of the chosen problems in the handout's order, predicted and judged."""
    steps: list[Step] = []
    for problem in of_edition(options.edition, MEASURED):
        if problem.label in labels:  # a step several problems share (one measurement) is the first's
            steps += [step for step in problem.plan(options, target) if step.id not in {s.id for s in steps}]
    for step in steps:
        if step.status == "run":
            try:
                predict(step, target, user_model=options.model_factory is not None)
            except UsageError as exc:  # what the step's tool refuses (its configuration's own words)
                step.skip(str(exc))
                continue
            verdict, why = fit_verdict(step.predicted_peak_bytes, target)
            if verdict == "no" and step.kind in ("benchmark", "warmup", "ddp"):
                step.skip(why)  # a model step predicted not to fit (attention steps run every shape on purpose)
            elif not step.reason:
                step.reason = why
    return steps


__all__ = ["ANALYTIC", "EDITIONS", "IMPLEMENTATION", "KIND_MEANING", "MEASURED", "PROBLEMS", "Problem", "of_edition"]
