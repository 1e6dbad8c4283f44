"""One driver for every distributed tool (allreduce_bench, ddp_bench): the shared flags, the world
sizes, spawned ranks or torchrun, the sink on rank 0 only, the row loop and the exit status.

A tool supplies its worker, its units per world size and how a unit's GroupResult becomes a
record; a failed group is a row with status error / oom / timeout, never a raise.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..argtypes import ArgumentParser, add_device_argument, add_output_argument, positive_int, timeout_seconds
from ..command import add_argument_with_aliases
from ..contention import LoadMeter, with_load
from ..loading import hung_imports_shared
from ..placement import EXECUTOR_ENV
from ..results import Environment, collect_environment
from ..tools import prog
from ..usercode import DefaultLimit
from .group import (
    BACKENDS,
    DEFAULT_INIT_TIMEOUT_S,
    GroupResult,
    LaunchError,
    LaunchSpec,
    Worker,
    check_launch,
    default_threads_per_rank,
    device_for,
    maybe_inject_failure,
    parse_rank_device,
)
from .slurm_job import MultiNodeJob, add_job_arguments, check_single_node, multinode_job, run_job
from .spawn import run_spawned
from .torchrun import (
    check_torchrun_environment,
    join_rendezvous,
    run_under_torchrun,
    torchrun_local_world_size,
    torchrun_rank,
    torchrun_threads_per_rank,
    torchrun_world_size,
    under_torchrun,
)


def launch_parser(tool: str, description: str, *, default_timeout_s: float) -> ArgumentParser:
    """A distributed tool's parser, opening with the flags every one of them shares, spelled as every
    other tool spells them."""
    parser = ArgumentParser(prog=prog(tool), description=description)
    parser.set_defaults(launch_tool=tool)  # the job's command line is this tool's (slurm_job.py)
    parser.add_argument(
        "--backend", choices=BACKENDS, default="gloo", help="gloo (CPU, or CUDA tensors) or nccl (CUDA)"
    )
    add_argument_with_aliases(
        parser,
        "--world-sizes",
        "--world-size",
        nargs="+",
        type=positive_int,
        metavar="N",
        help="ranks per run, one or more (default: 2 for gloo, the GPU count for nccl; under torchrun, its WORLD_SIZE)",
    )
    add_device_argument(
        parser, help="auto (cuda for nccl, cpu for gloo), cpu, cuda or cuda:N (rank r on cuda:N+r); nccl refuses cpu"
    )
    parser.add_argument(
        "--threads-per-rank", type=positive_int, help="CPU threads per rank (default: cores / the largest world size)"
    )
    parser.add_argument(
        "--timeout",
        type=timeout_seconds,
        default=DefaultLimit(default_timeout_s),  # not the user's: an import of their code keeps its own default
        metavar="SECONDS",
        help=f"per unit: status 'timeout' after this long ({default_timeout_s:g}); given, it limits importing "
        "your code too",
    )
    parser.add_argument(
        "--init-timeout",
        type=timeout_seconds,
        default=DEFAULT_INIT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"for starting the ranks and joining the group ({DEFAULT_INIT_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--probe-links",
        action="store_true",
        help="on one host too: probe each link between ranks first and predict every all-reduce from the links "
        "(ranks on several hosts: always)",
    )
    add_output_argument(parser, help=".csv, .md or .jsonl; repeatable")
    add_job_arguments(parser)
    return parser


@dataclass(frozen=True)
class Launch:
    """What the shared flags resolved to on this machine."""

    backend: str
    device: str  # as asked: auto, cpu, cuda or cuda:N
    world_sizes: tuple[int, ...]
    threads_per_rank: int
    torchrun: bool
    timeout_s: float
    init_timeout_s: float
    probe_links: bool = False
    job: MultiNodeJob | None = None  # --executor slurm: the run is this Slurm job, its tasks the ranks

    @property
    def rank0(self) -> bool:
        """Only rank 0 writes rows (every rank runs this code under torchrun)."""
        return not self.torchrun or torchrun_rank() == 0

    @property
    def first_device(self) -> torch.device:
        if self.job:  # the nodes' device, not this machine's
            return torch.device(parse_rank_device(self.device, self.backend)[0])
        return device_for(self.backend, 0, self.device)

    def spec(self, world_size: int) -> LaunchSpec:
        return LaunchSpec(
            self.backend,
            world_size,
            self.threads_per_rank,
            init_timeout_s=self.init_timeout_s,
            collective_timeout_s=self.timeout_s + self.init_timeout_s,
            device=self.device,
            probe_links=self.probe_links,
        )

    def base_fields(self, world_size: int) -> dict[str, Any]:
        """The launch columns every distributed record carries."""
        return dict(
            backend=self.backend,
            device=self.first_device.type,
            world_size=world_size,
            launcher="spawn" if not self.torchrun else "slurm" if os.environ.get(EXECUTOR_ENV) else "torchrun",
            threads_per_rank=self.threads_per_rank,
        )

    def run(self, worker: Worker, units: Sequence[Any], world_size: int) -> Iterator[tuple[Any, GroupResult]]:
        spec = self.spec(world_size)
        if self.torchrun:
            return run_under_torchrun(worker, units, spec)
        return run_spawned(worker, units, spec, unit_timeout_s=self.timeout_s)


MAX_SPAWNED_WORLD_SIZE = 64  # past a full node of GPUs many times over; 1000 would start 1000 processes


def resolve_world_sizes(asked: list[int] | None, backend: str, device: str, torchrun: bool) -> list[int]:
    if torchrun:
        size = torchrun_world_size()
        if asked and asked != [size]:
            raise LaunchError(f"under torchrun the world size is torchrun's ({size}); drop --world-sizes {asked}")
        return [size]
    if asked:
        if max(asked) > MAX_SPAWNED_WORLD_SIZE:  # each rank is a process holding torch and a model
            raise LaunchError(
                f"--world-sizes {max(asked)}: at most {MAX_SPAWNED_WORLD_SIZE} ranks are started on "
                "one machine; launch more with torchrun across machines"
            )
        return list(asked)
    if parse_rank_device(device, backend)[0] == "cuda" and torch.cuda.is_available():
        return [torch.cuda.device_count()]
    return [2]


def launch_from_args(args: argparse.Namespace, *, unique_sorted: bool = False) -> Launch:
    """The Launch of the shared flags; LaunchError (a user error) when this machine cannot run it."""
    timeouts = (args.timeout, args.init_timeout, args.probe_links)
    if args.executor == "slurm":  # the ranks are one Slurm job's tasks: nothing of this machine's is asked
        job = multinode_job(args)
        return Launch(args.backend, args.device, (job.world_size,), args.threads_per_rank or 1, False, *timeouts, job)
    check_single_node(args)
    torchrun = under_torchrun()
    if torchrun:
        check_torchrun_environment()
    world_sizes = resolve_world_sizes(args.world_sizes, args.backend, args.device, torchrun)
    if unique_sorted:
        world_sizes = sorted(set(world_sizes))
    for world_size in world_sizes:
        check_launch(args.backend, torchrun_local_world_size() if torchrun else world_size, args.device)
    threads = args.threads_per_rank or (
        torchrun_threads_per_rank() if torchrun else default_threads_per_rank(max(world_sizes))
    )
    if torchrun:  # last: every other refusal comes before we wait for peers
        maybe_inject_failure(torchrun_rank(), joining=True)
        join_rendezvous(args.init_timeout, args.timeout + args.init_timeout)
    return Launch(args.backend, args.device, tuple(world_sizes), threads, torchrun, *timeouts)


def _unit_load(launch: Launch) -> LoadMeter:
    """A meter started now, over the next unit's run in the spawned ranks (they are children of this
    process, so their work is not counted as another's). Under torchrun the other ranks are not ours:
    no load is recorded there."""
    device = launch.first_device
    gpu = (device.index or 0) if device.type == "cuda" else None
    return LoadMeter(threads=None, gpu_index=gpu).__enter__()


def run_rows(
    launch: Launch,
    worker: Worker,
    units_for: Callable[[int, bool], Sequence[Any]],
    record_for: Callable[[Any, GroupResult, dict, Environment | None], Any],
    write: Callable[[Any], None],
    describe: Callable[[Any, Any], str],
    record_type: type,
) -> list:
    """Every world size in turn: its units (`units_for(world_size, first)`) run on a fresh group,
    each unit's GroupResult becomes a record, written and announced on stderr as it comes. A rank
    of torchrun other than 0 returns no records; --executor slurm runs them all as one job."""
    if launch.job:
        units, base = units_for(launch.job.world_size, True), launch.base_fields(launch.job.world_size)
        return run_job(launch.job, units, record_type, record_for, base, write, describe)
    fallback = None if launch.torchrun else collect_environment(launch.first_device)
    records = []
    with hung_imports_shared():  # a user import that hung in one unit's ranks is not waited for again
        for index, world_size in enumerate(launch.world_sizes):
            units = units_for(world_size, index == 0)
            meter = _unit_load(launch)  # from one unit's row to the next: the ranks are this process's own
            for unit, result in launch.run(worker, units, world_size):
                meter.__exit__(None, None, None)
                record = record_for(unit, result, {**launch.base_fields(world_size), **result.columns}, fallback)
                if not launch.torchrun:
                    record.environment = with_load(record.environment, meter.load)
                meter = _unit_load(launch)
                write(record)
                records.append(record)
                print(describe(unit, record), file=sys.stderr, flush=True)
    return records
