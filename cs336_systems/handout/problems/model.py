"""The handout's benchmarking, profiling and memory problems: sweeps of the model (benchmark rows),
each size's contexts kept where the estimator says they fit, the warmup study, nsys, memory snapshots."""

from __future__ import annotations

import itertools
from pathlib import Path

from ...models import SIZE_TABLES
from ...tools import module_name
from ..parameters import Options
from ..plan import Step, fit_verdict, model_configs, predicted_peak
from ..target import Target

SCRIPTS = Path(__file__).resolve().parents[3] / "scripts"  # the repository's scripts/, beside the package


def sizes(options: Options) -> list[str]:
    return list(options.scale.sizes or SIZE_TABLES[options.edition])


def model_flags(options: Options, size: str) -> dict:
    flags = {"--size-table": options.edition, "--model-sizes": [size], **options.scale.shape}
    if options.model_factory:
        flags["--model-factory"] = options.model_factory
    return flags


def sweep(
    options: Options,
    target: Target,
    problem: str,
    key: str,
    part: str,
    size: str,
    flags: dict,
    split: str = "--pass-types",
) -> list[Step]:
    """A sweep for one size, one step per value of `split` (pass types, or checkpoint block sizes),
    keeping the contexts the estimator says fit; the others become one `skipped` step each, with the
    predicted bytes against the device's. Steps whose contexts agree are merged again (fewer processes)."""
    scale = options.scale
    base = {
        **model_flags(options, size),
        "--batch-sizes": [scale.batch],
        "--warmup-steps": scale.warmup,
        "--measure-steps": scale.measure,
        **flags,
        "--device": options.device,
    }
    if scale.sweep_tool.endswith("run_benchmarks"):
        base.update({"--timeout": 900, "_child_per_config": True})
    if options.optimizer and "train-step" in base.get("--pass-types", []):
        base["--optimizer"] = options.optimizer
    stem = f"{problem}-{key}-{size}".replace(".", "_")
    running, skipped = [], []
    for value in base[split]:
        fitting, over = [], []
        for context in base["--context-lengths"]:
            worst = worst_peak(options, target, {**base, split: [value], "--context-lengths": [context]})
            (over if fit_verdict(worst, target)[0] == "no" else fitting).append((context, worst))
        if over:
            step = Step(
                f"{stem}-{value}-skipped",
                problem,
                f"{part}: {size} {split[2:-1]} {value} at contexts {' '.join(str(c) for c, _ in over)}",
                scale.sweep_tool,
                {},
            )
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
        step_flags = {
            **base,
            split: values,
            "--context-lengths": list(contexts),
            "--output": [f"{name}.csv", f"{name}.jsonl", f"{name}.md"],
        }
        what = f"{part}: {size} {' '.join(step_flags['--pass-types'])}"
        if split != "--pass-types":
            what += f", {split[2:-1]} {' '.join(map(str, values))}"
        steps.append(
            Step(
                name,
                problem,
                f"{what}, contexts {' '.join(map(str, contexts))}",
                scale.sweep_tool,
                step_flags,
                kind="benchmark",
                reads=(f"{name}.csv",),
                resumable=True,
            )
        )
    return steps + skipped


def worst_peak(options: Options, target: Target, flags: dict) -> int | None:
    if options.model_factory:
        return None
    return max(predicted_peak(target, *c[:5]) for c in model_configs(flags))


def benchmarking_script(options: Options, target: Target) -> list[Step]:
    scale = options.scale
    # 2026 times the optimizer step too (forward / backward / AdamW columns); 2025 forward and backward
    passes = ["forward", "forward-backward"] + (["train-step"] if options.edition == "2026" else [])
    steps = []
    for size in sizes(options):
        steps += sweep(
            options,
            target,
            "benchmarking_script",
            "b",
            "(b) timing",
            size,
            {"--context-lengths": [scale.timing_context], "--pass-types": passes, "--precisions": ["fp32"]},
        )
    warmup = Step(
        "benchmarking_script-c-warmup",
        "benchmarking_script",
        "(c) 0, 1, 2 and 5 warmup steps, each in a fresh process",
        str(SCRIPTS / "warmup_study.py"),
        kind="warmup",
    )
    size = sizes(options)[0]
    warmup.flags = {
        **model_flags(options, size),
        "--context-length": scale.timing_context,
        "--batch-size": scale.batch,
        "--measure-steps": scale.measure,
        "--warmups": [0, 1, 2, 5],
        "--device": options.device,
        "--output-dir": ".",
    }
    warmup.flags["--model-size"] = warmup.flags.pop("--model-sizes")[0]
    device_type = "cpu" if options.device == "cpu" else "cuda"
    warmup.reads = (f"warmup_study_{device_type}.csv",)
    warmup.flags["_writes"] = [f"warmup_study_{device_type}.{ext}" for ext in ("csv", "md", "png")]
    if not _script("scripts/warmup_study.py"):
        warmup.skip("scripts/warmup_study.py is not here (installed without the repository's scripts/)")
    return [*steps, warmup]


def nsys_profile(options: Options, target: Target) -> list[Step]:
    steps = []
    for size, context in itertools.product(sizes(options), options.scale.contexts):
        name = f"nsys_profile-{size}-{context}".replace(".", "_")
        step = Step(
            name,
            "nsys_profile",
            f"{size} train-step at context {context} under nsys (NVTX ranges)",
            str(SCRIPTS / "nsys_profile.sh"),
            kind="benchmark",
        )
        flags = {
            "_stem": name,
            **model_flags(options, size),
            "--context-length": context,
            "--batch-size": options.scale.batch,
            "--pass-type": "train-step",
            "--device": options.device,
        }
        flags["--model-size"] = flags.pop("--model-sizes")[0]
        step.flags = flags
        step.flags["_writes"] = [f"{name}.nsys-rep"]
        if target.type != "cuda":
            step.skip("nsys profiles CUDA kernels: needs a GPU")
        elif not target.nsys and not target.assumed:
            step.skip("nsys is not on PATH (Nsight Systems)")
        else:
            peak = worst_peak(options, target, {**flags, "--model-sizes": [size], "--pass-types": ["train-step"]})
            verdict, why = fit_verdict(peak, target)
            if verdict == "no":
                step.predicted_peak_bytes = peak
                step.skip(why)
        steps.append(step)
    return steps


def mixed_precision_accumulation(options: Options, target: Target) -> list[Step]:
    step = Step(
        "mixed_precision_accumulation",
        "mixed_precision_accumulation",
        "fp32/fp16 accumulation, and the toy model's dtypes under autocast",
        module_name("mixed_precision"),
        {"--device": options.device},
        capture="mixed_precision_accumulation.txt",
        fixed_s=15,
    )
    return [step]


def benchmarking_mixed_precision(options: Options, target: Target) -> list[Step]:
    steps = []
    for size in sizes(options):
        steps += sweep(
            options,
            target,
            "benchmarking_mixed_precision",
            "bf16",
            "bf16 autocast",
            size,
            {
                "--context-lengths": [options.scale.timing_context],
                "--pass-types": ["forward", "forward-backward"],
                "--precisions": ["bf16"],
            },
        )
    return steps


def memory_profiling(options: Options, target: Target) -> list[Step]:
    scale, edition = options.scale, options.edition
    size = scale.memory_size[edition] if not scale.sizes else scale.sizes[0]
    contexts = list(scale.memory_contexts[edition])
    steps = sweep(
        options,
        target,
        "memory_profiling",
        "peaks",
        "peaks",
        size,
        {"--context-lengths": contexts, "--pass-types": ["forward", "train-step"], "--precisions": ["fp32", "bf16"]},
    )
    for pass_type in ("forward", "train-step"):
        name = f"memory_profiling-snapshot-{pass_type}"
        flags = {
            **model_flags(options, size),
            "--context-length": contexts[0],
            "--batch-size": scale.batch,
            "--pass-type": pass_type,
            "--warmup-steps": 1,
            "--measure-steps": 1,
            "--device": options.device,
            "--memory-snapshot": f"{name}.pickle",
        }
        flags["--model-size"] = flags.pop("--model-sizes")[0]
        step = Step(
            name,
            "memory_profiling",
            f"memory snapshot of one {pass_type} ({size}, context {contexts[0]}) for pytorch.org/memory_viz",
            module_name("benchmark"),
            flags,
            kind="benchmark",
        )
        if target.type != "cuda":
            step.skip("a memory snapshot records the CUDA caching allocator: needs a GPU")
        steps.append(step)
    if edition == "2026":
        flags = {
            **model_flags(options, size),
            "--context-length": contexts[0],
            "--batch-size": scale.batch,
            "--device": options.device,
        }
        flags["--model-size"] = flags.pop("--model-sizes")[0]
        step = Step(
            "memory_profiling-residuals",
            "memory_profiling",
            f"what autograd saves per block ({size})",
            module_name("residuals"),
            flags,
            capture="memory_profiling-residuals.txt",
            fixed_s=90,
        )
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
    return sweep(
        options,
        target,
        "gradient_checkpointing",
        "blocks",
        "block sizes",
        size,
        {
            "--context-lengths": [scale.checkpoint_context],
            "--pass-types": ["train-step"],
            "--precisions": ["fp32"],
            "--checkpoint-blocks": list(scale.checkpoint_blocks),
        },
        split="--checkpoint-blocks",
    )


def _script(path: str) -> bool:
    return (SCRIPTS.parent / path).is_file()
