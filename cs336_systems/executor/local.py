"""--executor local: each job a process on this machine, --workers at once, each worker on its own GPU
(CUDA_VISIBLE_DEVICES) or, on a CPU, its share of the cores (OMP_NUM_THREADS).

A worker is `python -m cs336_systems.executor.step` around the job's command, in a session of its own
that dies with this process (lifetime.child_preexec): stopping the submitting process stops its jobs,
and the next run finds them abandoned (nothing to merge) and runs them again.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence

from ..lifetime import child_preexec, pid_running
from ..placement import EXECUTOR_ENV
from ..tools import module_name
from ..units import counted
from .evidence import exit_outcome
from .jobs import EXITED, STEP_LOG, Attempt, Job, JobDir, Outcome
from .runner import Poll, placement_of, removed
from .settings import ExecutorSettings

STOP_GRACE_S = 15.0  # a stopped worker's command may finish writing its row


class LocalRunner:
    kind = "local"

    def __init__(self, settings: ExecutorSettings, job_dir: JobDir):
        self.settings, self.job_dir = settings, job_dir
        self.free: list[str | None] = list(settings.gpus) or [None] * settings.workers
        self.waiting: list[tuple[Attempt, Job]] = []
        self.running: dict[tuple[str, str], tuple[subprocess.Popen, str | None]] = {}
        self.exit_codes: dict[tuple[str, str], int] = {}

    def describe(self) -> str:
        s = self.settings
        workers = f"local: {counted(s.workers, 'worker')} at once"
        if s.gpus:
            return f"{workers}, one GPU each (CUDA_VISIBLE_DEVICES {', '.join(s.gpus)})"
        return f"{workers}, {counted(s.threads_per_worker, 'CPU thread')} each (OMP_NUM_THREADS)"

    def environment(self, gpu: str | None) -> dict[str, str]:
        env = {EXECUTOR_ENV: "local", "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
        if self.settings.threads_per_worker:
            env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(self.settings.threads_per_worker)
        return env

    def worker_command(self, attempt_dir, job: Job) -> list[str]:
        timeout = ["--timeout", f"{job.timeout_s:g}"] if job.timeout_s else []
        step = [sys.executable, "-m", module_name("executor.step"), str(attempt_dir), *timeout, "--"]
        return [*step, *job.command_in(attempt_dir)]

    def dry_run(self, jobs: Sequence[Job]) -> str:
        lines = [f"# {self.describe()}; each line one job, its files in {self.job_dir.path}/jobs/NAME/N/"]
        for index, job in enumerate(jobs):
            gpu = self.free[index % len(self.free)]
            variables = {k: v for k, v in self.environment(gpu).items() if k != "PYTHONPATH"}
            directory = self.job_dir.attempt_directory(job.name, "N")
            words = [f"{k}={v}" for k, v in variables.items()] + self.worker_command(directory, job)
            lines.append(shlex.join(words))
        return "\n".join(lines) + "\n"

    def submit(self, jobs: Sequence[Job]) -> list[Attempt]:
        attempts = self.job_dir.new_attempts(jobs, self.kind)
        self.job_dir.record_submitted(attempts)
        self.waiting.extend(zip(attempts, jobs, strict=True))
        self._start()
        return attempts

    def _start(self) -> None:
        while self.waiting and self.free:
            (attempt, job), gpu = self.waiting.pop(0), self.free.pop(0)
            attempt.directory.mkdir(parents=True, exist_ok=True)  # made again if the job directory was removed
            with open(attempt.directory / STEP_LOG, "ab") as log:  # the worker's own errors, if any
                process = subprocess.Popen(
                    self.worker_command(attempt.directory, job),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env={**os.environ, **self.environment(gpu)},
                    start_new_session=True,
                    preexec_fn=child_preexec(),
                )
            self.running[attempt.key] = (process, gpu)

    def _reap(self) -> None:
        for key, (process, gpu) in list(self.running.items()):
            if process.poll() is not None:
                self.exit_codes[key] = process.returncode
                self.free.append(gpu)
                del self.running[key]

    def poll(self) -> Poll:
        self._reap()
        self._start()
        attempts, settled = self.job_dir.attempts()
        waiting = {attempt.key for attempt, _ in self.waiting}
        poll = Poll()
        for attempt in attempts:
            if attempt.key in settled:
                continue
            marker = attempt.marker(EXITED)
            if attempt.key in waiting:
                poll.queued.append(attempt)
            elif attempt.key in self.running:
                poll.running.append(attempt)
            elif marker is not None:
                kind, error = exit_outcome(marker)
                poll.outcomes.append(Outcome(attempt, kind, marker.get("returncode"), error, placement_of(attempt)))
            elif attempt.key in self.exit_codes:  # the worker ended before writing its exit marker
                code = self.exit_codes[attempt.key]
                error = f"the local worker ended with status {code} before its step ended: {attempt.log_tail()}"
                kind, error = removed(attempt) or ("error", error)
                poll.outcomes.append(Outcome(attempt, kind, code, error, placement_of(attempt)))
            elif attempt.executor == "local" and _alive_elsewhere(attempt):
                poll.running.append(attempt)  # another submitting process's worker
            elif attempt.executor == "local":
                poll.outcomes.append(Outcome(attempt, "abandoned", placement=placement_of(attempt)))
        return poll

    def stop(self, attempts: Sequence[Attempt]) -> None:
        """Stop these attempts: a queued one never starts, a running worker gets SIGTERM (its command may
        finish its row), then SIGKILL after STOP_GRACE_S. Their next poll finds them ended."""
        self._stop({attempt.key for attempt in attempts})

    def close(self) -> None:
        """Stop every worker still running or queued (as stop does)."""
        self._stop({attempt.key for attempt, _ in self.waiting} | set(self.running))

    def _stop(self, keys: set[tuple[str, str]]) -> None:
        self.waiting = [(attempt, job) for attempt, job in self.waiting if attempt.key not in keys]
        stopping = [process for key, (process, _) in self.running.items() if key in keys]
        for process in stopping:
            _signal_group(process, signal.SIGTERM)
        for process in stopping:
            try:
                process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                process.wait()
        self._reap()


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


def _alive_elsewhere(attempt: Attempt) -> bool:
    """Whether the process that submitted this local attempt still runs (then its worker may too)."""
    if attempt.submitter is None:
        return False
    host, pid, started = (*attempt.submitter, None)[:3]
    if host != socket.gethostname():
        return True  # not ours to judge; its own process settles it
    return pid != os.getpid() and pid_running(pid, started)  # its pid given to a later process: gone
