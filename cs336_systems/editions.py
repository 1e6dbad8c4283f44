"""The CS336 assignment 2 (systems) handout editions: each edition's problems in the handout's order,
with the kind of each (measured, an implementation the official tests check, or a derivation on
paper), its title and, for an implementation, the official test it passes. The planner (handout/)
and the write-up (report/) read them here.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterable
from pathlib import Path

EDITIONS = ("2025", "2026")
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
PROBLEMS = {
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
ALL_PROBLEMS = tuple(dict.fromkeys(itertools.chain(*PROBLEMS.values())))

# What a problem asks for: `measured` (the plan runs something for it), `implementation` (code the
# official tests check: nothing to measure), `analytic` (the student derives it on paper).
MEASURED, IMPLEMENTATION, ANALYTIC = "measured", "implementation", "analytic"
# Each implementation problem and the official test it passes (`uv run pytest ...`, as the handout says).
OFFICIAL_TESTS = {
    "flash_forward": "-k test_flash_forward_pass",
    "flash_backward": "-k test_flash_backward",
    "naive_ddp": "tests/test_ddp_individual_parameters.py",  # the handout's pointer: the check is the student's
    "ddp_overlap_individual_parameters": "tests/test_ddp_individual_parameters.py",
    "ddp_overlap_bucketed": "tests/test_ddp.py",
    "optimizer_state_sharding": "tests/test_sharded_optimizer.py",
    "fsdp": "tests/test_fsdp.py",
}
_IMPLEMENTATIONS = tuple(OFFICIAL_TESTS)
_ANALYTIC = (
    "communication_accounting",
    "alternate_ring_all_reduce",
    "data_parallel_calcs",
    "fsdp_calcs",
    "tp_calcs",
    "fsdp_tp_calcs",
)
PROBLEM_KIND = {
    problem: IMPLEMENTATION if problem in _IMPLEMENTATIONS else ANALYTIC if problem in _ANALYTIC else MEASURED
    for problem in ALL_PROBLEMS
}
KIND_MEANING = {
    IMPLEMENTATION: "an implementation the official tests check",
    ANALYTIC: "a derivation on paper",
    MEASURED: "measured by the plan",
}

# The handout's title of each problem (2026 names them; 2025's are its section titles).
PROBLEM_TITLE = {
    "benchmarking_script": "Benchmarking Script",
    "nsys_profile": "Nsight Systems Profiling",
    "mixed_precision_accumulation": "Mixed-Precision Accumulation",
    "benchmarking_mixed_precision": "Benchmarking Mixed Precision",
    "memory_profiling": "Memory Profiling",
    "gradient_checkpointing": "Memory-Optimal Gradient Checkpointing",
    "pytorch_attention": "PyTorch Attention Benchmarking",
    "torch_compile": "Torch Compile",
    "flash_forward": "FlashAttention-2 Forward Pass",
    "flash_backward": "FlashAttention-2 Backward Pass",
    "flash_benchmarking": "FlashAttention-2 Benchmarking",
    "distributed_communication_single_node": "Distributed Communication (Single Node)",
    "naive_ddp": "Naive DDP",
    "naive_ddp_benchmarking": "Naive DDP Benchmarking",
    "minimal_ddp_flat_benchmarking": "Minimal DDP with Flat Gradients Benchmarking",
    "ddp_overlap_individual_parameters": "DDP with Overlapping Individual Parameters",
    "ddp_overlap_individual_parameters_benchmarking": "DDP Overlapping Individual Parameters Benchmarking",
    "ddp_overlap_bucketed": "DDP with Overlapping Bucketed Gradients",
    "ddp_bucketed_benchmarking": "Bucketed DDP Benchmarking",
    "communication_accounting": "Communication Accounting (4D Parallelism)",
    "optimizer_state_sharding": "Optimizer State Sharding",
    "optimizer_state_sharding_accounting": "Optimizer State Sharding Accounting",
    "fsdp": "Fully-Sharded Data Parallel",
    "fsdp_accounting": "FSDP Accounting",
    "alternate_ring_all_reduce": "Alternate Ring All-Reduce",
    "data_parallel_calcs": "Data Parallel Calculations",
    "fsdp_calcs": "Fully Sharded Data Parallel Calculations",
    "tp_calcs": "Tensor Parallel Calculations",
    "fsdp_tp_calcs": "2D Parallelism Calculations",
    "leaderboard": "Leaderboard: Fastest Training Step",  # 2025: LEADERBOARD_TITLE_2025
}
LEADERBOARD_TITLE_2025 = "FlashAttention-2 Leaderboard"


def problem_title(problem: str, edition: str) -> str:
    if problem == "leaderboard" and edition == "2025":
        return LEADERBOARD_TITLE_2025
    return PROBLEM_TITLE[problem]


def measured_problems(edition: str) -> tuple[str, ...]:
    return tuple(problem for problem in PROBLEMS[edition] if PROBLEM_KIND[problem] == MEASURED)


# -- the official adapters (tests/adapters.py) of each edition ------------------------------

ADAPTERS_2026 = (
    "get_flashattention_autograd_function_pytorch",
    "get_flashattention_autograd_function_triton",
    "get_ddp",
    "ddp_on_after_backward",
    "get_fsdp",
    "fsdp_on_after_backward",
    "fsdp_gather_full_params",
    "get_sharded_optimizer",
)
ADAPTERS_2025 = (
    "get_ddp_individual_parameters",
    "ddp_individual_parameters_on_after_backward",
    "get_ddp_bucketed",
    "ddp_bucketed_on_after_backward",
    "ddp_bucketed_on_train_batch_start",
    "get_sharded_optimizer",
)
ADAPTER_NAMES = tuple(dict.fromkeys(ADAPTERS_2026 + ADAPTERS_2025))
# The names that tell the editions apart (FlashAttention-2 and get_sharded_optimizer are in both).
EDITION_2026_NAMES = (
    "get_ddp",
    "ddp_on_after_backward",
    "get_fsdp",
    "fsdp_on_after_backward",
    "fsdp_gather_full_params",
)
EDITION_2025_NAMES = tuple(name for name in ADAPTERS_2025 if name not in ADAPTERS_2026)


def edition_of_names(names: Iterable[str]) -> str | None:
    """'2026' (get_ddp, get_fsdp, fsdp_*), '2025' (get_ddp_individual_parameters, get_ddp_bucketed, ...),
    'both', or None when the names say neither."""
    names = set(names)
    new = bool(names & set(EDITION_2026_NAMES)) or any(name.startswith("fsdp_") for name in names)
    old = bool(names & set(EDITION_2025_NAMES))
    return "both" if new and old else "2026" if new else "2025" if old else None


def edition_of_file(path: str | Path) -> str | None:
    """The edition of an adapters file from the top-level functions it defines, read with ast: the
    file is never imported (this runs before any tool decides what a size name means). None when
    it cannot be read or says neither edition."""
    try:
        tree = ast.parse(Path(path).read_text(), str(path))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    names = [node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return edition_of_names(names)
