"""handout --executor local|slurm: the executor's settings, the device the jobs see (the first Slurm job
reports the nodes'), and the steps run as jobs and collected (jobs.py); docs/cluster.md."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path

from ..argtypes import EXIT_FAILED, EXIT_OK
from ..errors import UsageError
from ..executor import ExecutorSettings, open_runner, settings_from_args
from ..tools import prog
from .budget import format_seconds
from .jobs import PlanJobs, job_dir_of, run_jobs
from .nodes import TARGET_RECORD, TargetJobFailed, find_target, known_target, node_of
from .outputs import check_output_dir, lock, refuse_file
from .run import PLAN_FILE, log_name
from .target import Target, assumed_target, present_target

PROG = prog("handout")


def executor_settings(args: argparse.Namespace) -> ExecutorSettings:
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


def job_target(args: argparse.Namespace, settings: ExecutorSettings) -> Target:
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
    known = known_target(slurm_output_dir(args, settings), settings.device)
    if known is not None:
        return known[0]
    if settings.device != "cpu":
        raise UsageError(
            "--executor slurm --dry-run: no job has reported the nodes' GPU yet; name it with --assume-device "
            "'H100 80GB' (or run without --dry-run: its first job finds it)"
        )
    return present_target(torch.device("cpu"))


def nodes_target(args: argparse.Namespace, settings: ExecutorSettings) -> tuple[Target, dict] | int:
    """--executor slurm: the nodes' device (and its record: the node), as an earlier run's first job found it
    or as one finds it now; an exit status when that job is still in Slurm's queue (--no-wait) or failed."""
    output_dir = slurm_output_dir(args, settings)
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


def slurm_output_dir(args: argparse.Namespace, settings: ExecutorSettings) -> Path:
    """--output-dir, else results/handout-EDITION-slurm[-PARTITION]: the nodes' device is not known before a
    job reports it, and the directory keeps what it reported."""
    partition = f"-{settings.slurm.partition}" if settings.slurm.partition else ""
    return args.output_dir or Path("results") / f"handout-{args.edition}-slurm{partition}"


def slurm_placement(args, settings: ExecutorSettings, output_dir: Path, found) -> tuple[ExecutorSettings, str]:
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


def jobs_dry_run(steps, target: Target, output_dir: Path, args, settings: ExecutorSettings) -> str:
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


def jobs_at_once(settings: ExecutorSettings) -> int | None:
    """How many steps run at once: 1 inline, --workers locally, --slurm-array-parallelism on Slurm (None:
    no limit of ours; the cluster's queue decides)."""
    if settings.kind == "local":
        return settings.workers
    return settings.slurm.array_parallelism if settings.kind == "slurm" else 1


def run_as_jobs(
    args, settings: ExecutorSettings, steps, target: Target, output_dir: Path, budget_s
) -> tuple[bool, bool]:
    """Each step a job of the executor: (whether a step failed, whether every step has ended: the write-up
    is due). Within `budget_s` (from this command's start), a step whose predicted end is past it is not
    submitted, and the jobs still queued or running at its end are stopped (jobs.run_jobs)."""
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
    return bool(failed), not (ran.in_flight or ran.waiting)
