"""Process groups on torch.distributed: launching ranks, binding them, collecting their results.

  group.py     what a rank knows (RankContext), launch checks, devices, threads, joining and leaving
  spawn.py     run_spawned: one process per rank started here, messages through pipes
  torchrun.py  run_under_torchrun: the ranks torchrun started
  ranks.py     per-step timings from every rank (slowest rank, barrier before each step)
  links.py     every rank's host, the ring's links probed, the ring all-reduce predicted from them
  slurm_job.py --executor slurm: the run as one Slurm job whose tasks are the ranks (several nodes)
  driver.py    the shared flags, world sizes, rank-0 sink and row loop of allreduce_bench and ddp_bench

A benchmark is a worker function `worker(ctx, unit) -> message` and a list of units (one
all-reduce size, one DDP configuration). Every rank runs every unit in order; the messages
of all ranks for a unit come back together as one `GroupResult`. Two ways in:

- `run_spawned`: this process starts one process per rank (torch.multiprocessing, spawn),
  on a free local port, and collects each rank's messages through a pipe. A rank that
  raises, dies or stops answering ends the unit with status error / oom / timeout; the
  group is then terminated (never left waiting in a collective) and, if units remain,
  started afresh for them.
- `run_under_torchrun`: the processes were started by torchrun (RANK, WORLD_SIZE,
  LOCAL_RANK, MASTER_ADDR and MASTER_PORT are set); each runs the units itself and rank 0
  receives every rank's message through `all_gather_object`. torchrun's own rule applies to
  failures: when one rank exits, it stops the others.

Backends: gloo on CPU tensors (or CUDA ones with `--device cuda`), NCCL on CUDA (one GPU per
rank, `cuda:LOCAL_RANK`).

On CPU each rank gets `threads_per_rank` threads (OMP_NUM_THREADS is set before the rank
imports torch, and torch.set_num_threads after); ranks x threads above the core count is
allowed but oversubscribed, and `oversubscription_note` says so. Ranks are not pinned to
cores: gloo's communication thread then shares the one core with the compute thread, and on
our 2-core machine a 4-byte all-reduce's p90 went from 0.14 ms (unpinned) to 3.9 ms (pinned).

Test-only: CS336_SYSTEMS_INJECT_FAILURE="RANK:MODE" makes that rank fail at the start of
every unit, MODE being `raise` (an exception), `exit` (dies without a word) or `hang`; `join`
(torchrun's variables) makes it hang before it joins the group.
"""

from __future__ import annotations

from .group import (
    BACKENDS,
    DEFAULT_INIT_TIMEOUT_S,
    INJECT_FAILURE_ENV,
    GroupResult,
    LaunchError,
    LaunchSpec,
    RankContext,
    Worker,
    all_reduce_mean,
    bind_threads,
    check_launch,
    default_threads_per_rank,
    device_for,
    find_free_port,
    init_group,
    leave_group,
    maybe_inject_failure,
    oversubscription_note,
    parse_rank_device,
    usable_cpus,
)
from .ranks import BarrierFirst, max_over_ranks, mean_over_ranks
from .spawn import EXIT_GRACE_S, FAILURE_GRACE_S, SpawnedGroup, run_spawned
from .torchrun import (
    TORCHRUN_VARIABLES,
    run_under_torchrun,
    torchrun_local_world_size,
    torchrun_rank,
    torchrun_threads_per_rank,
    torchrun_world_size,
    under_torchrun,
)

__all__ = [
    "BACKENDS",
    "DEFAULT_INIT_TIMEOUT_S",
    "EXIT_GRACE_S",
    "FAILURE_GRACE_S",
    "INJECT_FAILURE_ENV",
    "TORCHRUN_VARIABLES",
    "BarrierFirst",
    "GroupResult",
    "LaunchError",
    "LaunchSpec",
    "RankContext",
    "SpawnedGroup",
    "Worker",
    "all_reduce_mean",
    "bind_threads",
    "check_launch",
    "default_threads_per_rank",
    "device_for",
    "find_free_port",
    "init_group",
    "leave_group",
    "max_over_ranks",
    "maybe_inject_failure",
    "mean_over_ranks",
    "oversubscription_note",
    "parse_rank_device",
    "run_spawned",
    "run_under_torchrun",
    "torchrun_local_world_size",
    "torchrun_rank",
    "torchrun_threads_per_rank",
    "torchrun_world_size",
    "under_torchrun",
    "usable_cpus",
]
