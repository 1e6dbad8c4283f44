"""What the model problems' plans share: a sweep of one size whose contexts are kept where the
estimator says they fit, the flags of the scale, and what the student's repository provides (their
model, their AdamW), read without importing it."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
from pathlib import Path

from ...loading import put_first_on_path
from ...models import SIZE_TABLES
from ...tools import module_name
from ..parameters import Options
from ..plan import SWEEP, Step, fit_verdict, model_configs, predicted_peak
from ..target import Target

SCRIPTS = Path(__file__).resolve().parents[3] / "scripts"  # the repository's scripts/, beside the package
STUDENT_MODEL = "cs336_basics.model:BasicsTransformerLM"  # the handout's model, from assignment 1
STUDENT_ADAMW = "cs336_basics.optimizer:AdamW"  # assignment 1's AdamW, where the student's repository has it


# where a repository keeps packages besides its root: the handout's own layout puts assignment 1's
# solution (the cs336_basics package) in cs336-basics/, installed by uv as a workspace member
REPOSITORY_FOLDERS = (".", "cs336-basics")


def _folders_of(top: str) -> list[Path]:
    """Where the package `top` is: as Python would import it, else in the repository's own folders."""
    try:
        found = importlib.util.find_spec(top)  # a top-level name: nothing is imported
    except (ImportError, ValueError):
        found = None
    if found is not None and found.submodule_search_locations:
        return [Path(folder) for folder in found.submodule_search_locations]
    return [Path(base, top) for base in REPOSITORY_FOLDERS if Path(base, top, "__init__.py").is_file()]


def repository_packages_on_path() -> None:
    """The packages the repository keeps in its own folders (cs336-basics/cs336_basics) put on the path
    where Python cannot import them yet (the folder not installed), as `uv sync` would have installed
    them: a --model-factory module of the student's that imports cs336_basics finds it."""
    for base in REPOSITORY_FOLDERS[1:]:
        folder = Path(base)
        packages = [p.parent.name for p in folder.glob("*/__init__.py")] if folder.is_dir() else []
        if any(name.isidentifier() and importlib.util.find_spec(name) is None for name in packages):
            put_first_on_path(folder.resolve())


def defined_in_repository(spec: str) -> bool:
    """Whether `package.module:Name` is defined in the repository, read without importing anything:
    the module's file (found from its top-level package, importable or in the repository's folders)
    defines Name at top level. One found in a folder Python does not import from yet (cs336-basics/
    not installed) is put on the path, so the plan's steps import it as the student's tests would."""
    module, _, name = spec.partition(":")
    top, *rest = module.split(".")
    for folder in _folders_of(top):
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
                if importlib.util.find_spec(top) is None:
                    put_first_on_path(folder.parent.resolve())  # the steps inherit the path
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
        base["--timeout"] = 900
    elif scale.target_iqr_pct:  # timed rows that sections compare: measured until resolved, within a cap
        base["--target-iqr"], base["--max-measure-seconds"] = scale.target_iqr_pct, scale.max_measure_s
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
