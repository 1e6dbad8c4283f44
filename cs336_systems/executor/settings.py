"""--executor and its flags: which executor, the local workers, the Slurm job's request. torch-free.

The flags are checked as they are read (argparse types) and together here (settings_from_args): what a
user can get wrong is one line (UsageError), before any job starts.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..argtypes import non_negative_int, positive_int
from ..errors import UsageError
from .jobs import JobDir

EXECUTORS = ("inline", "local", "slurm")
DEFAULT_SLURM_TIME_MIN = 60
# sbatch --mem: a number with an optional unit (K, M, G, T); no unit is megabytes
MEMORY = re.compile(r"^\d+[KMGT]?$", re.IGNORECASE)


@dataclass(frozen=True)
class SlurmRequest:
    """What each Slurm job asks for (sbatch's flags of the same names)."""

    partition: str | None = None
    time_min: int = DEFAULT_SLURM_TIME_MIN
    gpus_per_job: int = 0
    cpus_per_task: int | None = None
    mem: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    setup: tuple[str, ...] = ()
    array_parallelism: int | None = None
    nodelist: str | None = None  # every job on this node (the handout's --slurm-same-node)
    nodes: int = 1  # a distributed tool's one job: its tasks are the ranks (distributed/slurm_job.py)
    tasks_per_node: int = 1


@dataclass(frozen=True)
class ExecutorSettings:
    kind: str = "inline"
    device: str | None = None  # local, slurm: the device every job's configurations name (cpu or cuda:0)
    job_dir: Path | None = None  # None: the caller's default (beside its first output)
    wait: bool = True  # False: submit and return; the same command again collects
    dry_run: bool = False
    workers: int = 1  # local: jobs at once
    gpus: tuple[str, ...] = ()  # local: one per worker (CUDA_VISIBLE_DEVICES); empty on a CPU
    threads_per_worker: int | None = None  # local on a CPU: OMP_NUM_THREADS of each worker
    slurm: SlurmRequest = field(default_factory=SlurmRequest)


def gpu_list(text: str) -> tuple[str, ...]:
    """--gpus 0,1,3: physical GPU indices, each once."""
    parts = [part.strip() for part in text.split(",")]
    if not parts or not all(part.isdigit() for part in parts):
        raise argparse.ArgumentTypeError(f"expected GPU indices separated by commas (e.g. 0,1,3), got {text!r}")
    if len(set(parts)) != len(parts):
        raise argparse.ArgumentTypeError(f"a GPU is listed twice in {text!r}")
    return tuple(parts)


def slurm_memory(text: str) -> str:
    if not MEMORY.match(text.strip()):
        raise argparse.ArgumentTypeError(f"expected sbatch's --mem form (e.g. 16G, 4000M), got {text!r}")
    return text.strip().upper()


def slurm_word(text: str) -> str:
    """A partition, account, QOS or constraint: no spaces or newlines (they would break the sbatch line)."""
    if not text.strip() or any(c.isspace() for c in text.strip()):
        raise argparse.ArgumentTypeError(f"expected one word without spaces, got {text!r}")
    return text.strip()


def setup_line(text: str) -> str:
    if "\n" in text or not text.strip():
        raise argparse.ArgumentTypeError(f"expected one shell line (e.g. 'module load cuda'), got {text!r}")
    return text


def add_executor_arguments(
    parser: argparse.ArgumentParser,
    kinds: tuple[str, ...] = EXECUTORS,
    job_dir_default: str = "OUTPUT.jobs beside the first .csv/.jsonl --output",
    dry_run: bool = True,
    executor_help: str | None = None,
) -> None:
    """The executor's flags; `dry_run` False for a tool whose own --dry-run shows its jobs too (the handout)."""
    group = parser.add_argument_group("executor (where the configurations run: docs/cluster.md)")
    group.add_argument(
        "--executor",
        choices=kinds,
        default="inline",
        help=executor_help
        or "inline: here, one after another (default); local: each configuration a process on this machine, "
        "--workers at once, one GPU each; slurm: each configuration a Slurm job (one job array, through submitit)",
    )
    group.add_argument(
        "--job-dir",
        type=Path,
        metavar="DIR",
        help="local, slurm: each job's files (its rows, log, exit marker) and the ledger of jobs; on a filesystem the "
        f"nodes share (default: {job_dir_default})",
    )
    group.add_argument(
        "--no-wait",
        dest="wait",
        action="store_false",
        help="slurm: submit and return; the same command again merges what finished, redoes what was cancelled, "
        "preempted or timed out, and submits nothing twice",
    )
    if dry_run:
        group.add_argument(
            "--dry-run",
            action="store_true",
            help="slurm: print the sbatch script of the jobs (to submit by hand) and run nothing; local: the commands",
        )
    if "local" in kinds:
        _add_local_arguments(parser)
    else:  # every tool's namespace holds every executor flag: those it lacks read as not given
        parser.set_defaults(workers=None, gpus=None)
    slurm = parser.add_argument_group("slurm executor (sbatch's flags of these names)")
    slurm.add_argument("--slurm-partition", type=slurm_word, metavar="NAME")
    slurm.add_argument(
        "--slurm-time",
        type=positive_int,
        metavar="MINUTES",
        help=f"each job's time limit; a job that reaches it leaves a 'timeout' row (default {DEFAULT_SLURM_TIME_MIN})",
    )
    slurm.add_argument(
        "--slurm-gpus-per-job",
        "--slurm-gpus-per-node",
        type=non_negative_int,
        metavar="N",
        help="GPUs on one node per job (default: 1, or 0 with --device cpu)",
    )
    slurm.add_argument("--slurm-cpus-per-task", type=positive_int, metavar="N", help="CPU cores per job")
    slurm.add_argument("--slurm-mem", type=slurm_memory, metavar="SIZE", help="memory per job (e.g. 32G)")
    slurm.add_argument("--slurm-account", type=slurm_word, metavar="NAME")
    slurm.add_argument("--slurm-qos", type=slurm_word, metavar="NAME")
    slurm.add_argument("--slurm-constraint", type=slurm_word, metavar="FEATURES", help="e.g. a100 (node features)")
    slurm.add_argument(
        "--slurm-setup",
        type=setup_line,
        action="append",
        default=[],
        metavar="LINE",
        help="a shell line each job runs first (repeatable), e.g. 'module load cuda' or 'source .venv/bin/activate'",
    )
    slurm.add_argument(
        "--slurm-array-parallelism", type=positive_int, metavar="N", help="jobs of the array running at once"
    )


def _add_local_arguments(parser: argparse.ArgumentParser) -> None:
    local = parser.add_argument_group("local executor")
    local.add_argument(
        "--workers",
        type=positive_int,
        help="jobs at once (default: one per --gpus GPU on CUDA, 1 on a CPU, where the workers split the cores)",
    )
    local.add_argument(
        "--gpus", type=gpu_list, metavar="0,1,...", help="CUDA: the GPUs the workers take, one each (default: all)"
    )


SLURM_FLAGS = (
    "slurm_partition",
    "slurm_time",
    "slurm_gpus_per_job",
    "slurm_cpus_per_task",
    "slurm_mem",
    "slurm_account",
    "slurm_qos",
    "slurm_constraint",
    "slurm_array_parallelism",
)


# every destination of the flags above: what a job's own command line leaves out (find_max_job.py)
EXECUTOR_DESTS = frozenset(("executor", "job_dir", "wait", "dry_run", "workers", "gpus", *SLURM_FLAGS, "slurm_setup"))


def settings_from_args(args: argparse.Namespace, cuda_count: int = 0) -> ExecutorSettings:
    """The executor asked for, checked against the run's --device (auto, cpu, cuda or cuda:N, as given)
    and this machine's `cuda_count` GPUs (local). A job's device is `cuda:0` (the first GPU it was given)
    or `cpu`: Slurm's auto is CUDA when the job asks for GPUs, local's when this machine has one."""
    kind, device = args.executor, args.device
    flags = vars(args)  # the flags above by their destinations (each declared, or defaulted to None)
    given = lambda name: flags[name] not in (None, [], ())  # noqa: E731
    if kind != "slurm":
        stray = [name for name in (*SLURM_FLAGS, "slurm_setup") if given(name)]
        if stray:
            raise UsageError(f"--{stray[0].replace('_', '-')} is for --executor slurm (got --executor {kind})")
        if not args.wait:
            raise UsageError("--no-wait is for --executor slurm: local workers end with this process")
    if kind != "local" and (given("workers") or given("gpus")):
        raise UsageError(
            f"--{'workers' if given('workers') else 'gpus'} is for --executor local (got --executor {kind})"
        )
    if kind == "inline":
        if args.dry_run:
            raise UsageError("--dry-run shows what an executor would run: give --executor local or slurm")
        if args.job_dir is not None:
            raise UsageError("--job-dir is for --executor local or slurm (inline writes no job files)")
        return ExecutorSettings()
    job_dir = args.job_dir and JobDir(args.job_dir).path  # checked before any work (a file, a link, another user's)
    common = dict(kind=kind, job_dir=job_dir, wait=args.wait, dry_run=args.dry_run)
    if kind == "local":
        return _local(args, device, cuda_count, common)
    if device.startswith("cuda:"):
        raise UsageError(f"--device {device}: Slurm gives each job its own GPUs; give --device cuda")
    if device not in ("auto", "cpu", "cuda"):
        raise UsageError(f"unknown device {device!r}: use auto, cpu or cuda")
    gpus = args.slurm_gpus_per_job
    if gpus is None:
        gpus = 0 if device == "cpu" else 1
    if device == "cuda" and gpus == 0:
        raise UsageError("--device cuda with --slurm-gpus-per-job 0: the jobs would have no GPU")
    request = SlurmRequest(
        partition=args.slurm_partition,
        time_min=args.slurm_time or DEFAULT_SLURM_TIME_MIN,
        gpus_per_job=gpus,
        cpus_per_task=args.slurm_cpus_per_task,
        mem=args.slurm_mem,
        account=args.slurm_account,
        qos=args.slurm_qos,
        constraint=args.slurm_constraint,
        setup=tuple(args.slurm_setup),
        array_parallelism=args.slurm_array_parallelism,
    )
    job_device = "cpu" if device == "cpu" or (device == "auto" and gpus == 0) else "cuda:0"
    return ExecutorSettings(**common, device=job_device, slurm=request)


def _local(args: argparse.Namespace, device: str, cuda_count: int, common: dict) -> ExecutorSettings:
    if device == "auto":
        device = "cuda" if cuda_count else "cpu"
    if device == "cpu":
        if args.gpus:
            raise UsageError("--gpus picks the workers' GPUs: not with --device cpu")
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        workers = min(args.workers or 1, cores)  # each worker a core at least: more only share them (and memory)
        if workers < (args.workers or 1):
            print(f"--workers {args.workers}: {workers}, one per core this process may use", file=sys.stderr)
        threads = max(1, cores // workers)
        return ExecutorSettings(**common, device="cpu", workers=workers, threads_per_worker=threads)
    if device.startswith("cuda:"):
        raise UsageError(f"--device {device}: each local worker takes its own GPU (--gpus); give --device cuda")
    if device != "cuda":
        raise UsageError(f"unknown device {device!r}: use auto, cpu or cuda")
    gpus = args.gpus or tuple(str(index) for index in range(cuda_count))
    if not gpus:
        raise UsageError("--executor local on CUDA found no GPU (give --device cpu)")
    missing = [gpu for gpu in gpus if int(gpu) >= cuda_count]
    if missing:
        raise UsageError(f"--gpus {','.join(gpus)}: GPU {missing[0]} is not one of this machine's {cuda_count}")
    workers = args.workers or len(gpus)
    if workers > len(gpus):
        raise UsageError(f"--workers {workers} with {len(gpus)} GPU(s): each worker takes one GPU of --gpus")
    return ExecutorSettings(**common, device="cuda:0", workers=workers, gpus=gpus[:workers])
