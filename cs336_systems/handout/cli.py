"""python -m cs336_systems.handout: the flags and main."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import shlex
import sys
import time
from pathlib import Path

from ..adapters import add_adapters_argument
from ..argtypes import EXIT_FAILED, EXIT_OK, ArgumentParser
from ..command import Command
from ..errors import UsageError
from ..executor import ExecutorSettings, add_executor_arguments, open_runner, settings_from_args
from ..flagfile import add_config_file_argument
from ..tools import prog
from ..usercode import timeout_seconds
from .jobs import (
    JOBS,
    TARGET_RECORD,
    PlanJobs,
    TargetJobFailed,
    find_target,
    job_dir_of,
    known_target,
    node_of,
    run_jobs,
)
from .outputs import MARKERS, check_output_dir, claim, lock, refuse_file
from .parameters import SCALES, Options
from .plan import fit_budget, format_seconds, parse_duration, total_seconds, wall_seconds
from .problems import EDITIONS, KIND_MEANING, MEASURED, PROBLEMS, build_steps, of_edition
from .run import PLAN_FILE, execute, log_name, not_measured_line, plan_table, recorded_by_markers
from .target import Target, assumed_target, present_target
from .writeup import CHECKLIST_FILE, WRITEUP, write_up

PROG = prog("handout")
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
    parser = ArgumentParser(prog=PROG, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
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


def _executor(args: argparse.Namespace) -> ExecutorSettings:
    """--executor and its flags, checked (handout's own --dry-run shows any executor's jobs)."""
    if args.slurm_same_node and args.executor != "slurm":
        raise UsageError(f"--slurm-same-node is for --executor slurm (got --executor {args.executor})")
    if args.write_up and args.executor != "inline":
        raise UsageError("--write-up runs nothing: it takes no --executor")
    cuda_count = 0
    if args.executor == "local":
        import torch

        cuda_count = torch.cuda.device_count()
    return settings_from_args(argparse.Namespace(**{**vars(args), "dry_run": False}), cuda_count)


def _job_target(args: argparse.Namespace, settings: ExecutorSettings) -> Target:
    """--executor local: this machine's device as each worker sees it (one GPU); slurm --dry-run: the one an
    earlier run's first job found, else this machine's CPU for --device cpu (a GPU node's must be named)."""
    if args.assume_device and settings.kind == "local":
        raise UsageError("--assume-device plans for a GPU not here; --executor local runs on this machine's (or slurm)")
    if args.assume_device:
        if settings.device == "cpu":
            raise UsageError("--assume-device names a GPU: the jobs would run on --device cpu")
        return assumed_target(args.assume_device)
    import torch

    if settings.kind == "local":
        target = present_target(torch.device(settings.device))
        return dataclasses.replace(target, gpus=1) if target.type == "cuda" else target
    known = known_target(_slurm_output_dir(args, settings), settings.device)
    if known is not None:
        return known[0]
    if settings.device != "cpu":
        raise UsageError(
            "--executor slurm --dry-run: no job has reported the nodes' GPU yet; name it with --assume-device "
            "'H100 80GB' (or run without --dry-run: its first job finds it)"
        )
    return present_target(torch.device("cpu"))


def _nodes_target(args: argparse.Namespace, settings: ExecutorSettings) -> tuple[Target, dict] | int:
    """--executor slurm: the nodes' device (and its record: the node), as an earlier run's first job found it
    or as one finds it now; an exit status when that job is still in Slurm's queue (--no-wait) or failed."""
    output_dir = _slurm_output_dir(args, settings)
    refuse_file(output_dir)
    check_output_dir(output_dir, [PLAN_FILE, TARGET_RECORD])
    lock(output_dir, PLAN_FILE)  # held until exit: a second handout here is refused
    job_dir = job_dir_of(output_dir, settings.job_dir)
    runner = open_runner(settings, job_dir, job_name="cs336-handout")
    runner.check()
    try:
        found = find_target(runner, job_dir, output_dir, settings.device, settings.wait)
    except TargetJobFailed as exc:
        print(f"{PROG}: error: the first job, which finds the nodes' device, failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if found is None:
        print(
            f"{PROG}: the steps are planned for the device that job finds; once it ran, the same command plans "
            f"and submits them:\n  {PROG} {shlex.join(args.argv)}",
            file=sys.stderr,
        )
        return EXIT_OK
    return found


def _slurm_output_dir(args: argparse.Namespace, settings: ExecutorSettings) -> Path:
    """--output-dir, else results/handout-EDITION-slurm[-PARTITION]: the nodes' device is not known before a
    job reports it, and the directory keeps what it reported."""
    partition = f"-{settings.slurm.partition}" if settings.slurm.partition else ""
    return args.output_dir or Path("results") / f"handout-{args.edition}-slurm{partition}"


def run(args: argparse.Namespace) -> int:
    settings = _executor(args)
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
    _check_loadable(args)
    if settings.kind == "slurm" and not dry_run:
        found = _nodes_target(args, settings)
        if isinstance(found, int):  # its job still queued (--no-wait), or failed
            return found
        target, device = found[0], settings.device
    elif settings.kind == "inline":
        target, device = _target(args)
    else:
        target, device = _job_target(args, settings), settings.device
    options = Options(args.edition, SCALES[args.scale], device, args.adapters, args.model_factory, args.optimizer)
    steps = build_steps(options, target, problems)
    lanes = _jobs_at_once(settings)
    notes = fit_budget(steps, budget_s, target, args.model_factory is not None, lanes) if budget_s else []
    if settings.kind == "slurm":
        output_dir = _slurm_output_dir(args, settings)
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
    if settings.kind == "slurm":
        settings, where = _slurm_placement(args, settings, output_dir, found)
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
            print(_jobs_dry_run(steps, target, output_dir, args, settings))
        return EXIT_OK

    print(header, file=sys.stderr)
    if settings.kind != "slurm":  # a Slurm job's node is not this one: its first step says
        _probe_user_model(steps)
    if settings.kind != "inline":
        return _run_jobs(args, settings, steps, target, output_dir, notes, budget_s)
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
    if not args.no_report and not write_report(output_dir, made_by(args, notes)):
        return EXIT_FAILED
    return EXIT_FAILED if failed else EXIT_OK


def _probe_user_model(steps: list) -> None:
    """--model-factory's model built (one layer) on the plan's device and its logits checked, in a child
    process, before the first step: a model that cannot run there (a CUDA-only call, the wrong logits)
    is one line now, not a failed row after minutes of other steps."""
    from ..child import check_user_model_in_child
    from .plan import benchmark_configs

    for step in steps:
        if step.status != "run" or "--model-factory" not in step.flags or step.kind != "benchmark":
            continue
        configs = [c for c in benchmark_configs(step) if c.model_factory]
        if configs:
            check_user_model_in_child(min(configs, key=lambda c: c.batch_size * c.context_length))
            return


def _slurm_placement(args, settings: ExecutorSettings, output_dir: Path, found) -> tuple[ExecutorSettings, str]:
    """--slurm-same-node: every job pinned to the node the first job ran on (sbatch --nodelist); and what the
    plan's header says of where the jobs run."""
    record = found[1] if found else (known_target(output_dir, settings.device) or (None, None))[1]
    if record is None and args.slurm_same_node:  # --dry-run before any job ran
        return settings, "; on Slurm (--slurm-same-node: the node of the first job, once it ran)"
    if record is None:
        return settings, "; on Slurm"
    node = node_of(record)
    if not args.slurm_same_node:
        return settings, f"; its device as a first Slurm job found it on node {node}"
    pinned = dataclasses.replace(settings, slurm=dataclasses.replace(settings.slurm, nodelist=node))
    return pinned, f"; every job on node {node} (--slurm-same-node)"


def _jobs_dry_run(steps, target: Target, output_dir: Path, args, settings: ExecutorSettings) -> str:
    """The jobs of the steps not done that can start now (the sbatch script, or local's commands)."""
    job_dir = job_dir_of(output_dir, settings.job_dir)
    plan = PlanJobs(steps, target, output_dir, args.edition, args.scale, job_dir)
    pending = [s for s in plan.runnable if s.id not in plan.done]
    first = [s for s in pending if not plan.waits_for(s)]
    later = len(pending) - len(first)
    if not pending:
        return f"\nJobs (--executor {settings.kind}): none, every step is done in {output_dir}"
    said = f"\nJobs (--executor {settings.kind}): the {len(first)} step(s) not done in {output_dir} that can start now"
    if later:
        said += f"; {later} more read their output and are submitted by the same command once those are done"
    return f"{said}:\n\n{open_runner(settings, job_dir, job_name='cs336-handout').dry_run([plan.jobs[s.id] for s in first])}"


def _jobs_at_once(settings: ExecutorSettings) -> int | None:
    """How many steps run at once: 1 inline, --workers locally, --slurm-array-parallelism on Slurm (None:
    no limit of ours; the cluster's queue decides)."""
    if settings.kind == "local":
        return settings.workers
    return settings.slurm.array_parallelism if settings.kind == "slurm" else 1


def _run_jobs(
    args, settings: ExecutorSettings, steps, target: Target, output_dir: Path, notes: list[str], budget_s
) -> int:
    """Each step a job of the executor; the write-up once every step has ended. Within `budget_s` (from
    this command's start), a step whose predicted end is past it is not submitted; one submitted runs to
    its end (on Slurm its --slurm-time bounds it)."""
    job_dir = job_dir_of(output_dir, settings.job_dir)
    runner = open_runner(settings, job_dir, job_name="cs336-handout")
    if settings.kind == "slurm":
        runner.check()
    print(runner.describe(), file=sys.stderr)
    plan = PlanJobs(steps, target, output_dir, args.edition, args.scale, job_dir)
    again = f"  {PROG} {shlex.join(args.argv)}"
    try:
        ran = run_jobs(plan, runner, settings.wait, budget_s)
    except KeyboardInterrupt:
        runner.close()  # local: its workers stop (their steps run again); slurm: the jobs live on
        plan.merge(runner.poll().outcomes)  # local: each stopped step 'interrupted' in the plan file
        where = "stay in Slurm's queue" if runner.kind == "slurm" else "were stopped; their steps run again"
        print(
            f"{PROG}: stopped; finished steps are in {output_dir}, the running jobs {where}. Continue with:\n{again}",
            file=sys.stderr,
        )
        raise
    finally:
        runner.close()
    took = [s for s in steps if s.id in plan.ended and ran.outcomes[s.id].get("elapsed_s") is not None]
    if took:
        print(
            f"{PROG}: {len(took)} steps ran as jobs in {format_seconds(ran.wall_s)} (their own times add up to "
            f"{format_seconds(sum(ran.outcomes[s.id]['elapsed_s'] for s in took))}); the plan predicted "
            f"{format_seconds(sum(s.predicted_s or 0 for s in took))} for them",
            file=sys.stderr,
        )
    pending = {s.id for s in ran.in_flight + ran.waiting}
    failed = [s for s in plan.runnable if s.id not in pending and ran.outcomes.get(s.id, {}).get("outcome") != "ok"]
    for step in failed:
        print(
            f"{PROG}: {step.id}: {ran.outcomes[step.id]['outcome']} (see {output_dir / log_name(step)})",
            file=sys.stderr,
        )
    if ran.in_flight or ran.waiting:
        where = "in Slurm's queue" if runner.kind == "slurm" else "in flight"
        print(
            f"{PROG}: {len(ran.in_flight)} step(s) {where}, {len(ran.waiting)} waiting for their output; the same "
            f"command collects them and writes the write-up:\n{again}",
            file=sys.stderr,
        )
        return EXIT_FAILED if failed else EXIT_OK
    if not args.no_report and not write_report(output_dir, made_by(args, notes)):
        return EXIT_FAILED
    return EXIT_FAILED if failed else EXIT_OK


def written_names(steps, output_dir: Path) -> list[str]:
    """Every file this run may write in `output_dir` (outputs.check_output_dir checks them first)."""
    names = [PLAN_FILE, CHECKLIST_FILE, *(f"{WRITEUP}{suffix}" for suffix in (".md", ".tex", ".typ", ".pdf"))]
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
    claim(output_dir, [CHECKLIST_FILE, *(f"{WRITEUP}{suffix}" for suffix in formats)])
    problems = write_up(output_dir, [note], formats)
    claim(output_dir, [path.name for path in output_dir.glob(f"{WRITEUP}_*.png")])  # its figures
    for problem in problems:
        print(f"{PROG}: error: {problem}", file=sys.stderr)
    if problems:
        print(f"{PROG}: error: the write-up is incomplete; the results are in {output_dir}", file=sys.stderr)
        return False
    print(f"wrote {', '.join(str(output_dir / f'{WRITEUP}{s}') for s in formats)}", file=sys.stderr)
    status = report_main(["--verify", str(output_dir / f"{WRITEUP}.md"), str(output_dir / PLAN_FILE)])
    if status != 0:
        print(f"{PROG}: error: the write-up does not verify against its results (see above)", file=sys.stderr)
    return status == 0


def made_by(args: argparse.Namespace, budget_notes: list[str]) -> str:
    note = f"Made by `cs336-bench handout {shlex.join(_argv_for_note(args))}`"
    if budget_notes:
        note += f"; to fit --budget {args.budget} the plan was shrunk ({', '.join(budget_notes)}): see the checklist"
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
