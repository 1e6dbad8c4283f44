"""Spawned ranks: this process starts one process per rank on a free local port and collects each
rank's messages through a pipe; a rank that raises, dies or stops answering ends the unit."""

from __future__ import annotations

import contextlib
import datetime as dt
import multiprocessing.connection
import os
import signal
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch.multiprocessing as mp

from ..lifetime import die_with_parent, ignoring_interrupts
from ..results import Environment, collect_environment
from .group import (
    GroupResult,
    LaunchSpec,
    Worker,
    _describe_failure,
    bind_threads,
    find_free_port,
    init_group,
    leave_group,
    local_store,
    loopback_interface,
    maybe_inject_failure,
)
from .links import hosts_and_links, rank_columns

EXIT_GRACE_S = 10.0  # how long finished ranks get to leave the group before they are killed
FAILURE_GRACE_S = 2.0  # after one rank fails, how long the others get to say how they failed
# how the parent words a rank that died without sending its failure
SILENT_DEATH_SUFFIXES = ("without reporting", "(the Linux OOM killer sends this)")


def _rank_main(
    rank: int,
    spec: LaunchSpec,
    worker: Worker,
    units: Sequence[Any],
    conn: multiprocessing.connection.Connection,
    parent_pid: int,
) -> None:
    """Entry point of one spawned rank: bind, join the group, run every unit, report each.
    The rank dies with the parent, even a SIGKILLed one (no rank left waiting in a collective)."""
    die_with_parent(parent_pid)
    try:
        bind_threads(spec.threads_per_rank)
        store = local_store(int(os.environ["MASTER_PORT"]), spec.world_size, rank, spec.init_timeout_s)
        ctx = init_group(spec, rank, local_rank=rank, launcher="spawn", store=store)
        store.set_timeout(dt.timedelta(seconds=spec.collective_timeout_s))
        placed = hosts_and_links(ctx.device, spec.probe_links)
        conn.send(("ready", (collect_environment(ctx.device), *placed) if rank == 0 else None))
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
        self.placed: dict = {}  # GroupResult's columns and links, once the ranks are ready
        context = mp.get_context("spawn")
        port = find_free_port()
        variables = {
            "MASTER_ADDR": "127.0.0.1",
            # the ranks' own connections on this machine only, unless the user named an interface
            **(
                {"GLOO_SOCKET_IFNAME": lo}
                if (lo := loopback_interface()) and "GLOO_SOCKET_IFNAME" not in os.environ
                else {}
            ),
            "MASTER_PORT": str(port),
            "WORLD_SIZE": str(spec.world_size),
            # read when each rank imports torch, before torch.set_num_threads can run
            "OMP_NUM_THREADS": str(spec.threads_per_rank),
            "MKL_NUM_THREADS": str(spec.threads_per_rank),
        }
        self.processes: list[mp.Process] = []
        self.connections: list[multiprocessing.connection.Connection] = []
        # Ranks start with Ctrl-C ignored: it reaches the parent alone, which ends the group.
        with _environment(variables), ignoring_interrupts():
            for rank in range(spec.world_size):
                receive, send = context.Pipe(duplex=False)
                process = context.Process(
                    target=_rank_main,
                    args=(rank, spec, worker, list(units), send, os.getpid()),
                    daemon=True,
                    name=f"rank{rank}",
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
        return GroupResult("ok", messages=messages, environment=self.environment, **self.placed)

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
            self.environment, peers, links = result.messages[0]
            self.placed = dict(columns=rank_columns(peers, links), links=links)
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
