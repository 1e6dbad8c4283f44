"""Under torchrun: the ranks were started for us (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT are set); each runs the units itself and rank 0 gathers every rank's message."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ..results import collect_environment
from .group import (
    GroupResult,
    LaunchSpec,
    Worker,
    _describe_failure,
    init_group,
    leave_group,
    maybe_inject_failure,
)

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def under_torchrun() -> bool:
    return all(name in os.environ for name in TORCHRUN_VARIABLES)


def torchrun_world_size() -> int:
    return int(os.environ["WORLD_SIZE"])


def torchrun_local_world_size() -> int:
    """Ranks on this node (what must fit on its GPUs); the whole world may span nodes."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))


def torchrun_rank() -> int:
    return int(os.environ["RANK"])


def torchrun_threads_per_rank() -> int:
    """torchrun sets OMP_NUM_THREADS=1 for several ranks per node unless told otherwise."""
    return int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads()))


def run_under_torchrun(worker: Worker, units: Sequence[Any], spec: LaunchSpec) -> Iterator[tuple[Any, GroupResult]]:
    """Run the units in this rank; rank 0 yields each unit's results, the other ranks nothing.

    A failure ends the run. On rank 0 (its own, or a collective failing because a peer is
    gone) it is yielded for the unit at hand; another rank raises it, and torchrun then stops
    the group, rank 0 included, possibly before rank 0 has written its row.
    """
    rank, local_rank = torchrun_rank(), int(os.environ["LOCAL_RANK"])
    torch.set_num_threads(spec.threads_per_rank)
    ctx = init_group(spec, rank, local_rank, launcher="torchrun")
    environment = collect_environment(ctx.device) if rank == 0 else None
    for unit in units:
        try:
            maybe_inject_failure(rank)
            message = worker(ctx, unit)
            messages: list[Any] = [None] * ctx.world_size
            dist.all_gather_object(messages, message)
        except Exception as exc:
            if rank != 0:
                raise  # torchrun sees this rank fail and stops the others
            status, error = _describe_failure(exc)
            yield unit, GroupResult(status, error=f"rank 0: {error}", environment=environment)
            return
        if rank == 0:
            yield unit, GroupResult("ok", messages=messages, environment=environment)
    leave_group(ctx)
