"""The handout's distributed problems: all-reduce on one node, and data parallel training per strategy
(DDP, ZeRO-1, FSDP), built in and the student's own."""

from __future__ import annotations

from ...tools import module_name
from ..parameters import DDP_CPU_SHAPE, Options
from ..plan import Step
from ..target import Target
from .model import STUDENT_MODEL, defined_in_repository


def distributed_communication_single_node(options: Options, target: Target) -> list[Step]:
    scale = options.scale
    steps = []
    for backend, device in (("gloo", "cpu"), ("nccl", "cuda")):
        name = f"distributed_communication_single_node-{backend}"
        worlds = list(scale.allreduce_worlds)
        flags = {
            "--backend": backend,
            "--device": device,
            "--world-sizes": worlds,
            "--sizes": list(scale.allreduce_sizes),
            "--warmup-steps": 5,
            "--measure-steps": 20,
            "--output": [f"{name}.csv", f"{name}.jsonl", f"{name}.md"],
            "--plot": f"{name}.png",
        }
        step = Step(
            name,
            "distributed_communication_single_node",
            f"all-reduce, {backend} on {device}",
            module_name("allreduce_bench"),
            flags,
            kind="allreduce",
            reads=(f"{name}.csv",),
            figures=(f"{name}.png",),
        )
        if backend == "nccl":
            usable = [w for w in worlds if w <= target.gpus]
            if not usable:
                step.skip(f"NCCL all-reduce needs at least 2 GPUs; this plan has {target.gpus}")
            elif usable != worlds:
                flags["--world-sizes"] = usable
                step.reductions.append(
                    f"world sizes {' '.join(str(w) for w in worlds if w > target.gpus)} dropped: {target.gpus} GPUs"
                )
        elif options.device != "cpu" or scale.name == "full":
            step.reason = "gloo ranks on this machine's CPU cores, as the handout's CPU half asks"
        steps.append(step)
    return steps


# problem -> (built-in strategies, the student's strategy, what runs): every step is ddp_bench, whose
# rows carry step and communication time, bytes of parameters / gradients / optimizer state per rank,
# each rank's forward and backward ms and (FSDP) the all-gather and reduce-scatter time.
DDP_PROBLEMS = {
    "naive_ddp_benchmarking": (["naive"], None, "individual all-reduce after backward"),
    "minimal_ddp_flat_benchmarking": (["naive", "flat"], None, "one flattened all-reduce"),
    "ddp_overlap_individual_parameters_benchmarking": (["ddp"], "adapter-ddp", "(a) overlapped with backward"),
    "ddp_bucketed_benchmarking": (["ddp"], "adapter-ddp-bucketed", "(a) bucketed, per bucket size"),
    "optimizer_state_sharding_accounting": (
        ["ddp", "zero1"],
        "adapter-sharded-optimizer",
        "(a, b) bytes per rank and step time, optimizer state sharded",
    ),
    "fsdp_accounting": (
        ["fsdp2"],
        "adapter-fsdp",
        "(a, b) bytes per rank, all-gather time against the forward, fully sharded",
    ),
}


def ddp(problem: str, options: Options, target: Target) -> list[Step]:
    scale = options.scale
    strategies, adapter_strategy, what = DDP_PROBLEMS[problem]
    strategies = list(strategies) + ([adapter_strategy] if adapter_strategy and options.adapters else [])
    flags = {
        "--strategies": strategies,
        "--size-table": options.edition,
        "--model-size": scale.ddp_size,
        "--context-length": scale.ddp_context,
        "--batch-size": scale.batch,
        "--warmup-steps": scale.warmup,
        "--measure-steps": scale.measure,
        "--output": [f"{problem}.csv", f"{problem}.jsonl", f"{problem}.md"],
    }
    if "bucketed" in problem:
        flags["--bucket-cap-mb"] = list(scale.buckets)
    if adapter_strategy and options.adapters:
        flags["--adapters"] = options.adapters
    step = Step(
        problem,
        problem,
        f"{what}: {' '.join(strategies)}",
        module_name("ddp_bench"),
        flags,
        kind="ddp",
        reads=(f"{problem}.csv",),
    )
    if options.model_factory:
        flags["--model-factory"] = options.model_factory
    elif adapter_strategy == "adapter-fsdp" and options.adapters and defined_in_repository(STUDENT_MODEL):
        flags["--model-factory"] = STUDENT_MODEL  # a student's FSDP shards their own model's layer classes
        step.reductions.append(f"your model ({STUDENT_MODEL}), whose layers your FSDP wraps")
    if options.optimizer:
        flags["--optimizer"] = options.optimizer  # ddp_bench steps it under each strategy
    if target.gpus >= 2:
        flags.update({"--backend": "nccl", "--device": "cuda", "--world-sizes": [2]})
    else:
        flags.update(
            {
                "--backend": "gloo",
                "--device": "cpu",
                "--world-sizes": [2],
                **DDP_CPU_SHAPE,
                "--model-size": "small",
                "--context-length": min(scale.ddp_context, 128),
                "--batch-size": 2,
                "--warmup-steps": 1,
                "--measure-steps": 3,
            }
        )
        step.reductions.append(
            f"{'one GPU' if target.gpus == 1 else 'no GPU'}: 2 gloo ranks on CPU at a small shape "
            "(d_model 128, 2 layers, context up to 128, batch 2, 1 + 3 steps): not the handout's "
            "XL timings"
        )
    if adapter_strategy and not options.adapters:
        step.reductions.append(f"{adapter_strategy} (your implementation) needs --adapters; built-in strategies only")
    return [step]
