"""The numbers of the CS336 assignment 2 (systems) handouts: every parameter a measured problem uses,
at full and at small scale (the problems that use them: problems/).

Parameters are the handouts' own (stanford-cs336/assignment2-systems, 2025 and 2026 releases): the
size tables, contexts 128..1024 at batch 4, 5 warmup + 10 measured steps and again with 0, 1 and 2
warmup steps, nsys (2025 every size x 128..1024; 2026 two sizes x three powers of two above 128, the
largest the longest that fits), the attention grid (batch 8, d 16..128, sequence 256..16384, 100
passes), the FlashAttention grid (batch 1, causal, 128..65536, bf16 and fp32, do_bench), all-reduce
1MB..1GB on 2, 4 and 6 ranks, DDP on the XL model with buckets of 1..1000 MB (2025). The fastest-step
problem's own shapes are beside it (problems/).

`Scale` holds every number a problem uses, so `--scale small` is the same plan at small shapes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..tools import module_name

SMALL_SHAPE = {"--d-model": 64, "--d-ff": 176, "--num-layers": 2, "--num-heads": 2, "--vocab-size": 512}
# Memory at the small scale: large enough that tensors, not a CPU's allocator slack (~15 MiB of RSS), make
# the peaks (~0.3 GiB for a training step), small enough that its runs take a minute on two cores.
MEMORY_SHAPE = {"--d-model": 512, "--d-ff": 1344, "--num-layers": 4, "--num-heads": 8, "--vocab-size": 2000}
DDP_CPU_SHAPE = {"--d-model": 128, "--d-ff": 352, "--num-layers": 2, "--num-heads": 4, "--vocab-size": 1000}


@dataclass(frozen=True)
class Scale:
    name: str
    sizes: tuple[str, ...] | None  # None: every size of the edition's table
    shape: dict = field(default_factory=dict)  # overrides that replace the named sizes (small scale)
    memory_shape: dict | None = None  # the memory problems' shape when not `shape` (None: `shape`)
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
    # None: every size; 2026's two: the smallest, and large, the largest whose training step fits three
    # powers of two above 128 on an 80 GB or a 40 GB GPU (xl fits only 256 and 512 on an H100)
    nsys_sizes: dict = field(default_factory=lambda: {"2025": None, "2026": ("small", "large")})
    nsys_above: int = 128  # 2026: power-of-two contexts above this, the largest the longest that fits
    nsys_max_context: int = 2**14  # where the search for the longest context stops
    allreduce_sizes: tuple[str, ...] = ("1MB", "10MB", "100MB", "1GB")
    allreduce_worlds: tuple[int, ...] = (2, 4, 6)
    ddp_size: str = "xl"
    ddp_context: int = 512
    buckets: tuple[str, ...] = ("1", "10", "100", "1000")
    sweep_tool: str = module_name("run_benchmarks")  # one child process per configuration
    # the timed sweeps measure until IQR/median is at most this, or max_measure_s of steps (None: a fixed count)
    target_iqr_pct: float | None = None
    max_measure_s: float = 60.0


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
    memory_shape=MEMORY_SHAPE,
    memory_contexts={"2025": (128, 256), "2026": (128, 512)},
    checkpoint_context=512,
    checkpoint_blocks=("0", "1", "2", "all"),
    attention_batch=4,
    attention_head_dims=(16, 32),
    attention_contexts=(64, 128),
    attention_measure=10,
    flash_contexts=(64, 128),
    flash_head_dims=(16,),
    nsys_above=16,
    nsys_max_context=128,
    allreduce_sizes=("1MB", "10MB"),
    allreduce_worlds=(2,),
    ddp_context=32,
    buckets=("1", "10"),
    sweep_tool=module_name("benchmark_direct"),
    target_iqr_pct=10.0,  # a CPU's small steps are noisy: the comparisons need their spread resolved
    max_measure_s=8.0,
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
