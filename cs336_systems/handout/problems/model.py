"""The handout's model problems: sweeps of the model (benchmark rows), each size's contexts kept where
the estimator says they fit, the warmup study, mixed precision, checkpointing; what the student's
repository provides (their model, their AdamW), read without importing it."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
from pathlib import Path

from ...models import SIZE_TABLES
from ...tools import module_name
from ..parameters import Options
from ..plan import SWEEP, Step, fit_verdict, model_configs, predicted_peak, refusal
from ..target import Target

SCRIPTS = Path(__file__).resolve().parents[3] / "scripts"  # the repository's scripts/, beside the package
STUDENT_MODEL = "cs336_basics.model:BasicsTransformerLM"  # the handout's model, as the leaderboard builds it
STUDENT_ADAMW = "cs336_basics.optimizer:AdamW"  # assignment 1's AdamW, where the student's repository has it


def defined_in_repository(spec: str) -> bool:
    """Whether `package.module:Name` is defined where Python would import it from, read without
    importing anything: the module's file (found from its top-level package) defines Name at top level."""
    module, _, name = spec.partition(":")
    top, *rest = module.split(".")
    try:
        found = importlib.util.find_spec(top)  # a top-level name: nothing is imported
    except (ImportError, ValueError):
        return False
    for folder in (found.submodule_search_locations or []) if found else []:
        path = Path(folder, *rest).with_suffix(".py")
        try:
            tree = ast.parse(path.read_text(), str(path))
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in tree.body:
            names = [node.name] if isinstance(node, (ast.ClassDef, ast.FunctionDef)) else []
            if isinstance(node, ast.Assign):
                names = [target.id for target in node.targets if isinstance(target, ast.Name)]
            if name in names:
                return True
    return False


def training_optimizer(options: Options) -> tuple[str | None, str, str | None]:
    """(--optimizer value or None, what the part text calls it, a reduction note or None): the student's
    --optimizer, else assignment 1's AdamW where the repository has it, else torch's AdamW, saying so."""
    if options.optimizer:
        return options.optimizer, f"your optimizer ({options.optimizer})", None
    if defined_in_repository(STUDENT_ADAMW):
        return STUDENT_ADAMW, f"your AdamW ({STUDENT_ADAMW})", None
    note = f"torch's AdamW: no --optimizer given and no {STUDENT_ADAMW} found in your repository"
    return None, "torch's AdamW", note


def sizes(options: Options) -> list[str]:
    return list(options.scale.sizes or SIZE_TABLES[options.edition])


def model_flags(options: Options, size: str) -> dict:
    flags = {"--size-table": options.edition, "--model-sizes": [size], **options.scale.shape}
    if options.model_factory:
        flags["--model-factory"] = options.model_factory
    return flags


# A peak of one configuration from a process of its own: in a shared process a CPU's RSS keeps what the
# configurations before it touched (the allocator does not give it back), and a GPU's cache its blocks.
MEMORY_SWEEP = module_name("run_benchmarks")


def memory_options(options: Options) -> Options:
    """The options of the memory problems: the scale's memory shape where it has one."""
    if options.scale.memory_shape is None:
        return options
    return dataclasses.replace(options, scale=dataclasses.replace(options.scale, shape=options.scale.memory_shape))


def sweep_flags(options: Options, size: str, flags: dict, tool: str | None = None) -> dict:
    """The sweep tool's flags for one size: the scale's batch and steps, then `flags`."""
    scale = options.scale
    tool = tool or scale.sweep_tool
    base = {
        **model_flags(options, size),
        "--batch-sizes": [scale.batch],
        "--warmup-steps": scale.warmup,
        "--measure-steps": scale.measure,
        **flags,
        "--device": options.device,
    }
    if tool.endswith("run_benchmarks"):
        base.update({"--timeout": 900, "_child_per_config": True})
    if options.optimizer and "train-step" in base.get("--pass-types", []):
        base["--optimizer"] = options.optimizer
    return base


def sweep(
    options: Options,
    target: Target,
    problem: str,
    key: str,
    part: str,
    size: str,
    flags: dict,
    split: str = "--pass-types",
    tool: str | None = None,
) -> list[Step]:
    """A sweep for one size, one step per value of `split` (pass types, or checkpoint block sizes),
    keeping the contexts the estimator says fit; the others become one `skipped` step each, with the
    predicted bytes against the device's. Steps whose contexts agree are merged again (fewer processes).
    `tool`: the sweep tool when not the scale's (memory is measured one process per configuration)."""
    scale = options.scale
    tool = tool or scale.sweep_tool
    base = sweep_flags(options, size, flags, tool)
    stem = f"{problem}-{key}-{size}".replace(".", "_")
    running, skipped = [], []
    for value in base[split]:
        fitting, over = [], []
        for context in base["--context-lengths"]:
            worst = worst_peak(options, target, {**base, split: [value], "--context-lengths": [context]}, tool)
            (over if fit_verdict(worst, target)[0] == "no" else fitting).append((context, worst))
        if over:
            name = f"{stem}-{value}"
            contexts = [c for c, _ in over]
            step = Step(
                f"{name}-skipped",
                problem,
                f"{part}: {size} {split[2:-1]} {value} at contexts {' '.join(map(str, contexts))}",
                tool,
                {  # the command that would measure it, kept for the write-up
                    **base,
                    split: [value],
                    "--context-lengths": contexts,
                    "--output": [f"{name}.csv", f"{name}.jsonl", f"{name}.md"],
                },
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
                tool,
                step_flags,
                kind="benchmark",
                reads=(f"{name}.csv",),
                resumable=True,
            )
        )
    return steps + skipped


def worst_peak(options: Options, target: Target, flags: dict, tool: str = SWEEP) -> int | None:
    """The estimator's largest peak over the configurations `tool` runs for `flags` (None: the user's model)."""
    if options.model_factory:
        return None
    return max(predicted_peak(target, config) for config in model_configs(tool, flags))


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
        flags_of=module_name("benchmark"),  # the script's flags are benchmark's, and its own --warmups
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
    warmup.figures = (f"warmup_study_{device_type}.png",)
    warmup.flags["_writes"] = [f"warmup_study_{device_type}.{ext}" for ext in ("csv", "md", "png")]
    if not _script("scripts/warmup_study.py"):
        warmup.skip("scripts/warmup_study.py is not here (installed without the repository's scripts/)")
    return [*steps, warmup]


def _mixed_precision_step(options: Options, name: str, problem: str, part: str) -> Step:
    """The mixed_precision tool: it prints both tables (accumulation, the toy model's dtypes) and
    writes them as rows; each problem's step reads its own table (the `table` column)."""
    return Step(
        name,
        problem,
        part,
        module_name("mixed_precision"),
        {"--device": options.device, "--output": [f"{name}.csv"]},
        reads=(f"{name}.csv",),
        capture=f"{name}.txt",
        fixed_s=15,
    )


def mixed_precision_accumulation(options: Options, target: Target) -> list[Step]:
    name = "mixed_precision_accumulation"
    return [_mixed_precision_step(options, name, name, "0.01 added 1000 times, fp32 and fp16 accumulators")]


def benchmarking_mixed_precision(options: Options, target: Target) -> list[Step]:
    steps = [
        _mixed_precision_step(
            options,
            "benchmarking_mixed_precision-a-dtypes",
            "benchmarking_mixed_precision",
            "(a, b) the toy model's dtypes under fp16 and bf16 autocast",
        )
    ]
    for size in sizes(options):
        steps += sweep(
            options,
            target,
            "benchmarking_mixed_precision",
            "bf16",
            "(c) bf16 autocast",
            size,
            {
                "--context-lengths": [options.scale.timing_context],
                "--pass-types": ["forward", "forward-backward"],
                "--precisions": ["bf16"],
            },
        )
    return steps


def gradient_checkpointing(options: Options, target: Target) -> list[Step]:
    options = memory_options(options)
    scale = options.scale
    size = scale.memory_size["2026"] if not scale.sizes else scale.sizes[0]
    flags = {
        "--context-lengths": [scale.checkpoint_context],
        "--pass-types": ["train-step"],
        "--precisions": ["fp32"],
        "--checkpoint-blocks": list(scale.checkpoint_blocks),
    }
    if options.model_factory:  # refused by the configuration itself; the command kept is the built-in model's
        name = "gradient_checkpointing"
        outputs = {"--output": [f"{name}.csv", f"{name}.jsonl", f"{name}.md"]}
        builtin = sweep_flags(dataclasses.replace(options, model_factory=None), size, {**flags, **outputs})
        step = Step(name, name, f"(b) {size} checkpoint block sizes", scale.sweep_tool, builtin)
        step.skip(refusal(step.tool, {**builtin, "--model-factory": options.model_factory}) or "")
        return [step]
    return sweep(
        options,
        target,
        "gradient_checkpointing",
        "blocks",
        "(b) block sizes",
        size,
        flags,
        "--checkpoint-blocks",
        tool=MEMORY_SWEEP,
    )


def _script(path: str) -> bool:
    return (SCRIPTS.parent / path).is_file()
