"""--executor slurm for allreduce_bench and ddp_bench: the run as one Slurm job whose tasks are the ranks
(sbatch --nodes N --ntasks-per-node K --gpus-per-node G), submitted by the Slurm executor.

Every task runs this tool's own command line less the executor's flags, under torchrun's variables, which
executor/step.py takes from Slurm's; rank 0 writes the rows into the attempt directory, and this process
passes each on to --output as it appears. Once rank 0's step has ended (its exit marker), or the job has
left the queue, what of the job still runs is cancelled: every rank on a node that answers ends with it, a
rank behind a cut link at its own collective timeout. A unit the job did not reach gets a row saying how
the job ended.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .. import jsontext
from ..argtypes import argv_without, positive_int
from ..errors import UsageError
from ..executor import ATTEMPT_DIR, ExecutorSettings, Job, JobDir, Outcome, add_executor_arguments, settings_from_args
from ..executor.evidence import exit_outcome
from ..executor.jobs import EXITED, STEP_LOG
from ..executor.runner import placement_of
from ..executor.settings import EXECUTOR_DESTS
from ..tools import module_name
from .group import GroupResult, parse_rank_device

ROWS, POLL_S = "rows.jsonl", 1.0
JOB_FLAGS = ("slurm_nodes", "slurm_tasks_per_node")


@dataclass(frozen=True)
class MultiNodeJob:
    settings: ExecutorSettings  # its Slurm request has the nodes and the tasks per node
    job_dir: Path
    command: tuple[str, ...]  # what every task runs ({attempt_dir}: the attempt's directory)
    tool: str

    @property
    def world_size(self) -> int:
        return self.settings.slurm.nodes * self.settings.slurm.tasks_per_node


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    add_executor_arguments(
        parser,
        kinds=("inline", "slurm"),
        job_dir_default="OUTPUT.jobs beside the first .csv/.jsonl --output, else TOOL.jobs here",
        dry_run=False,
        executor_help="inline: the ranks here, spawned or torchrun's (default); slurm: one Slurm job whose tasks "
        "are the ranks, over --slurm-nodes nodes (docs/distributed.md)",
    )
    parser.set_defaults(dry_run=False)
    group = parser.add_argument_group("one Slurm job of several nodes (--executor slurm)")
    group.add_argument("--slurm-nodes", type=positive_int, metavar="N", help="nodes the ranks span (default 1)")
    group.add_argument(
        "--slurm-tasks-per-node",
        type=positive_int,
        metavar="K",
        help="ranks on each node (default: --slurm-gpus-per-node, else 1 on several nodes, 2 on one)",
    )


def check_single_node(args: argparse.Namespace) -> None:
    """Without --executor slurm, no --slurm-* flag (settings_from_args says which)."""
    settings_from_args(args)
    if given := [flag for flag in JOB_FLAGS if getattr(args, flag) is not None]:
        raise UsageError(f"--{given[0].replace('_', '-')} is for --executor slurm (got --executor {args.executor})")


def multinode_job(args: argparse.Namespace) -> MultiNodeJob:
    """The job --executor slurm asks for, checked (one GPU per rank on CUDA, the world size it makes)."""
    device = parse_rank_device(args.device, args.backend)[0]
    settings = settings_from_args(argparse.Namespace(**{**vars(args), "device": device}))
    if not settings.wait:
        raise UsageError("--no-wait is for the sweeps: a distributed tool's rows come back to the process that waits")
    if args.slurm_array_parallelism:
        raise UsageError("--slurm-array-parallelism is for the sweeps: a distributed tool's run is one job")
    nodes = args.slurm_nodes or 1
    tasks = args.slurm_tasks_per_node or args.slurm_gpus_per_job or (1 if nodes > 1 else 2)
    gpus = args.slurm_gpus_per_job if args.slurm_gpus_per_job is not None else (tasks if device == "cuda" else 0)
    if device == "cuda" and gpus < tasks:
        raise UsageError(f"one GPU per rank: --slurm-tasks-per-node {tasks} needs --slurm-gpus-per-node {tasks}")
    if args.world_sizes and args.world_sizes != [nodes * tasks]:
        raise UsageError(
            f"--world-sizes {' '.join(map(str, args.world_sizes))}: the job's ranks are --slurm-nodes {nodes} x "
            f"--slurm-tasks-per-node {tasks} = {nodes * tasks}"
        )
    tool, outputs = args.launch_tool, [Path(path) for path in args.output if Path(path).suffix in (".csv", ".jsonl")]
    job_dir = settings.job_dir or (outputs[0].with_name(outputs[0].stem + ".jobs") if outputs else Path(f"{tool}.jobs"))
    parser = importlib.import_module(module_name(tool)).build_parser()
    argv = argv_without(parser, list(args.argv), {*EXECUTOR_DESTS, *JOB_FLAGS, "world_sizes", "output", "plot"})
    command = (sys.executable, "-m", module_name(tool), *argv, "--output", f"{ATTEMPT_DIR}/{ROWS}")
    request = replace(settings.slurm, nodes=nodes, tasks_per_node=tasks, gpus_per_job=gpus)
    return MultiNodeJob(replace(settings, slurm=request), job_dir.resolve(), command, tool)


def run_job(
    job: MultiNodeJob,
    units: Sequence[Any],
    record_type: type,
    record_for: Callable[..., Any],
    base: dict,
    write: Callable[[Any], None],
    describe: Callable[[Any, Any], str],
) -> list:
    """Submit the job, pass its rows on as rank 0 writes them, end it, and add a row for each unit it did not
    reach (record_for(unit, GroupResult, base, environment)); the records in unit order."""
    from ..child import record_from_row
    from ..executor.slurm import SlurmRunner
    from ..sweep_jobs import STATUS_OF, environment_of

    runner, request = SlurmRunner(job.settings, JobDir(job.job_dir), f"cs336-{job.tool}"), job.settings.slurm
    runner.check()
    name = hashlib.sha1(json.dumps(job.command).encode()).hexdigest()[:16]
    (attempt,) = runner.submit([Job(name, job.command, f"{job.tool}, {request.nodes} node(s)")])
    print(
        f"{runner.describe()}; Slurm job {attempt.job_id}: {request.nodes} node(s) x {request.tasks_per_node} "
        f"rank(s); rank 0's output in {attempt.directory / STEP_LOG}",
        file=sys.stderr,
    )
    records: list = []

    def add(record) -> None:
        records.append(record)
        write(record)
        print(describe(units[len(records) - 1], record), file=sys.stderr, flush=True)

    def take_rows() -> None:
        try:
            lines = (attempt.directory / ROWS).read_text().split("\n")[:-1]  # the last piece: not whole yet
        except OSError:
            return
        for line in lines[len(records) :]:
            add(record_from_row(jsontext.loads(line), record_type))

    outcome = None
    try:
        while outcome is None:
            take_rows()
            marker = attempt.marker(EXITED)
            if marker is not None and not marker.get("terminated_by"):  # a cancelled step: Slurm says more
                kind, error = exit_outcome(marker)
                outcome = Outcome(attempt, kind, marker.get("returncode"), error, placement_of(attempt))
            else:
                poll = runner.poll()
                outcome = next((o for o in poll.outcomes if o.attempt.key == attempt.key), None)
                time.sleep(0 if outcome else POLL_S)
    finally:
        runner.stop([attempt])  # the ranks still running, on every node that answers
        if outcome is not None:
            runner.job_dir.record_settled(outcome, outcome.kind)
    take_rows()
    if records and records[-1].status != "ok":
        return records  # rank 0's row says why the job stopped there
    why = outcome.error or "rank 0 wrote no row for it"
    error = f"no row: Slurm job {attempt.job_id} ended before this unit ({outcome.kind}): {why}"
    environment = environment_of(outcome)
    result = GroupResult(STATUS_OF.get(outcome.kind, "error"), error=error, environment=environment)
    for unit in units[len(records) :]:
        add(record_for(unit, result, base, environment))
    return records
