"""A job, its attempts, how an attempt ended, and the job directory that remembers them. torch-free.

The job directory (on a filesystem every node sees):

    ledger.jsonl            one line per attempt submitted and per attempt settled (its outcome merged)
    jobs/NAME/N/            attempt N of job NAME: what its command wrote ({attempt_dir}), step.log (the
                            command's stdout and stderr), started.json and exit.json (step.py's markers)
    slurm/                  submitit's files: ARRAYJOB_TASK_0_log.out / .err (Slurm's own lines too), pickles

The ledger is appended by the submitting process only, under the lock of the caller's outputs, so two
submitting processes never settle one attempt twice. An attempt directory that is in no ledger line but
holds an exit marker (a job submitted by hand from the --dry-run script) is an attempt too; this process's own
are remembered too (a directory removed mid-run). It, its ledger, jobs/ and slurm/ are refused when a link,
another user's or writable by every user: the ledger's payloads become rows, and the jobs load submitit's pickles.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import socket
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from .. import jsontext
from ..errors import UsageError

ATTEMPT_DIR = "{attempt_dir}"  # in a Job's command: replaced by the attempt's own directory
LEDGER, JOBS, SLURM = "ledger.jsonl", "jobs", "slurm"
STARTED, EXITED, STEP_LOG = "started.json", "exit.json", "step.log"
# How an attempt ended, as an Outcome's `kind`: the command ran to its end (any exit status); a limit
# ended it (the job's --timeout, or Slurm's time limit: evidence.SLURM_TIME_LIMIT); Slurm cancelled or
# preempted it (or it is lost: gone before it started without a trace, its files removed; it runs again);
# it ended without a trace of why (error); its submitting process was stopped first (abandoned: no row).
OUTCOMES = ("exited", "timeout", "cancelled", "preempted", "error", "abandoned")


def utc_timestamp() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Job:
    """One unit of work: a command that writes its results into its attempt's directory.

    `name` is the job's identity across runs (a configuration's key, hashed): the same work has the same
    name, so a finished job is never run again. `payload` is JSON kept in the ledger for the caller (the
    configuration), handed back with each outcome, even to a later process."""

    name: str
    command: tuple[str, ...]
    label: str = ""
    timeout_s: float | None = None  # wall clock, enforced around the command (outcome 'timeout')
    payload: dict = field(default_factory=dict, compare=False)

    def command_in(self, directory: Path) -> list[str]:
        return [part.replace(ATTEMPT_DIR, str(directory)) for part in self.command]


@dataclass(frozen=True)
class Attempt:
    """One run of a job: its directory, and where it was sent (a Slurm job id, or the local submitter's pid)."""

    name: str
    number: str  # "1", "2", ...; "hand-JOBID" for a job submitted by hand
    directory: Path
    executor: str
    label: str = ""
    payload: dict = field(default_factory=dict, compare=False)
    job_id: str | None = None  # Slurm: ARRAYJOB_TASK
    submitter: tuple | None = None  # local: (host, pid, its start time) of the process running it

    @property
    def key(self) -> tuple[str, str]:
        return self.name, self.number

    def marker(self, name: str) -> dict | None:
        """started.json or exit.json, once whole (written by rename), else None."""
        try:
            value = jsontext.loads((self.directory / name).read_text())
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def log_tail(self, lines: int = 1) -> str:
        """The last non-empty lines of what the command printed (step.log), joined by ' | '."""
        try:
            with open(self.directory / STEP_LOG, "rb") as handle:
                handle.seek(max(0, os.fstat(handle.fileno()).st_size - 16384))
                text = handle.read().decode(errors="replace")
        except OSError:
            return ""
        kept = [line.strip() for line in text.splitlines() if line.strip()]
        return " | ".join(kept[-lines:])


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended (`kind`, one of OUTCOMES), why, and where it ran (placement columns)."""

    attempt: Attempt
    kind: str
    exit_code: int | None = None
    error: str | None = None
    placement: dict = field(default_factory=dict)


class JobDir:
    def __init__(self, path: Path):
        # absolute: a job's --slurm-setup may `cd` before its command writes into its attempt directory
        self.path = Path(path).absolute()
        if any(ord(c) < 32 or ord(c) == 127 for c in str(self.path)):
            raise UsageError(f"job directory {str(self.path)!r}: a control character in a path; give one without")
        self.check()
        self.known: dict[tuple[str, str], Attempt] = {}  # submitted by this process
        self.settled_here: set[tuple[str, str]] = set()

    def check(self, make: bool = False) -> None:
        """The directory (`make`: made first, as another user may have since) and its parts are this user's alone."""
        for part in (self.path, self.path / JOBS) if make else ():
            part.mkdir(mode=0o755, parents=True, exist_ok=True)  # whatever the umask: no other user writes here
        for path in (self.path, self.ledger, self.path / JOBS, self.slurm_folder):
            _check_ours(path, stat.S_IFREG if path == self.ledger else stat.S_IFDIR)

    @property
    def ledger(self) -> Path:
        return self.path / LEDGER

    @property
    def slurm_folder(self) -> Path:
        return self.path / SLURM

    def exists(self) -> bool:
        return self.ledger.exists()

    def attempt_directory(self, name: str, number: str) -> Path:
        return self.path / JOBS / name / number

    def entries(self) -> list[dict]:
        """The ledger's lines, less one cut by a killed writer (its attempt is found again by its directory)."""
        try:
            lines = self.ledger.read_text().splitlines()
        except FileNotFoundError:
            return []
        found = []
        for line in lines:
            with contextlib.suppress(ValueError):
                found.append(jsontext.loads(line))
        return [entry for entry in found if isinstance(entry, dict) and isinstance(entry.get("job"), str)]

    def _append(self, entries: Iterable[dict]) -> None:
        self.check(make=True)
        text = "".join(json.dumps(entry, default=str) + "\n" for entry in entries)
        if text:  # never through a link planted at its name
            fd = os.open(self.ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            with open(fd, "a") as handle:
                handle.write(text)

    def attempts(self) -> tuple[list[Attempt], set[tuple[str, str]]]:
        """Every attempt (the ledger's, then directories with an exit marker that no ledger line names),
        and the keys of those settled."""
        found: dict[tuple[str, str], Attempt] = {}
        settled: set[tuple[str, str]] = set()
        for entry in self.entries():
            key = (entry["job"], str(entry.get("attempt")))
            if entry.get("event") == "settled":
                settled.add(key)
            elif entry.get("event") == "submitted":
                submitter = entry.get("submitter")
                submitter = tuple(submitter) if isinstance(submitter, list) and len(submitter) in (2, 3) else None
                label, payload = str(entry.get("label") or ""), entry.get("payload") or {}
                where = (self.attempt_directory(*key), str(entry.get("executor")))
                found[key] = Attempt(*key, *where, label, payload, entry.get("job_id"), submitter)
        for marker in sorted(self.path.glob(f"{JOBS}/*/*/{EXITED}")):
            key = (marker.parent.parent.name, marker.parent.name)
            if key not in found:
                found[key] = Attempt(name=key[0], number=key[1], directory=marker.parent, executor="slurm")
        return [*found.values(), *(a for k, a in self.known.items() if k not in found)], settled | self.settled_here

    def new_attempts(self, jobs: Sequence[Job], executor: str) -> list[Attempt]:
        """A fresh attempt (numbered after the job's last) of each job, its directory made empty."""
        attempts, settled = self.attempts()
        used: dict[str, int] = {}
        for name, number in {*(a.key for a in attempts), *settled}:  # a settled line outlives its directory
            if number.isdigit():
                used[name] = max(used.get(name, 0), int(number))
        fresh = []
        self.check(make=True)
        for job in jobs:
            number = used.get(job.name, 0) + 1
            while self.attempt_directory(job.name, str(number)).exists():  # made by a submission that failed
                number += 1
            directory = self.attempt_directory(job.name, str(number))
            directory.mkdir(parents=True)
            here = (socket.gethostname(), os.getpid(), psutil.Process().create_time())
            submitter = here if executor == "local" else None
            fresh.append(Attempt(job.name, str(number), directory, executor, job.label, job.payload, None, submitter))
        return fresh

    def record_submitted(self, attempts: Sequence[Attempt]) -> None:
        self.known.update((a.key, a) for a in attempts)
        fields = ("executor", "job_id", "submitter", "label", "payload")
        self._append(
            {"event": "submitted", "job": a.name, "attempt": a.number, **{f: getattr(a, f) for f in fields}}
            | {"time": utc_timestamp()}
            for a in attempts
        )

    def record_settled(self, outcome: Outcome, status: str | None) -> None:
        """The attempt's outcome was merged (`status`: the row's, or None when nothing was written)."""
        a = outcome.attempt
        self.settled_here.add(a.key)
        entry = {"event": "settled", "job": a.name, "attempt": a.number, "outcome": outcome.kind, "status": status}
        self._append([{**entry, "time": utc_timestamp()}])


def _check_ours(path: Path, kind: int) -> None:
    """`path` absent, or this user's own directory (stat.S_IFDIR) or file (S_IFREG) no other user can write."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    problems = {
        "is a symbolic link": stat.S_ISLNK(info.st_mode),
        "is not a directory" if kind == stat.S_IFDIR else "is not a file": stat.S_IFMT(info.st_mode) != kind,
        "belongs to another user": info.st_uid != os.getuid(),
        "is writable by every user (chmod o-w)": info.st_mode & stat.S_IWOTH,
    }
    for why in (why for why, found in problems.items() if found):
        raise UsageError(f"job directory {path}: {why}; not trusted with the jobs' files")
