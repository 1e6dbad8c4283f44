"""Process groups on torch.distributed: launching ranks, binding them, collecting their results.

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

Backends: gloo on CPU tensors, NCCL on CUDA (one GPU per rank, `cuda:LOCAL_RANK`).

On CPU each rank gets `threads_per_rank` threads (OMP_NUM_THREADS is set before the rank
imports torch, and torch.set_num_threads after); ranks x threads above the core count is
allowed but oversubscribed, and `oversubscription_note` says so. Ranks are not pinned to
cores: gloo's communication thread then shares the one core with the compute thread, and on
our 2-core machine a 4-byte all-reduce's p90 went from 0.14 ms (unpinned) to 3.9 ms (pinned).

Test-only: CS336_SYSTEMS_INJECT_FAILURE="RANK:MODE" makes that rank fail at the start of
every unit, MODE being `raise` (an exception), `exit` (dies without a word) or `hang`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import multiprocessing.connection
import os
import re
import signal
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from cs336_systems.device import first_line, is_out_of_memory
from cs336_systems.results import Environment, collect_environment

BACKENDS = ("gloo", "nccl")
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
INJECT_FAILURE_ENV = "CS336_SYSTEMS_INJECT_FAILURE"
DEFAULT_INIT_TIMEOUT_S = 120.0  # spawning N ranks that each import torch, then the rendezvous
EXIT_GRACE_S = 10.0  # how long finished ranks get to leave the group before they are killed
# how the parent words a rank that died without sending its failure
SILENT_DEATH_SUFFIXES = ("without reporting", "(the Linux OOM killer sends this)")
_SOURCE_LOCATION = re.compile(r"^\[[^\]]+\.(?:cc|cpp|h):\d+\] ")  # gloo's "[/path/pair.cc:537] " prefix
FAILURE_GRACE_S = 2.0  # after one rank fails, how long the others get to say how they failed


class LaunchError(ValueError):
    """A launch this machine cannot do (NCCL without CUDA, more ranks than GPUs)."""


@dataclass(frozen=True)
class RankContext:
    """What a worker knows about its place in the group."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device
    launcher: str  # "spawn" or "torchrun"

    def barrier(self) -> None:
        if self.backend == "nccl":
            dist.barrier(device_ids=[self.device.index])
        else:
            dist.barrier()


@dataclass(frozen=True)
class LaunchSpec:
    backend: str
    world_size: int
    threads_per_rank: int
    init_timeout_s: float = DEFAULT_INIT_TIMEOUT_S
    collective_timeout_s: float = 600.0  # torch.distributed's own timeout: a backstop behind ours


@dataclass
class GroupResult:
    """One unit's outcome: every rank's message (None from ranks that sat it out), or why not."""

    status: str  # ok, oom, error, timeout
    messages: list[Any] = field(default_factory=list)
    error: str | None = None
    environment: Environment | None = None  # rank 0's


Worker = Callable[[RankContext, Any], Any]


# -- devices, threads, ports --------------------------------------------------------------


def device_for(backend: str, local_rank: int) -> torch.device:
    return torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")


def check_launch(backend: str, world_size: int) -> None:
    """Raise LaunchError (a user error) for a launch this machine cannot run."""
    if backend not in BACKENDS:
        raise LaunchError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if world_size < 1:
        raise LaunchError(f"world size must be at least 1, got {world_size}")
    if backend == "gloo" and not dist.is_gloo_available():
        raise LaunchError("this torch build has no gloo backend")
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise LaunchError("--backend nccl needs CUDA GPUs; this machine has none (use --backend gloo on CPU)")
        if not dist.is_nccl_available():
            raise LaunchError("this torch build has no NCCL backend")
        if world_size > torch.cuda.device_count():
            raise LaunchError(
                f"--backend nccl runs one rank per GPU: world size {world_size} > "
                f"{torch.cuda.device_count()} CUDA device(s) here"
            )


def usable_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def default_threads_per_rank(world_size: int) -> int:
    """An equal share of this machine's cores, at least one thread."""
    return max(1, len(usable_cpus()) // world_size)


def oversubscription_note(backend: str, world_size: int, threads_per_rank: int) -> str | None:
    cores = len(usable_cpus())
    if backend == "nccl" or world_size * threads_per_rank <= cores:
        return None
    return (
        f"oversubscribed: {world_size} ranks x {threads_per_rank} thread(s) on {cores} cores "
        "(ranks share cores, so times include waiting for a core)"
    )


def find_free_port() -> int:
    """A TCP port nothing listens on now (the OS picks it; a race with another program is possible)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def bind_threads(threads_per_rank: int) -> None:
    """torch's intra-op threads for this rank (OMP_NUM_THREADS was set before torch was imported)."""
    torch.set_num_threads(threads_per_rank)


# -- torchrun ---------------------------------------------------------------------------


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


# -- process group ----------------------------------------------------------------------


def init_group(spec: LaunchSpec, rank: int, local_rank: int, launcher: str) -> RankContext:
    """init_process_group from MASTER_ADDR/MASTER_PORT in the environment (env://)."""
    device = device_for(spec.backend, local_rank)
    options: dict[str, Any] = {}
    if device.type == "cuda":
        torch.cuda.set_device(device)
        options["device_id"] = device  # eager NCCL init: the rendezvous happens (or fails) here
    dist.init_process_group(
        spec.backend,
        rank=rank,
        world_size=spec.world_size,
        timeout=dt.timedelta(seconds=spec.collective_timeout_s),
        **options,
    )
    return RankContext(rank, spec.world_size, local_rank, spec.backend, device, launcher)


def leave_group(ctx: RankContext) -> None:
    """Leave together: the barrier keeps a fast rank from tearing down a peer's connections."""
    ctx.barrier()
    dist.destroy_process_group()


def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    """In place: the sum over ranks, divided by the world size (what data parallelism averages)."""
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor.div_(dist.get_world_size())


def maybe_inject_failure(rank: int) -> None:
    """Test-only: fail this rank as CS336_SYSTEMS_INJECT_FAILURE says."""
    target, _, mode = os.environ.get(INJECT_FAILURE_ENV, "").partition(":")
    if not target or int(target) != rank:
        return
    if mode == "exit":
        os._exit(3)
    if mode == "hang":
        while True:
            time.sleep(60)
    raise RuntimeError(f"injected failure on rank {rank} ({INJECT_FAILURE_ENV})")


def _describe_failure(exc: BaseException) -> tuple[str, str]:
    status = "oom" if is_out_of_memory(exc) else "error"
    return status, f"{type(exc).__name__}: {_SOURCE_LOCATION.sub('', first_line(exc))}"


# -- spawned ranks ------------------------------------------------------------------------


def _rank_main(
    rank: int, spec: LaunchSpec, worker: Worker, units: Sequence[Any], conn: multiprocessing.connection.Connection
) -> None:
    """Entry point of one spawned rank: bind, join the group, run every unit, report each."""
    try:
        bind_threads(spec.threads_per_rank)
        ctx = init_group(spec, rank, local_rank=rank, launcher="spawn")
        conn.send(("ready", collect_environment(ctx.device) if rank == 0 else None))
        for unit in units:
            maybe_inject_failure(rank)
            conn.send(("ok", worker(ctx, unit)))
        leave_group(ctx)
    except BaseException as exc:  # every failure goes to the parent, which ends the group
        with contextlib.suppress(Exception):
            conn.send(("failed", (*_describe_failure(exc), time.time())))
        conn.close()
        # Leave at once: a clean exit would wait on peers that may be gone or stuck.
        os._exit(1)
    conn.close()


def _exit_description(process: mp.Process) -> str:
    code = process.exitcode
    if code is None:
        return "stopped answering"
    if code < 0:
        how = f"was killed by signal {signal.Signals(-code).name} without reporting"
        if code == -signal.SIGKILL:
            how += " (the Linux OOM killer sends this)"
        return how
    return f"exited with status {code} without reporting"


class SpawnedGroup:
    """`world_size` processes running `worker` over `units`, and the pipes their messages come through."""

    def __init__(self, spec: LaunchSpec, worker: Worker, units: Sequence[Any]):
        self.spec = spec
        self.environment: Environment | None = None
        context = mp.get_context("spawn")
        port = find_free_port()
        variables = {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "WORLD_SIZE": str(spec.world_size),
            # read when each rank imports torch, before torch.set_num_threads can run
            "OMP_NUM_THREADS": str(spec.threads_per_rank),
            "MKL_NUM_THREADS": str(spec.threads_per_rank),
        }
        self.processes: list[mp.Process] = []
        self.connections: list[multiprocessing.connection.Connection] = []
        with _environment(variables):
            for rank in range(spec.world_size):
                receive, send = context.Pipe(duplex=False)
                process = context.Process(
                    target=_rank_main, args=(rank, spec, worker, list(units), send), daemon=True, name=f"rank{rank}"
                )
                process.start()
                send.close()  # the child holds the only sending end: its death is an EOF here
                self.processes.append(process)
                self.connections.append(receive)

    def _next(self, kind: str, timeout_s: float, what: str) -> GroupResult:
        """The next message of every rank, expected to be of `kind`.

        After the first failure the other ranks get FAILURE_GRACE_S to report theirs (the peers
        of a failed rank usually fail too, in their collective); all are reported, earliest
        first, so the cause leads and its consequences follow.
        """
        messages: list[Any] = [None] * self.spec.world_size
        waiting = set(range(self.spec.world_size))
        failures: list[tuple[float, str, str]] = []  # (when, status, what happened)
        deadline = time.monotonic() + timeout_s
        while waiting:
            if failures:
                deadline = min(deadline, min(when for when, _, _ in failures) + FAILURE_GRACE_S)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            handles = [self.connections[r] for r in waiting] + [self.processes[r].sentinel for r in waiting]
            multiprocessing.connection.wait(handles, timeout=remaining)
            for rank in sorted(waiting):
                outcome = self._poll(rank, kind)
                if outcome is None:
                    continue
                waiting.discard(rank)
                delivered, value = outcome
                if delivered:
                    messages[rank] = value
                else:
                    failures.append(value)
        if failures:
            # A rank that died without a word is the likelier cause of its peers' errors.
            failures.sort(key=lambda f: (not f[2].endswith(SILENT_DEATH_SUFFIXES), f[0]))
            return GroupResult(failures[0][1], error="; ".join(text for _, _, text in failures))
        if waiting:
            ranks = ", ".join(str(r) for r in sorted(waiting))
            return GroupResult("timeout", error=f"no result from rank(s) {ranks} within {timeout_s:g} s ({what})")
        return GroupResult("ok", messages=messages, environment=self.environment)

    def _poll(self, rank: int, kind: str) -> tuple[bool, Any] | None:
        """(True, message) or (False, (when, status, failure)) from `rank`; None while it is busy."""
        connection, process = self.connections[rank], self.processes[rank]
        if connection.poll():
            try:
                got, payload = connection.recv()
            except (EOFError, OSError):
                process.join(1)
                return False, (time.monotonic(), "error", f"rank {rank} {_exit_description(process)}")
            if got == kind:
                return True, payload
            if got == "failed":
                status, text, wall_time = payload
                when = time.monotonic() - max(0.0, time.time() - wall_time)
                return False, (when, status, f"rank {rank}: {text}")
            return False, (time.monotonic(), "error", f"rank {rank} sent {got!r} where {kind!r} was expected")
        if not process.is_alive():
            return False, (time.monotonic(), "error", f"rank {rank} {_exit_description(process)}")
        return None

    def wait_ready(self) -> GroupResult:
        result = self._next("ready", self.spec.init_timeout_s, "starting the ranks and init_process_group")
        if result.status == "ok":
            self.environment = result.messages[0]
            result.environment = self.environment
        return result

    def gather(self, timeout_s: float) -> GroupResult:
        return self._next("ok", timeout_s, "--timeout")

    def close(self, grace_s: float = EXIT_GRACE_S) -> None:
        """Wait `grace_s` for the ranks to leave on their own, then terminate, then kill."""
        deadline = time.monotonic() + grace_s
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
        for process in self.processes:
            if process.is_alive():
                process.terminate()
        for process in self.processes:
            process.join(2)
            if process.is_alive():
                process.kill()
                process.join()
        for connection in self.connections:
            connection.close()


@contextlib.contextmanager
def _environment(variables: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the processes started inside; restore them after."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def run_spawned(
    worker: Worker, units: Sequence[Any], spec: LaunchSpec, unit_timeout_s: float
) -> Iterator[tuple[Any, GroupResult]]:
    """Each unit with its GroupResult, in order. A failed unit ends its group; the units after
    it run in a fresh one. A group that cannot start fails every unit it was given."""
    remaining = list(units)
    while remaining:
        group = SpawnedGroup(spec, worker, remaining)
        healthy = False  # only a group whose every unit succeeded is left to exit on its own
        try:
            ready = group.wait_ready()
            if ready.status != "ok":
                for unit in remaining:
                    yield unit, ready
                return
            while remaining:
                unit = remaining.pop(0)
                result = group.gather(unit_timeout_s)
                yield unit, result
                if result.status != "ok":
                    break
            else:
                healthy = True
        finally:
            group.close(grace_s=EXIT_GRACE_S if healthy else 0.0)


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


# -- per-iteration timings from every rank --------------------------------------------------


def max_over_ranks(per_rank: Sequence[Sequence[float]]) -> list[float]:
    """Iteration i of a collective ends when its slowest rank does: the max over ranks."""
    return [max(values) for values in zip(*per_rank, strict=True)]


def mean_over_ranks(per_rank: Sequence[Sequence[float]]) -> list[float]:
    return [math.fsum(values) / len(values) for values in zip(*per_rank, strict=True)]


class BarrierFirst:
    """A StepTimer that aligns the ranks (untimed) before each timed step, so a step's time is
    its own and not how late another rank arrived."""

    def __init__(self, timer, barrier: Callable[[], None]):
        self.timer, self.barrier = timer, barrier

    def time_ms(self, step) -> float:
        self.barrier()
        return self.timer.time_ms(step)
