"""python -m cs336_systems.handout: the flags and main."""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import sys
import time
from pathlib import Path

from ..adapters import add_adapters_argument
from ..argtypes import EXIT_FAILED, EXIT_OK, ArgumentParser, timeout_seconds
from ..command import Command
from ..contention import LoadMeter
from ..errors import UsageError
from ..executor import add_executor_arguments
from ..flagfile import add_config_file_argument
from ..results.writing import MADE, place_of
from .budget import fit_budget, format_seconds, parse_duration, total_seconds, wall_seconds
from .executing import (
    PROG,
    executor_settings,
    job_target,
    jobs_at_once,
    jobs_dry_run,
    nodes_target,
    run_as_jobs,
    slurm_output_dir,
    slurm_placement,
)
from .jobs import JOBS
from .outputs import MARKERS, check_output_dir, claim, lock, refuse_file
from .parameters import SCALES, Options
from .problems import EDITIONS, KIND_MEANING, MEASURED, PROBLEMS, build_steps, of_edition
from .run import PLAN_FILE, execute, log_name, not_measured_line, plan_table, recorded_by_markers
from .target import Target, assumed_target, present_target
from .writeup import CHECKLIST_FILE, WRITEUP, write_up

DESCRIPTION = """Plan, run and write up every measurable problem of the CS336 assignment 2 (systems) handout.

    cs336-bench handout --edition 2026 --dry-run --assume-device "H100 80GB"
    cs336-bench handout --edition 2026 --adapters tests/adapters.py --budget 45m
    cs336-bench handout --edition 2026 --device cpu --scale small
    cs336-bench handout --edition 2026 --executor slurm --slurm-partition gpu --slurm-gpus-per-job 1

Each step runs one of this project's tools in its own process and writes its results files into
--output-dir; the same command again continues where a stopped run ended. At the end, the report
of every result goes to OUTPUT_DIR/writeup.{md,tex,typ,pdf}. With --executor local or slurm each
step is a job (handout/jobs.py, docs/cluster.md): on this machine's GPUs at once, or on Slurm.
"""


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog=PROG, description=DESCRIPTION)
    add_config_file_argument(parser)
    parser.add_argument("--edition", choices=tuple(EDITIONS), default="2026", help="which handout (2026)")
    parser.add_argument("--device", default="auto", metavar="auto|cpu|cuda[:N]", help="where the steps run (auto)")
    parser.add_argument(
        "--assume-device",
        metavar="'NAME SIZE'",
        help="plan for a GPU you do not have, e.g. 'H100 80GB' (implies --dry-run)",
    )
    parser.add_argument(
        "--scale",
        choices=tuple(SCALES),
        default="full",
        help="full: the handout's shapes; small: the same plan at small shapes (minutes on a CPU)",
    )
    parser.add_argument(
        "--problems", nargs="+", metavar="NAME", help="only these problems (default: all of the edition)"
    )
    add_adapters_argument(parser, help="your tests/adapters.py: FlashAttention-2, DDP, FSDP")
    parser.add_argument("--model-factory", metavar="package.module:callable", help="your model instead of the built-in")
    parser.add_argument("--optimizer", metavar="package.module:callable", help="your optimizer for training steps")
    parser.add_argument(
        "--timeout",
        type=timeout_seconds,
        metavar="SECONDS",
        help="the limit on importing your code and calling its getters, here and in every step (default 60)",
    )
    parser.add_argument(
        "--budget", metavar="DURATION", help="e.g. 45m: shrink the plan to fit (recorded in the report)"
    )
    parser.add_argument("--output-dir", type=Path, help="default results/handout-EDITION-DEVICE")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and its commands; run nothing")
    parser.add_argument("--no-report", action="store_true", help="run the steps but write no write-up")
    parser.add_argument(
        "--write-up",
        action="store_true",
        help="write the write-up again from --output-dir's plan and results (after a change to this tool); run nothing",
    )
    add_executor_arguments(parser, job_dir_default=f"OUTPUT_DIR/{JOBS}", dry_run=False)
    slurm = next(group for group in parser._action_groups if group.title.startswith("slurm executor"))
    slurm.add_argument(
        "--slurm-same-node",
        action="store_true",
        help="every job on the node of the first one (sbatch --nodelist), so that each table's rows come from one GPU",
    )
    return parser


def _target(args: argparse.Namespace) -> tuple[Target, str]:
    if args.assume_device:
        target = assumed_target(args.assume_device)
        return target, "cuda"
    from ..device import resolve_device

    device = resolve_device(args.device)
    return present_target(device), str(device)


def _check_loadable(args: argparse.Namespace) -> None:
    """The user's code is loaded once here, so a typo is one line before any step starts. A package of
    the repository's own folders that is not installed (cs336-basics/) goes on the path first, as the
    plan finds the student's model without the flag."""
    from .problems.model_steps import repository_packages_on_path

    repository_packages_on_path()
    if args.adapters:
        from ..adapters import load_adapters

        load_adapters(args.adapters)
    if args.model_factory:
        from ..user_model import load_model_factory

        load_model_factory(args.model_factory)
    if args.optimizer:
        from ..optimizer import check_user_optimizer

        check_user_optimizer(args.optimizer)


def rewrite(output_dir: Path | None) -> int:
    """--write-up: the write-up of a finished (or partly finished) plan made again, its first note kept."""
    if output_dir is None or not (output_dir / PLAN_FILE).is_file():
        raise UsageError(f"--write-up needs --output-dir holding a {PLAN_FILE} (a directory handout wrote)")
    lock(output_dir, PLAN_FILE)
    (output_dir / MARKERS).mkdir(exist_ok=True)  # the ledger of what handout wrote there (a copied plan has none)
    previous = output_dir / f"{WRITEUP}.md"
    lines = previous.read_text(errors="replace").splitlines() if previous.is_file() else []
    note = next((line for line in lines if line.startswith("Made by `cs336-bench handout")), None)
    return EXIT_OK if write_report(output_dir, note or "Made by `cs336-bench handout`.") else EXIT_FAILED


def run(args: argparse.Namespace) -> int:
    settings = executor_settings(args)
    if args.write_up:
        return rewrite(args.output_dir)
    measured = [problem.label for problem in of_edition(args.edition, MEASURED)]
    problems = args.problems or measured
    unknown = [p for p in problems if p not in EDITIONS[args.edition]]
    if unknown:
        where = "" if unknown[0] not in PROBLEMS else f" (a problem of the other edition, not {args.edition})"
        raise UsageError(f"--problems {unknown[0]}: unknown{where}; choose from {', '.join(measured)}")
    unmeasured = [p for p in problems if PROBLEMS[p].kind != MEASURED]
    if unmeasured:
        raise UsageError(
            f"--problems {unmeasured[0]}: {KIND_MEANING[PROBLEMS[unmeasured[0]].kind]}, nothing to measure; "
            f"choose from {', '.join(measured)}"
        )
    budget_s = parse_duration(args.budget) if args.budget is not None else None  # '' refused there
    if args.assume_device is not None and not args.assume_device.strip():
        raise UsageError("--assume-device '': name the GPU and its memory, e.g. 'H100 80GB'")
    dry_run = bool(args.dry_run or args.assume_device)
    found = None  # slurm: the first job's report of the nodes' device
    # a Slurm node or an assumed GPU is not this machine: their own runs say how busy they were and whether
    # the user's model runs there
    on_this_machine = settings.kind != "slurm" and not args.assume_device
    here = LoadMeter().start() if on_this_machine else None  # how busy others keep it, over the planning below
    _check_loadable(args)
    if settings.kind == "slurm" and not dry_run:
        found = nodes_target(args, settings)
        if isinstance(found, int):  # its job still queued (--no-wait), or failed
            return found
        target, device = found[0], settings.device
    elif settings.kind == "inline":
        target, device = _target(args)
    else:
        target, device = job_target(args, settings), settings.device
    options = Options(args.edition, SCALES[args.scale], device, args.adapters, args.model_factory, args.optimizer)
    steps = build_steps(options, target, problems)
    lanes = jobs_at_once(settings)
    notes = fit_budget(steps, budget_s, target, args.model_factory is not None, lanes) if budget_s else []
    cannot_run = _probe_user_model(steps) if args.model_factory and on_this_machine else None
    if settings.kind == "slurm":
        output_dir = slurm_output_dir(args, settings)
    else:
        output_dir = args.output_dir or Path("results") / f"handout-{args.edition}-{target.label}"
    refuse_file(output_dir)
    if not dry_run:
        names = written_names(steps, output_dir)
        check_output_dir(output_dir, names, legacy=lambda: recorded_by_markers(steps, output_dir))
        lock(output_dir, PLAN_FILE)  # held until exit: a second handout here is refused

    header = (
        f"Plan for the {args.edition} handout, {args.scale} scale, on {target.describe()}: "
        f"{sum(s.status == 'run' for s in steps)} steps to run, {sum(s.status != 'run' for s in steps)} skipped, "
        f"predicted {format_seconds(total_seconds(steps))} (rough: FLOPs at a fixed share of peak, plus start-up)"
    )
    if lanes != 1:
        at_once = f"{lanes} jobs at once" if lanes else "every job at once"
        header += f", about {format_seconds(wall_seconds(steps, lanes))} from first start to last end with {at_once}"
    if notes:
        header += f"; to fit --budget {args.budget}: {', '.join(notes)}"
    if cannot_run:
        moved = _without_user_model(steps, args.model_factory, cannot_run)
        header += (
            f"\nYour --model-factory model cannot run on {target.name} ({cannot_run}). The {len(moved)} steps that "
            "would measure it measure the built-in model instead (said in each); on a device where it runs, the "
            "same command measures yours."
        )
    if here is not None and (busy := _busy_now(here, str(device or ""))):
        header += "\n" + busy
    if settings.kind == "slurm":
        settings, where = slurm_placement(args, settings, output_dir, found)
        header += where
    if dry_run:
        print(header + "\n")
        print(plan_table(steps, target))
        print(f"\n{not_measured_line(args.edition)}")
        print("\nCommands:\n")
        for step in steps:
            if step.status == "run":
                print(step.shell(output_dir))
        if settings.kind != "inline":
            print(jobs_dry_run(steps, target, output_dir, args, settings))
        return EXIT_OK

    print(header, file=sys.stderr)
    if settings.kind != "inline":
        failed, ended = run_as_jobs(args, settings, steps, target, output_dir, budget_s)
        if not ended:  # the same command collects them and writes the write-up
            return EXIT_FAILED if failed else EXIT_OK
    else:
        failed = _run_inline(args, steps, target, output_dir, budget_s)
    if not args.no_report and not write_report(output_dir, made_by(args, notes, cannot_run)):
        return EXIT_FAILED
    return EXIT_FAILED if failed else EXIT_OK


def _busy_now(meter: LoadMeter, device: str) -> str | None:
    """A sentence when other processes keep this machine (and the GPU the steps use) busy while the plan
    is made (half a second at least): the prediction assumes a machine of its own."""
    if device.startswith("cuda"):
        meter.gpu_index = int(device.partition(":")[2] or 0)  # asked at the end of the window
    load = meter.read(at_least_s=0.5)
    if not load.busy:
        return None
    gpu = f" and {load.gpu_other_processes} other process(es) use the GPU" if load.gpu_other_processes else ""
    return (
        f"Other processes keep {load.other_cores:.1f} of {load.cores} cores busy now{gpu}: the steps will take "
        "longer than predicted, and the write-up says how busy the machine was while each row was measured."
    )


def _run_inline(args: argparse.Namespace, steps, target: Target, output_dir: Path, budget_s) -> bool:
    """The steps one after another in child processes of this one; whether a step failed."""
    started = time.monotonic()
    try:
        outcomes = execute(steps, target, output_dir, args.edition, args.scale, budget_s)
    except KeyboardInterrupt:
        print(
            f"{PROG}: stopped; finished steps are kept in {output_dir}. Continue with the same command:\n"
            f"  {PROG} {shlex.join(args.argv)}",
            file=sys.stderr,
        )
        raise
    ran = [s for s in steps if "elapsed_s" in outcomes.get(s.id, {}) and "command" in outcomes[s.id]]
    print(
        f"{PROG}: {len(ran)} steps took {format_seconds(time.monotonic() - started)}; the plan predicted "
        f"{format_seconds(sum(s.predicted_s or 0 for s in ran))} for them",
        file=sys.stderr,
    )
    failed = [step for step in steps if outcomes.get(step.id, {}).get("outcome", "ok") != "ok"]
    for step in failed:
        print(f"{PROG}: {step.id}: {outcomes[step.id]['outcome']} (see {output_dir / log_name(step)})", file=sys.stderr)
    return bool(failed)


def _probe_user_model(steps: list) -> str | None:
    """--model-factory's model built (one layer) on the plan's device and its logits checked, in a child
    process, before the first step: why it cannot run there, in one line, where its own code raised (a
    CUDA-only call on a CPU), or None; a UsageError where it broke the contract (tuple logits): the
    student mends that. Said now, not as failed rows after minutes of other steps."""
    from ..child import check_user_model_in_child
    from ..user_model import raised_in_users_code
    from .plan import benchmark_configs

    for step in steps:
        if step.status != "run" or "--model-factory" not in step.flags or step.kind != "benchmark":
            continue
        configs = [c for c in benchmark_configs(step) if c.model_factory]
        if configs:
            try:
                check_user_model_in_child(min(configs, key=lambda c: c.batch_size * c.context_length))
            except UsageError as exc:
                if not raised_in_users_code(str(exc)):  # the contract broken (tuple logits...): theirs to mend
                    raise
                return str(exc).removeprefix(f"--model-factory {configs[0].model_factory} ")
            return None
    return None


def _without_user_model(steps: list, factory: str, why: str) -> list:
    """The steps that would run --model-factory's model run the built-in model instead, each saying why;
    the steps changed."""
    moved = []
    short = why.rsplit(": ", 1)[-1]  # the model's own error; the first page says where it failed
    for step in steps:
        if step.status == "run" and step.flags.get("--model-factory") == factory:
            del step.flags["--model-factory"]
            step.part = step.part.replace(f"your model ({factory})", "the built-in model")
            step.reductions.append(
                f"the built-in model: your --model-factory model cannot run on this device ({short})"
            )
            moved.append(step)
    return moved


def written_names(steps, output_dir: Path) -> list[str]:
    """Every file this run may write in `output_dir` (outputs.check_output_dir checks them first)."""
    names = [PLAN_FILE, CHECKLIST_FILE, MADE, *(f"{WRITEUP}{suffix}" for suffix in (".md", ".tex", ".typ", ".pdf"))]
    names += [path.name for path in output_dir.glob(f"{WRITEUP}_*.png")]  # the write-up's figures
    for step in steps:
        if step.status == "run":
            names += [*step.outputs(), log_name(step), f"{MARKERS}/{step.id}.json"]
    return names


def write_report(output_dir: Path, note: str) -> bool:
    """The write-up of the plan into OUTPUT_DIR/writeup.* (PDF when typst is installed), then
    `report --verify` on it. False (after one line) when it failed or does not verify."""
    from ..report.cli import main as report_main  # a command like any other: its status, one line on error

    formats = [".md", ".tex", ".typ"]
    if importlib.util.find_spec("typst") is not None:
        formats.append(".pdf")
    else:
        print(
            f'{PROG}: no PDF: the typst package is not installed (pip install "typst>=0.14"); writing .md, .tex, .typ',
            file=sys.stderr,
        )

    def places() -> list[Path]:  # a write-up the student edited is kept, the new one beside it (writing.place_of)
        return [place_of(output_dir / f"{WRITEUP}{suffix}") for suffix in formats]

    claim(output_dir, [CHECKLIST_FILE, MADE, *(path.name for path in places())])
    problems = write_up(output_dir, [note], formats)
    claim(output_dir, [path.name for path in output_dir.glob(f"{WRITEUP}_*.png")])  # its figures
    for problem in problems:
        print(f"{PROG}: error: {problem}", file=sys.stderr)
    if problems:
        print(f"{PROG}: error: the write-up is incomplete; the results are in {output_dir}", file=sys.stderr)
        return False
    print(f"wrote {', '.join(map(str, places()))}", file=sys.stderr)
    status = report_main(["--verify", str(places()[0]), str(output_dir / PLAN_FILE)])
    if status != 0:
        print(f"{PROG}: error: the write-up does not verify against its results (see above)", file=sys.stderr)
    return status == 0


def made_by(args: argparse.Namespace, budget_notes: list[str], cannot_run: str | None = None) -> str:
    note = f"Made by `cs336-bench handout {shlex.join(_argv_for_note(args))}`"
    if budget_notes:
        note += f"; to fit --budget {args.budget} the plan was shrunk ({', '.join(budget_notes)}): see the checklist"
    if cannot_run:
        note += f"; your --model-factory model could not run on this device ({cannot_run}): the built-in model instead"
    return note + "."


def _argv_for_note(args: argparse.Namespace) -> list[str]:
    """The command's own flags, as a reader would type them again (paths as given)."""
    argv = ["--edition", args.edition, "--scale", args.scale] + (
        ["--device", args.device] if args.device != "auto" else []
    )
    if args.executor != "inline":
        argv += ["--executor", args.executor]
    for flag, value in (
        ("--adapters", args.adapters),
        ("--model-factory", args.model_factory),
        ("--optimizer", args.optimizer),
        ("--budget", args.budget),
        ("--timeout", args.timeout),
    ):
        if value:
            argv += [flag, str(value)]
    return argv


main = Command(build_parser, run)
