"""What every runner answers, and the loop that waits on one: `Poll` (each unsettled attempt queued, running
or ended with an Outcome), the placement of an attempt from its own markers, and `collect`."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from .jobs import STARTED, Attempt, Outcome

POLL_FIRST_S, POLL_MAX_S = 0.5, 10.0  # waits grow while nothing changes, so a long queue is polled rarely


@dataclass
class Poll:
    outcomes: list[Outcome] = field(default_factory=list)
    queued: list[Attempt] = field(default_factory=list)
    running: list[Attempt] = field(default_factory=list)

    def live(self, names: Collection[str]) -> list[Attempt]:
        return [a for a in (*self.queued, *self.running) if a.name in names]


def placement_of(attempt: Attempt, node: str | None = None) -> dict:
    """The placement columns of an attempt, from its started marker when it started (where it ran), else
    from what submitted it (and `node`, the scheduler's or the log's), plus `hostname`."""
    started = attempt.marker(STARTED) or {}
    job_id = started.get("slurm_job_id") or attempt.job_id
    task = started.get("slurm_array_task_id")
    if task is None and job_id and "_" in job_id and job_id.rsplit("_", 1)[1].isdigit():
        task = int(job_id.rsplit("_", 1)[1])
    found = {
        "executor": started.get("executor") or attempt.executor,
        "slurm_job_id": job_id,
        "slurm_array_task_id": task,
        "gpu_id": started.get("gpu_id"),
    }
    return {**found, "hostname": started.get("hostname") or node}


def removed(attempt: Attempt) -> tuple[str, str] | None:
    """(outcome, error) of an attempt whose directory was removed while it ran (its files lost: it runs again)."""
    if not attempt.directory.is_dir():
        return "cancelled", f"its files were removed while it ran ({attempt.directory}); the same command runs it again"
    return None


def collect(
    poll: Callable[[], Poll],
    merge: Callable[[Sequence[Outcome]], None],
    names: Collection[str],
    *,
    wait: bool,
    stopped: Callable[[], bool],
    show: Callable[[Poll], None],
    sleep: Callable[[float], None] = time.sleep,
) -> Poll:
    """Poll, merge every outcome found (the caller settles each), show progress; again until no job named in
    `names` is queued or running (once, without `wait`), or `stopped()`. The last Poll."""
    delay = POLL_FIRST_S
    while True:
        current = poll()
        if current.outcomes:
            merge(current.outcomes)
        show(current)
        if not wait or not current.live(names) or stopped():
            return current
        sleep(delay)
        delay = POLL_FIRST_S if current.outcomes else min(delay * 1.5, POLL_MAX_S)
