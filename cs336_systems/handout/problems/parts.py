"""Each handout problem's sub-questions, edition by edition, in this project's words: the letter,
what it asks, and how it is answered (`measured` by the plan's runs, `mixed`: a measurement and the
student's reading of it, `derivation`: the student's, on paper, `code`: the student's implementation,
which the official tests check). A write-up section names every letter (base.finish)."""

from __future__ import annotations

from typing import NamedTuple


class Part(NamedTuple):
    letter: str  # "" for a problem with one unlettered deliverable
    asks: str
    answer: str  # measured, mixed, derivation or code


_PARTS_2025: dict[str, tuple[Part, ...]] = {
    "benchmarking_script": (
        Part("a", "end-to-end timing script: build model, random batch, warmup then timed steps", "code"),
        Part("b", "forward and backward time per model size, mean and standard deviation", "measured"),
        Part("c", "repeat timings with zero, one, two warmups; explain the differences", "mixed"),
    ),
    "nsys_profile": (
        Part("a", "total forward time from nsys profile, compared against the timeit numbers", "measured"),
        Part("b", "top cumulative-GPU-time kernel in forward, its call count, same for fwd+bwd?", "measured"),
        Part("c", "which non-matmul kernels take notable forward runtime", "measured"),
        Part("d", "matmul vs other kernel time share: full AdamW train step versus inference", "measured"),
        Part("e", "softmax vs matmul runtime inside attention, related to their FLOP ratio", "mixed"),
    ),
    "mixed_precision_accumulation": (
        Part("", "run four fp32/fp16 summation loops, discuss the accuracy of each result", "mixed"),
    ),
    "benchmarking_mixed_precision": (
        Part("a", "dtypes of params, fc1 out, layernorm out, logits, loss, grads under fp16 autocast", "derivation"),
        Part("b", "why layernorm is precision-sensitive; whether bf16 still needs special handling", "derivation"),
        Part("c", "forward/backward timings with and without bf16 autocast per size; trends", "mixed"),
    ),
    "memory_profiling": (
        Part(
            "a",
            "memory-profiler option; active-memory timelines for inference and training step, describe",
            "mixed",
        ),
        Part("b", "peak memory per context length, forward-only and full training step", "measured"),
        Part("c", "peak memory with bf16 mixed precision, forward and full step; notable change?", "mixed"),
        Part("d", "residual-stream activation tensor size in fp32, in MB, with working", "derivation"),
        Part("e", "largest allocations in forward memory timeline and their source in the stack", "mixed"),
    ),
    "pytorch_attention": (
        Part("a", "time naive attention fwd/bwd over sweep, memory before backward, OOM accounting, fix", "mixed"),
    ),
    "torch_compile": (
        Part("a", "compiled versus eager attention forward/backward timings on the same sweep", "measured"),
        Part("b", "compiled versus vanilla full Transformer: forward, and fwd+bwd+optimizer step timings", "measured"),
    ),
    "flash_forward": (
        Part("a", "tiled FlashAttention-2 forward as pure-PyTorch autograd.Function, saving L", "code"),
        Part("b", "Triton fused forward kernel for FlashAttention-2 wrapped in autograd.Function", "code"),
        Part("c", "optional causal-mask flag in the Triton forward kernel", "code"),
    ),
    "flash_backward": (
        Part("", "FlashAttention-2 backward via recomputation in compiled PyTorch, returning dQ, dK, dV", "code"),
    ),
    "flash_benchmarking": (
        Part("a", "do_bench table: Triton flash vs PyTorch attention, fwd, bwd, fwd+bwd latency", "measured"),
    ),
    "leaderboard": (Part("", "fastest FlashAttention-2 forward+backward time, Triton only", "measured"),),
    "distributed_communication_single_node": (
        Part("", "all-reduce runtime benchmark across backend, size, process count; plots and commentary", "mixed"),
    ),
    "naive_ddp": (
        Part("", "naive DDP script all-reducing each gradient; check weights match single-process training", "code"),
    ),
    "naive_ddp_benchmarking": (
        Part("", "naive DDP step time and share spent communicating gradients, with setup", "measured"),
    ),
    "minimal_ddp_flat_benchmarking": (
        Part("", "step and communication time with one flattened all-reduce; compare to per-parameter", "mixed"),
    ),
    "ddp_overlap_individual_parameters": (
        Part("", "DDP wrapper overlapping per-parameter async all-reduce with backward via hooks", "code"),
    ),
    "ddp_overlap_individual_parameters_benchmarking": (
        Part("a", "step time of overlapped per-parameter DDP versus the two earlier variants", "mixed"),
        Part("b", "nsys screenshots showing overlap present versus absent in naive DDP", "measured"),
    ),
    "ddp_overlap_bucketed": (
        Part("", "DDP wrapper with size-capped gradient buckets all-reduced asynchronously during backward", "code"),
    ),
    "ddp_bucketed_benchmarking": (
        Part("a", "step time per bucket size versus unbucketed; discuss expectations and mismatches", "mixed"),
        Part("b", "formula for DDP overhead from s, w, o, n_b; optimal bucket size", "derivation"),
    ),
    "communication_accounting": (
        Part("a", "XXL FP32 weights/grads/optimizer memory, BF16 saved activations, H100 count", "derivation"),
        Part("b", "per-device memory expression under FSDP sharding; N_FSDP to fit 95GB", "derivation"),
        Part("c", "per-device batch for compute-bound forward on TPU v5p mesh; global batch", "derivation"),
        Part("d", "techniques to shrink global batch while keeping high throughput, with support", "derivation"),
    ),
    "optimizer_state_sharding": (
        Part("", "optimizer wrapper sharding state across ranks, broadcasting updated parameters after step", "code"),
    ),
    "optimizer_state_sharding_accounting": (
        Part("a", "peak memory after init, before and after step, with/without sharding; breakdown", "mixed"),
        Part("b", "per-iteration time with and without optimizer state sharding", "measured"),
        Part("c", "how this sharding differs from ZeRO stage 1 in memory and communication", "derivation"),
    ),
}
_2025_ONLY = ("ddp_overlap_bucketed", "ddp_bucketed_benchmarking", "communication_accounting")

PARTS: dict[str, dict[str, tuple[Part, ...]]] = {
    "2025": _PARTS_2025,
    "2026": {  # the 2025 handout's parts, less its own problems, with those 2026 asks otherwise
        **{label: parts for label, parts in _PARTS_2025.items() if label not in _2025_ONLY},
        "benchmarking_script": (
            Part("a", "timing script for forward-only, forward+backward, and full train step with optimizer", "code"),
            Part(
                "b", "forward, backward, optimizer-step times per model size, mean and standard deviation", "measured"
            ),
            _PARTS_2025["benchmarking_script"][2],
        ),
        "memory_profiling": (
            *_PARTS_2025["memory_profiling"][:3],
            Part("d", "residual-stream activation tensor size in fp32, in MiB, with working", "derivation"),
            _PARTS_2025["memory_profiling"][4],
            Part(
                "f", "nsys memory trace: per-block saved residuals, top-5 ops share, gradient memory per block", "mixed"
            ),
        ),
        "gradient_checkpointing": (
            Part(
                "a",
                "checkpoint arrangement minimizing peak activation memory; asymptotic memory and compute in N",
                "derivation",
            ),
            Part("b", "best single-level checkpoint block size for xl; verify by measured peak memory", "mixed"),
        ),
        "distributed_communication_single_node": (
            Part("", "all-reduce runtime benchmark across tensor size and GPU count; plots and commentary", "mixed"),
        ),
        "fsdp": (
            Part(
                "",
                "FSDP wrapper: sharded Linear/Embedding weights, prefetch all-gather, reduce-scatter grads, compute dtype",
                "code",
            ),
        ),
        "fsdp_accounting": (
            Part("a", "expected peak-memory saving from FSDP based on earlier sharding analysis", "derivation"),
            Part("b", "profile weight all-gathers; do they complete before forward needs them", "mixed"),
        ),
        "alternate_ring_all_reduce": (
            Part("", "runtime of the pass-full-tensor ring all-reduce in terms of S, N, W", "derivation"),
        ),
        "data_parallel_calcs": (
            Part("a", "backward-pass matmul FLOPs for the FFN under N_DP data parallelism", "derivation"),
            Part("b", "backward communication time for gradient all-reduce under data parallelism", "derivation"),
            Part("c", "upper bound on N_DP before communication dominates compute", "derivation"),
        ),
        "fsdp_calcs": (
            Part("a", "forward and backward FLOPs under N_FSDP sharding", "derivation"),
            Part("b", "forward and backward communication time under FSDP", "derivation"),
            Part("c", "limits on N_FSDP for compute-bound backward and forward", "derivation"),
        ),
        "tp_calcs": (
            Part(
                "a", "write the sharded FFN backward equations with collectives under tensor parallelism", "derivation"
            ),
            Part("b", "forward and backward FLOPs under N_TP tensor parallelism", "derivation"),
            Part("c", "forward and backward communication time under tensor parallelism", "derivation"),
            Part("d", "limits on N_TP for compute-bound backward and forward", "derivation"),
        ),
        "fsdp_tp_calcs": (
            Part("a", "forward FLOPs per device with combined FSDP and TP", "derivation"),
            Part("b", "forward communication time as max of overlapped FSDP and TP collectives", "derivation"),
            Part(
                "c", "max total devices N, optimal split, overlapped collectives, staying compute-bound", "derivation"
            ),
            Part("d", "max total devices N when FSDP and TP collectives cannot overlap", "derivation"),
        ),
        "leaderboard": (Part("", "best wall-clock time for a full AdamW training step of the 8B model", "measured"),),
    },
}
