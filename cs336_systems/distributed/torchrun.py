"""Under torchrun: the ranks were started for us (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT are set); each runs the units itself and rank 0 gathers every rank's message."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ..argtypes import MAX_PORT
from ..placement import EXECUTOR_ENV
from ..results import collect_environment
from .group import (
    GroupResult,
    LaunchError,
    LaunchSpec,
    Worker,
    _describe_failure,
    init_group,
    leave_group,
    maybe_inject_failure,
)
from .links import hosts_and_links, name_peers, rank_columns

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


STALE_HINT = "left over from another launch? unset RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT"
SLURM_HINT = "a rank of the Slurm job did not start, or cannot reach the first node (its link, a firewall)"


def under_torchrun() -> bool:
    return all(name in os.environ for name in TORCHRUN_VARIABLES)


def _variable(name: str, low: int, high: int | None = None, what: str = "", hint: str = STALE_HINT) -> int:
    text = os.environ[name]
    try:
        value = int(text)
    except ValueError:
        raise LaunchError(f"environment variable {name}={text!r} is not an integer ({hint})") from None
    if value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f"{low} or more"
        raise LaunchError(f"environment variable {name}={text} must be {bound}{what} ({hint})")
    return value


def _threads_variable() -> int:
    return _variable("OMP_NUM_THREADS", 1, hint="threads per rank: unset it, or use --threads-per-rank")


def check_torchrun_environment() -> None:
    """torchrun's variables as one launch sets them: integers, each rank below its world size, a real
    port, OMP_NUM_THREADS a positive integer. LaunchError naming the variable otherwise."""
    world_size = _variable("WORLD_SIZE", 1)
    _variable("RANK", 0, world_size - 1, f" (below WORLD_SIZE={world_size})")
    local_world = _variable("LOCAL_WORLD_SIZE", 1, world_size) if "LOCAL_WORLD_SIZE" in os.environ else world_size
    _variable("LOCAL_RANK", 0, local_world - 1, f" (below LOCAL_WORLD_SIZE={local_world})")
    _variable("MASTER_PORT", 1, MAX_PORT)
    if not os.environ["MASTER_ADDR"].strip():
        raise LaunchError(f"environment variable MASTER_ADDR is empty ({STALE_HINT})")
    if "OMP_NUM_THREADS" in os.environ:
        _threads_variable()


@contextlib.contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


_store: list = []  # the rendezvous store joined by join_rendezvous, used by init_group once


def join_rendezvous(init_timeout_s: float, collective_timeout_s: float) -> None:
    """Meet the other ranks at MASTER_ADDR:MASTER_PORT within `init_timeout_s` (torch would wait as long
    as the collectives' timeout): no peer in time is a LaunchError, one line, before any work."""
    from torch.distributed import rendezvous

    address = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    try:
        with _native_stderr_silenced():  # c10d logs each retry and a C++ stack trace; our one line says it
            store, _, _ = next(rendezvous("env://", timeout=dt.timedelta(seconds=init_timeout_s)))
    except (RuntimeError, ValueError, OSError) as exc:  # DistStoreError, DistNetworkError: RuntimeErrors
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LaunchError(
            f"no rendezvous with the other {torchrun_world_size() - 1} rank(s) at {address} within --init-timeout "
            f"{init_timeout_s:g} s ({first}); {SLURM_HINT if os.environ.get(EXECUTOR_ENV) else STALE_HINT}"
        ) from None
    store.set_timeout(dt.timedelta(seconds=collective_timeout_s))
    _store[:] = [store]


def torchrun_world_size() -> int:
    return int(os.environ["WORLD_SIZE"])


def torchrun_local_world_size() -> int:
    """Ranks on this node (what must fit on its GPUs); the whole world may span nodes."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))


def torchrun_rank() -> int:
    return int(os.environ["RANK"])


def torchrun_threads_per_rank() -> int:
    """torchrun sets OMP_NUM_THREADS=1 for several ranks per node unless told otherwise."""
    return _threads_variable() if "OMP_NUM_THREADS" in os.environ else torch.get_num_threads()


def run_under_torchrun(worker: Worker, units: Sequence[Any], spec: LaunchSpec) -> Iterator[tuple[Any, GroupResult]]:
    """Run the units in this rank; rank 0 yields each unit's results, the other ranks nothing.

    A failure ends the run. On rank 0 (its own, or a collective failing because a peer is
    gone) it is yielded for the unit at hand; another rank raises it, and torchrun then stops
    the group, rank 0 included, possibly before rank 0 has written its row.
    """
    rank, local_rank = torchrun_rank(), int(os.environ["LOCAL_RANK"])
    torch.set_num_threads(spec.threads_per_rank)
    ctx = init_group(spec, rank, local_rank, launcher="torchrun", store=_store.pop() if _store else None)
    environment = collect_environment(ctx.device) if rank == 0 else None
    placed: dict = {}
    peers: list = []
    for unit in units:
        try:
            if not placed:  # in the first unit's try: a peer lost while probing fails it
                peers, links = hosts_and_links(ctx.device, spec.probe_links)
                placed = dict(columns=rank_columns(peers, links), links=links)
            maybe_inject_failure(rank)
            message = worker(ctx, unit)
            messages: list[Any] = [None] * ctx.world_size
            dist.all_gather_object(messages, message)
        except Exception as exc:
            if rank != 0:
                raise  # torchrun sees this rank fail and stops the others
            status, error = _describe_failure(exc)
            error = f"rank 0: {name_peers(error, peers, spec.collective_timeout_s)}"
            yield unit, GroupResult(status, error=error, environment=environment, **placed)
            return
        if rank == 0:
            yield unit, GroupResult("ok", messages=messages, environment=environment, **placed)
    leave_group(ctx)
