"""Every measurable problem of the CS336 assignment 2 (systems) handout, mapped to this project's tools:
one builder per problem turns the handout's parameters (parameters.py) into the plan's steps.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from ..models import SIZE_TABLES
from ..tools import module_name
from .parameters import DDP_CPU_SHAPE, PROBLEMS, Options
from .plan import Step, fit_verdict, model_configs, predict, predicted_peak
from .target import Target

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"  # the repository's scripts/, beside the package


def build_steps(options: Options, target: Target, problems: list[str]) -> list[Step]:
    """The plan: every step of the chosen problems in the handout's order, predicted and judged."""
    steps: list[Step] = []
    for problem in PROBLEMS[options.edition]:
        if problem in problems:
            steps += BUILDERS[problem](options, target)
    for step in steps:
        if step.status == "run":
            predict(step, target, user_model=options.model_factory is not None)
            if not step.reason:
                step.reason = fit_verdict(step.predicted_peak_bytes, target)[1]
    return steps


# -- the model sweeps (benchmark rows) --------------------------------------------------------


def _sizes(options: Options) -> list[str]:
    return list(options.scale.sizes or SIZE_TABLES[options.edition])


def _model_flags(options: Options, size: str) -> dict:
    flags = {"--size-table": options.edition, "--model-sizes": [size], **options.scale.shape}
    if options.model_factory:
        flags["--model-factory"] = options.model_factory
    return flags


def _sweep(options: Options, target: Target, problem: str, key: str, part: str, size: str, flags: dict,
           split: str = "--pass-types") -> list[Step]:
    """A sweep for one size, one step per value of `split` (pass types, or checkpoint block sizes),
    keeping the contexts the estimator says fit; the others become one `skipped` step each, with the
    predicted bytes against the device's. Steps whose contexts agree are merged again (fewer processes)."""
    scale = options.scale
    base = {**_model_flags(options, size), "--batch-sizes": [scale.batch], "--warmup-steps": scale.warmup,
            "--measure-steps": scale.measure, **flags, "--device": options.device}  # fmt: skip
    if scale.sweep_tool.endswith("run_benchmarks"):
        base.update({"--timeout": 900, "_child_per_config": True})
    if options.optimizer and "train-step" in base.get("--pass-types", []):
        base["--optimizer"] = options.optimizer
    stem = f"{problem}-{key}-{size}".replace(".", "_")
    running, skipped = [], []
    for value in base[split]:
        fitting, over = [], []
        for context in base["--context-lengths"]:
            worst = _worst_peak(options, target, {**base, split: [value], "--context-lengths": [context]})
            (over if fit_verdict(worst, target)[0] == "no" else fitting).append((context, worst))
        if over:
            step = Step(f"{stem}-{value}-skipped", problem, f"{part}: {size} {split[2:-1]} {value} at contexts "
                        f"{' '.join(str(c) for c, _ in over)}", scale.sweep_tool, {})  # fmt: skip
            step.predicted_peak_bytes = max(peak for _, peak in over)
            step.skip(fit_verdict(step.predicted_peak_bytes, target)[1])
            skipped.append(step)
        if fitting:
            running.append((value, [c for c, _ in fitting]))
    groups: dict[tuple, list] = {}
    for value, contexts in running:  # values that run the same contexts share one step
        groups.setdefault(tuple(contexts), []).append(value)
    steps = []
    for contexts, values in groups.items():
        name = stem if len(groups) == 1 else f"{stem}-{'-'.join(map(str, values))}"
        step_flags = {**base, split: values, "--context-lengths": list(contexts),
                      "--output": [f"{name}.csv", f"{name}.jsonl", f"{name}.md"]}  # fmt: skip
        what = f"{part}: {size} {' '.join(step_flags['--pass-types'])}"
        if split != "--pass-types":
            what += f", {split[2:-1]} {' '.join(map(str, values))}"
        steps.append(Step(name, problem, f"{what}, contexts {' '.join(map(str, contexts))}", scale.sweep_tool,
                          step_flags, kind="benchmark", reads=(f"{name}.csv",), resumable=True))  # fmt: skip
    return steps + skipped


def _worst_peak(options: Options, target: Target, flags: dict) -> int | None:
    if options.model_factory:
        return None
    return max(predicted_peak(target, *c[:5]) for c in model_configs(flags))


def benchmarking_script(options: Options, target: Target) -> list[Step]:
    scale = options.scale
    # 2026 times the optimizer step too (forward / backward / AdamW columns); 2025 forward and backward
    passes = ["forward", "forward-backward"] + (["train-step"] if options.edition == "2026" else [])
    steps = []
    for size in _sizes(options):
        steps += _sweep(options, target, "benchmarking_script", "b", "(b) timing", size,
                        {"--context-lengths": [scale.timing_context], "--pass-types": passes,
                         "--precisions": ["fp32"]})  # fmt: skip
    warmup = Step("benchmarking_script-c-warmup", "benchmarking_script", "(c) 0, 1, 2 and 5 warmup steps, "
                  "each in a fresh process", str(SCRIPTS / "warmup_study.py"), kind="warmup")  # fmt: skip
    size = _sizes(options)[0]
    warmup.flags = {**_model_flags(options, size), "--context-length": scale.timing_context,
                    "--batch-size": scale.batch, "--measure-steps": scale.measure, "--warmups": [0, 1, 2, 5],
                    "--device": options.device, "--output-dir": "."}  # fmt: skip
    warmup.flags["--model-size"] = warmup.flags.pop("--model-sizes")[0]
    device_type = "cpu" if options.device == "cpu" else "cuda"
    warmup.reads = (f"warmup_study_{device_type}.csv",)
    warmup.flags["_writes"] = [f"warmup_study_{device_type}.{ext}" for ext in ("csv", "md", "png")]
    if not _script("scripts/warmup_study.py"):
        warmup.skip("scripts/warmup_study.py is not here (installed without the repository's scripts/)")
    return [*steps, warmup]


def nsys_profile(options: Options, target: Target) -> list[Step]:
    steps = []
    for size, context in itertools.product(_sizes(options), options.scale.contexts):
        name = f"nsys_profile-{size}-{context}".replace(".", "_")
        step = Step(name, "nsys_profile", f"{size} train-step at context {context} under nsys (NVTX ranges)",
                    str(SCRIPTS / "nsys_profile.sh"), kind="benchmark")  # fmt: skip
        flags = {"_stem": name, **_model_flags(options, size), "--context-length": context,
                 "--batch-size": options.scale.batch, "--pass-type": "train-step",
                 "--device": options.device}  # fmt: skip
        flags["--model-size"] = flags.pop("--model-sizes")[0]
        step.flags = flags
        step.flags["_writes"] = [f"{name}.nsys-rep"]
        if target.type != "cuda":
            step.skip("nsys profiles CUDA kernels: needs a GPU")
        elif not target.nsys and not target.assumed:
            step.skip("nsys is not on PATH (Nsight Systems)")
        else:
            peak = _worst_peak(options, target, {**flags, "--model-sizes": [size], "--pass-types": ["train-step"]})
            verdict, why = fit_verdict(peak, target)
            if verdict == "no":
                step.predicted_peak_bytes = peak
                step.skip(why)
        steps.append(step)
    return steps


def mixed_precision_accumulation(options: Options, target: Target) -> list[Step]:
    step = Step("mixed_precision_accumulation", "mixed_precision_accumulation",
                "fp32/fp16 accumulation, and the toy model's dtypes under autocast", module_name("mixed_precision"),
                {"--device": options.device}, capture="mixed_precision_accumulation.txt", fixed_s=15)  # fmt: skip
    return [step]


def benchmarking_mixed_precision(options: Options, target: Target) -> list[Step]:
    steps = []
    for size in _sizes(options):
        steps += _sweep(options, target, "benchmarking_mixed_precision", "bf16", "bf16 autocast", size,
                        {"--context-lengths": [options.scale.timing_context],
                         "--pass-types": ["forward", "forward-backward"], "--precisions": ["bf16"]})  # fmt: skip
    return steps


def memory_profiling(options: Options, target: Target) -> list[Step]:
    scale, edition = options.scale, options.edition
    size = scale.memory_size[edition] if not scale.sizes else scale.sizes[0]
    contexts = list(scale.memory_contexts[edition])
    steps = _sweep(options, target, "memory_profiling", "peaks", "peaks", size,
                   {"--context-lengths": contexts, "--pass-types": ["forward", "train-step"],
                    "--precisions": ["fp32", "bf16"]})  # fmt: skip
    for pass_type in ("forward", "train-step"):
        name = f"memory_profiling-snapshot-{pass_type}"
        flags = {**_model_flags(options, size), "--context-length": contexts[0], "--batch-size": scale.batch,
                 "--pass-type": pass_type, "--warmup-steps": 1, "--measure-steps": 1, "--device": options.device,
                 "--memory-snapshot": f"{name}.pickle"}  # fmt: skip
        flags["--model-size"] = flags.pop("--model-sizes")[0]
        step = Step(name, "memory_profiling", f"memory snapshot of one {pass_type} ({size}, context {contexts[0]}) "
                    "for pytorch.org/memory_viz", module_name("benchmark"), flags, kind="benchmark")  # fmt: skip
        if target.type != "cuda":
            step.skip("a memory snapshot records the CUDA caching allocator: needs a GPU")
        steps.append(step)
    if edition == "2026":
        flags = {**_model_flags(options, size), "--context-length": contexts[0], "--batch-size": scale.batch,
                 "--device": options.device}  # fmt: skip
        flags["--model-size"] = flags.pop("--model-sizes")[0]
        step = Step("memory_profiling-residuals", "memory_profiling", f"what autograd saves per block ({size})",
                    module_name("residuals"), flags, capture="memory_profiling-residuals.txt", fixed_s=90)  # fmt: skip
        if options.model_factory:
            flags.pop("--model-factory")
            step.reductions.append("residuals reads the built-in model's blocks (not your --model-factory)")
        if scale.name == "small":
            flags["--no-compile"] = True
            step.fixed_s = 20
            step.reductions.append("small scale: the compiled block is left out (compiling it takes a minute on a CPU)")
        steps.append(step)
    return steps


def gradient_checkpointing(options: Options, target: Target) -> list[Step]:
    scale = options.scale
    size = scale.memory_size["2026"] if not scale.sizes else scale.sizes[0]
    if options.model_factory:
        step = Step("gradient_checkpointing", "gradient_checkpointing", "checkpoint block sizes", scale.sweep_tool)
        step.skip("--checkpoint-blocks wraps the built-in model's blocks; it cannot wrap a --model-factory model")
        return [step]
    return _sweep(options, target, "gradient_checkpointing", "blocks", "block sizes", size,
                  {"--context-lengths": [scale.checkpoint_context], "--pass-types": ["train-step"],
                   "--precisions": ["fp32"], "--checkpoint-blocks": list(scale.checkpoint_blocks)},
                  split="--checkpoint-blocks")  # fmt: skip


def _attention_step(options: Options, target: Target, name: str, problem: str, part: str, flags: dict) -> Step:
    flags = {**flags, "--device": options.device, "--output": [f"{name}.csv", f"{name}.jsonl", f"{name}.md"],
             "--plot": f"{name}.png"}  # fmt: skip
    return Step(name, problem, part, module_name("attention_bench"), flags, kind="attention", reads=(f"{name}.csv",))


def pytorch_attention(options: Options, target: Target) -> list[Step]:
    scale = options.scale
    step = _attention_step(options, target, "pytorch_attention", "pytorch_attention",
                           f"naive attention, batch {scale.attention_batch}, one head, forward and backward",
                           {"--implementations": ["naive"], "--batch-size": scale.attention_batch,
                            "--head-dims": list(scale.attention_head_dims),
                            "--context-lengths": list(scale.attention_contexts),
                            "--warmup-steps": 5, "--measure-steps": scale.attention_measure})  # fmt: skip
    step.reason = ("runs every shape, those predicted not to fit too: the handout asks where attention runs "
                   "out of memory, and attention_bench records an out-of-memory as an oom row")
    return [step]


def torch_compile(options: Options, target: Target) -> list[Step]:
    scale = options.scale
    attention = _attention_step(options, target, "torch_compile-attention", "torch_compile",
                                "(a) torch.compile'd attention on the pytorch_attention grid",
                                {"--implementations": ["compiled"], "--batch-size": scale.attention_batch,
                                 "--head-dims": list(scale.attention_head_dims),
                                 "--context-lengths": list(scale.attention_contexts),
                                 "--warmup-steps": 5, "--measure-steps": scale.attention_measure})  # fmt: skip
    attention.reason = "runs every shape (out-of-memory is a row, as in pytorch_attention)"
    steps = [attention]
    for size in _sizes(options):
        steps += _sweep(options, target, "torch_compile", "b", "(b) compiled model", size,
                        {"--context-lengths": [scale.timing_context], "--pass-types": ["forward", "train-step"],
                         "--precisions": ["fp32"], "--compile": "both"})  # fmt: skip
    return steps


def flash_benchmarking(options: Options, target: Target) -> list[Step]:
    scale = options.scale
    implementations = ["naive", "flash-triton" if target.type == "cuda" else "flash-pytorch"]
    step = _attention_step(options, target, "flash_benchmarking", "flash_benchmarking",
                           f"your FlashAttention-2 ({implementations[1]}) against PyTorch attention, batch 1, causal",
                           {"--implementations": implementations, "--adapters": options.adapters,
                            "--layout": "bsd", "--batch-size": 1, "--head-dims": list(scale.flash_head_dims),
                            "--context-lengths": list(scale.flash_contexts), "--precisions": ["bf16", "fp32"],
                            "--timer": "do-bench" if target.type == "cuda" else "host",
                            "--warmup-steps": 5, "--measure-steps": scale.attention_measure})  # fmt: skip
    if not options.adapters:
        step.skip("needs your FlashAttention-2: --adapters tests/adapters.py")
    elif target.type != "cuda":
        step.reductions.append("no GPU: your PyTorch FlashAttention-2 (flash-pytorch) instead of the Triton one, "
                               "host timer instead of do_bench")  # fmt: skip
    elif not target.triton:
        step.skip("flash-triton needs Triton, which is not installed")
    return [step]


def leaderboard(options: Options, target: Target) -> list[Step]:
    batch_heads, sequence, head_dim = options.scale.leaderboard
    step = _attention_step(options, target, "leaderboard", "leaderboard",
                           f"FlashAttention-2 forward + backward, {batch_heads} heads x {head_dim}, sequence {sequence}, "
                           "bf16, causal, do_bench", {"--implementations": ["flash-triton"], "--adapters": options.adapters,
                           "--layout": "bsd", "--batch-size": batch_heads, "--head-dims": [head_dim],
                           "--context-lengths": [sequence], "--precisions": ["bf16"], "--timer": "do-bench",
                           "--warmup-steps": 5, "--measure-steps": options.scale.attention_measure})  # fmt: skip
    if not options.adapters:
        step.skip("needs your Triton FlashAttention-2: --adapters tests/adapters.py")
    elif target.type != "cuda" or not target.triton:
        step.skip("the leaderboard times the Triton kernel on a GPU: needs CUDA and Triton")
    return [step]


def distributed_communication_single_node(options: Options, target: Target) -> list[Step]:
    scale = options.scale
    steps = []
    for backend, device in (("gloo", "cpu"), ("nccl", "cuda")):
        name = f"distributed_communication_single_node-{backend}"
        worlds = list(scale.allreduce_worlds)
        flags = {"--backend": backend, "--device": device, "--world-sizes": worlds,
                 "--sizes": list(scale.allreduce_sizes), "--warmup-steps": 5, "--measure-steps": 20,
                 "--output": [f"{name}.csv", f"{name}.jsonl", f"{name}.md"], "--plot": f"{name}.png"}  # fmt: skip
        step = Step(name, "distributed_communication_single_node", f"all-reduce, {backend} on {device}",
                    module_name("allreduce_bench"), flags, kind="allreduce", reads=(f"{name}.csv",))  # fmt: skip
        if backend == "nccl":
            usable = [w for w in worlds if w <= target.gpus]
            if not usable:
                step.skip(f"NCCL all-reduce needs at least 2 GPUs; this plan has {target.gpus}")
            elif usable != worlds:
                flags["--world-sizes"] = usable
                step.reductions.append(f"world sizes {' '.join(str(w) for w in worlds if w > target.gpus)} "
                                       f"dropped: {target.gpus} GPUs")  # fmt: skip
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


def _ddp(problem: str, options: Options, target: Target) -> list[Step]:
    scale = options.scale
    strategies, adapter_strategy, what = DDP_PROBLEMS[problem]
    strategies = list(strategies) + ([adapter_strategy] if adapter_strategy and options.adapters else [])
    flags = {"--strategies": strategies, "--size-table": options.edition, "--model-size": scale.ddp_size,
             "--context-length": scale.ddp_context, "--batch-size": scale.batch, "--warmup-steps": scale.warmup,
             "--measure-steps": scale.measure, "--output": [f"{problem}.csv", f"{problem}.jsonl", f"{problem}.md"]}  # fmt: skip
    if "bucketed" in problem:
        flags["--bucket-cap-mb"] = list(scale.buckets)
    if adapter_strategy and options.adapters:
        flags["--adapters"] = options.adapters
    step = Step(problem, problem, f"data parallel, {what}: {' '.join(strategies)}", module_name("ddp_bench"),
                flags, kind="ddp", reads=(f"{problem}.csv",))  # fmt: skip
    if options.model_factory:
        flags["--model-factory"] = options.model_factory
    if options.optimizer:
        flags["--optimizer"] = options.optimizer  # ddp_bench steps it under each strategy
    if target.gpus >= 2:
        flags.update({"--backend": "nccl", "--device": "cuda", "--world-sizes": [2]})
    else:
        flags.update({"--backend": "gloo", "--device": "cpu", "--world-sizes": [2], **DDP_CPU_SHAPE,
                      "--model-size": "small", "--context-length": min(scale.ddp_context, 128),
                      "--batch-size": 2, "--warmup-steps": 1, "--measure-steps": 3})  # fmt: skip
        flags.pop("--size-table")
        step.reductions.append(f"{'one GPU' if target.gpus == 1 else 'no GPU'}: 2 gloo ranks on CPU at a small shape "
                               "(d_model 128, 2 layers, context up to 128, batch 2, 1 + 3 steps): not the handout's "
                               "XL timings")  # fmt: skip
    if adapter_strategy and not options.adapters:
        step.reductions.append(f"{adapter_strategy} (your implementation) needs --adapters; built-in strategies only")
    return [step]


def _script(path: str) -> bool:
    return (SCRIPTS.parent / path).is_file()


BUILDERS = {
    "benchmarking_script": benchmarking_script,
    "nsys_profile": nsys_profile,
    "mixed_precision_accumulation": mixed_precision_accumulation,
    "benchmarking_mixed_precision": benchmarking_mixed_precision,
    "memory_profiling": memory_profiling,
    "gradient_checkpointing": gradient_checkpointing,
    "pytorch_attention": pytorch_attention,
    "torch_compile": torch_compile,
    "flash_benchmarking": flash_benchmarking,
    "distributed_communication_single_node": distributed_communication_single_node,
    **{problem: (lambda options, target, problem=problem: _ddp(problem, options, target)) for problem in DDP_PROBLEMS},
    "leaderboard": leaderboard,
}
