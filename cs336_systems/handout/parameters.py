"""The numbers of the CS336 assignment 2 (systems) handouts: which problems each edition has, and
every parameter a problem uses, at full and at small scale.

Parameters are the handouts' own (stanford-cs336/assignment2-systems, 2025 and 2026 releases): the
size tables, contexts 128..1024 at batch 4, 5 warmup + 10 measured steps and again with 0, 1 and 2
warmup steps, the attention grid (batch 8, d 16..128, sequence 256..16384, 100 passes), the
FlashAttention grid (batch 1, causal, 128..65536, bf16 and fp32, do_bench), all-reduce 1MB..1GB on
2, 4 and 6 ranks, DDP on the XL model with buckets of 1..1000 MB, and the FlashAttention
leaderboard shape (batch 1, 16 heads of 64, sequence 16384, bf16, causal; from the public
assignment2-systems-leaderboard README, used for both editions).

`Scale` holds every number a problem uses, so `--scale small` is the same plan at small shapes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from ..tools import module_name

EDITIONS = ("2025", "2026")
PROBLEMS = {
    "2025": (
        "benchmarking_script",
        "nsys_profile",
        "mixed_precision_accumulation",
        "benchmarking_mixed_precision",
        "memory_profiling",
        "pytorch_attention",
        "torch_compile",
        "flash_benchmarking",
        "distributed_communication_single_node",
        "naive_ddp_benchmarking",
        "minimal_ddp_flat_benchmarking",
        "ddp_overlap_individual_parameters_benchmarking",
        "ddp_bucketed_benchmarking",
        "optimizer_state_sharding_accounting",
        "leaderboard",
    ),
    "2026": (
        "benchmarking_script",
        "nsys_profile",
        "mixed_precision_accumulation",
        "benchmarking_mixed_precision",
        "memory_profiling",
        "gradient_checkpointing",
        "pytorch_attention",
        "torch_compile",
        "flash_benchmarking",
        "distributed_communication_single_node",
        "naive_ddp_benchmarking",
        "minimal_ddp_flat_benchmarking",
        "ddp_overlap_individual_parameters_benchmarking",
        "ddp_bucketed_benchmarking",
        "optimizer_state_sharding_accounting",
        "fsdp",
        "leaderboard",
    ),
}
ALL_PROBLEMS = tuple(dict.fromkeys(itertools.chain(*PROBLEMS.values())))
SMALL_SHAPE = {"--d-model": 64, "--d-ff": 176, "--num-layers": 2, "--num-heads": 2, "--vocab-size": 512}
DDP_CPU_SHAPE = {"--d-model": 128, "--d-ff": 352, "--num-layers": 2, "--num-heads": 4, "--vocab-size": 1000}


@dataclass(frozen=True)
class Scale:
    name: str
    sizes: tuple[str, ...] | None  # None: every size of the edition's table
    shape: dict = field(default_factory=dict)  # overrides that replace the named sizes (small scale)
    contexts: tuple[int, ...] = (128, 256, 512, 1024)
    timing_context: int = 512
    batch: int = 4
    warmup: int = 5
    measure: int = 10
    memory_size: dict = field(default_factory=lambda: {"2025": "2.7B", "2026": "xl"})
    memory_contexts: dict = field(default_factory=lambda: {"2025": (128, 256, 512), "2026": (128, 2048)})
    checkpoint_context: int = 2048
    checkpoint_blocks: tuple[str, ...] = ("0", "1", "2", "4", "sqrt", "all")
    attention_batch: int = 8
    attention_head_dims: tuple[int, ...] = (16, 32, 64, 128)
    attention_contexts: tuple[int, ...] = (256, 1024, 4096, 8192, 16384)
    attention_measure: int = 100
    flash_contexts: tuple[int, ...] = tuple(2**k for k in range(7, 17))
    flash_head_dims: tuple[int, ...] = (16, 32, 64, 128)
    leaderboard: tuple[int, int, int] = (16, 16384, 64)  # (batch x heads, sequence, head dim)
    allreduce_sizes: tuple[str, ...] = ("1MB", "10MB", "100MB", "1GB")
    allreduce_worlds: tuple[int, ...] = (2, 4, 6)
    ddp_size: str = "xl"
    ddp_context: int = 512
    buckets: tuple[str, ...] = ("1", "10", "100", "1000")
    sweep_tool: str = module_name("run_benchmarks")  # one child process per configuration


FULL = Scale("full", sizes=None)
SMALL = Scale(
    "small",
    sizes=("small",),
    shape=SMALL_SHAPE,
    contexts=(32, 64),
    timing_context=64,
    batch=2,
    warmup=2,
    measure=5,
    memory_size={"2025": "small", "2026": "small"},
    memory_contexts={"2025": (32, 64), "2026": (32, 128)},
    checkpoint_context=64,
    checkpoint_blocks=("0", "1", "all"),
    attention_batch=4,
    attention_head_dims=(16, 32),
    attention_contexts=(64, 128),
    attention_measure=10,
    flash_contexts=(64, 128),
    flash_head_dims=(16,),
    leaderboard=(2, 128, 16),
    allreduce_sizes=("1MB", "10MB"),
    allreduce_worlds=(2,),
    ddp_context=32,
    buckets=("1", "10"),
    sweep_tool=module_name("benchmark_direct"),
)
SCALES = {"full": FULL, "small": SMALL}


@dataclass(frozen=True)
class Options:
    """What the user's command fixes for every step."""

    edition: str
    scale: Scale
    device: str  # as given to the tools: cpu, cuda, cuda:N
    adapters: str | None = None
    model_factory: str | None = None
    optimizer: str | None = None
