"""The handout's distributed problems: all-reduce on one node, and data parallel training per strategy."""

from __future__ import annotations

from ...tools import module_name
from ..parameters import DDP_CPU_SHAPE, Options
from ..plan import Step
from ..target import Target


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


DDP_PROBLEMS = {
    "naive_ddp_benchmarking": (["naive"], None, "individual all-reduce after backward"),
    "minimal_ddp_flat_benchmarking": (["naive", "flat"], None, "one flattened all-reduce"),
    "ddp_overlap_individual_parameters_benchmarking": (["ddp"], "adapter-ddp", "overlapped with backward"),
    "ddp_bucketed_benchmarking": (["ddp"], "adapter-ddp-bucketed", "bucketed, per bucket size"),
    "optimizer_state_sharding_accounting": (["ddp", "zero1"], "adapter-sharded-optimizer", "optimizer state sharded"),
    "fsdp": (["fsdp2"], "adapter-fsdp", "fully sharded"),
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
        f"data parallel, {what}: {' '.join(strategies)}",
        module_name("ddp_bench"),
        flags,
        kind="ddp",
        reads=(f"{problem}.csv",),
    )
    if options.model_factory:
        flags["--model-factory"] = options.model_factory
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
        flags.pop("--size-table")
        step.reductions.append(
            f"{'one GPU' if target.gpus == 1 else 'no GPU'}: 2 gloo ranks on CPU at a small shape "
            "(d_model 128, 2 layers, context up to 128, batch 2, 1 + 3 steps): not the handout's "
            "XL timings"
        )
    if adapter_strategy and not options.adapters:
        step.reductions.append(f"{adapter_strategy} (your implementation) needs --adapters; built-in strategies only")
    return [step]
