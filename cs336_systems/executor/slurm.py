"""--executor slurm: each job a Slurm job, one submission one job array (submitit), each array task running
step.StepFunction around its job's command on the node it was given.

While a job lives, `squeue` says whether it is queued or running; one it does not list (a site's wrapper,
another view) is asked of `scontrol` before it counts as ended, and one that pends for a reason it never
outgrows (evidence.NEVER_STARTS: more CPUs than a node has...) is cancelled, its row saying why. Once it has
left the queue, its outcome comes from, in turn: the step's exit marker when the command ended with status 0;
the scheduler's final state (`scontrol show job`, kept MinJobAge seconds, then `sacct` where accounting is
on: TIMEOUT, CANCELLED, PREEMPTED); Slurm's own line in the job's log (evidence.from_log); the exit marker.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence

from ..errors import UsageError
from ..placement import EXECUTOR_ENV
from ..tools import module_name
from .evidence import ended_outcome, exit_outcome, from_log, normalise_state, parse_scontrol, queue_state
from .jobs import ATTEMPT_DIR, EXITED, STARTED, Attempt, Job, JobDir, Outcome
from .runner import Poll, placement_of, removed
from .settings import ExecutorSettings
from .step import StepFunction

JOB_NAME = "cs336-bench"
COMMAND_TIMEOUT_S = 60.0  # squeue / scontrol / sacct on a busy controller
LOG_BYTES = 65536  # the end of a job's log, where Slurm's own lines are


class SlurmError(UsageError):
    """Slurm or submitit missing, or sbatch refusing the jobs (a partition that does not exist...)."""


def submitit_module():
    try:
        import submitit
    except ImportError:
        raise SlurmError(
            '--executor slurm needs submitit: pip install "cs336-bench[slurm]" (or pip install submitit)'
        ) from None
    return submitit


class SlurmRunner:
    kind = "slurm"

    def __init__(self, settings: ExecutorSettings, job_dir: JobDir, job_name: str = JOB_NAME):
        self.request, self.job_dir, self.job_name = settings.slurm, job_dir, job_name
        self.squeue_failed = False

    def check(self) -> None:
        """Before any submission: submitit importable, Slurm's commands on PATH."""
        submitit_module()
        for command in ("sbatch", "squeue", "scontrol"):
            if shutil.which(command) is None:
                raise SlurmError(
                    f"--executor slurm needs Slurm's {command} on PATH (run this on the cluster's login node)"
                )

    def describe(self) -> str:
        r = self.request
        asked = [
            f"partition {r.partition}" if r.partition else "the default partition",
            f"{r.time_min} min",
            f"{r.gpus_per_job} GPU(s)" + (f" on each of {r.nodes} nodes" if r.nodes > 1 else ""),
            *([f"{r.cpus_per_task} CPU(s)"] if r.cpus_per_task else []),
            *([f"mem {r.mem}"] if r.mem else []),
            *([f"node {r.nodelist}"] if r.nodelist else []),
        ]
        return f"slurm: each job asks for {', '.join(asked)}; logs in {self.job_dir.slurm_folder}"

    def parameters(self) -> dict:
        """submitit's SlurmExecutor parameters (sbatch's names); --mem goes as text, past submitit's GB float."""
        r = self.request
        params: dict = {"job_name": self.job_name, "time": r.time_min}
        optional = {
            "partition": r.partition,
            "gpus_per_node": r.gpus_per_job or None,
            "cpus_per_task": r.cpus_per_task,
            "account": r.account,
            "qos": r.qos,
            "constraint": r.constraint,
            "array_parallelism": r.array_parallelism,
            "nodelist": r.nodelist,
            "nodes": r.nodes if r.nodes > 1 else None,
            "ntasks_per_node": r.tasks_per_node if r.tasks_per_node > 1 else None,
        }
        params.update({k: v for k, v in optional.items() if v is not None})
        if r.setup:
            params["setup"] = list(r.setup)
        # Slurm's warning before the time limit goes to every process of the job: SIGURG, which nothing
        # handles and whose default is to ignore it (submitit's USR2 would end the job early: no TIMEOUT)
        params["additional_parameters"] = {"signal": "URG", **({"mem": r.mem} if r.mem else {})}
        return params

    def environment(self) -> dict[str, str]:
        # what this process can import (a user's --model-factory module), the job's command can too
        return {EXECUTOR_ENV: "slurm", "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}

    # -- the script for those who submit by hand ---------------------------------------------------

    def dry_run(self, jobs: Sequence[Job]) -> str:
        """The sbatch script of `jobs` as one array: the #SBATCH lines submitit would write, then each task
        running its job under step.py into JOBDIR/jobs/NAME/hand-JOBID/, where the same command collects it."""
        from submitit.slurm.slurm import _make_sbatch_string

        submitit_module()
        step = [sys.executable, "-m", module_name("executor.step")]
        lines = [
            f"export {EXECUTOR_ENV}=slurm",
            "job=${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}",
            "job=${job:-$SLURM_JOB_ID}",
            'case "${SLURM_ARRAY_TASK_ID:-0}" in',
        ]
        for index, job in enumerate(jobs):
            directory = shlex.quote(str(self.job_dir.attempt_directory(job.name, "hand-"))) + '"$job"'
            timeout = ["--timeout", f"{job.timeout_s:g}"] if job.timeout_s else []
            command = [*map(shlex.quote, step), '"$dir"', *map(shlex.quote, timeout), "--"]
            command += [_shell_word(part) for part in job.command]
            label = " ".join((job.label or job.name).split())  # a comment ends at a newline: none in it
            lines += [f"{index})  # {label}", f"  dir={directory}", f"  {' '.join(command)} ;;"]
        lines.append("esac")
        params = self.parameters()
        text = _make_sbatch_string(
            command="\n".join(lines),
            folder=str(self.job_dir.slurm_folder),
            map_count=len(jobs) if len(jobs) > 1 else None,
            use_srun=False,
            **params,
        )
        head = (
            f"# {len(jobs)} job(s) of {self.job_dir.path}. Submit: mkdir -p {shlex.quote(str(self.job_dir.slurm_folder))}"
            " && sbatch THIS_FILE\n# (Slurm writes the logs there and does not make the folder). Once they ran, the "
            "same command without --dry-run merges their rows into the outputs.\n"
        )
        return text.replace("\n", "\n" + head, 1)

    # -- submitting and watching -----------------------------------------------------------------------

    def submit(self, jobs: Sequence[Job]) -> list[Attempt]:
        submitit = submitit_module()
        from submitit.core.utils import FailedJobError, FailedSubmissionError

        attempts = self.job_dir.new_attempts(jobs, self.kind)
        self.job_dir.slurm_folder.mkdir(mode=0o755, parents=True, exist_ok=True)
        env = self.environment()
        functions = [
            StepFunction(str(a.directory), tuple(job.command_in(a.directory)), job.timeout_s, env)
            for a, job in zip(attempts, jobs, strict=True)
        ]
        said = io.StringIO()  # submitit prints sbatch's stderr when it fails: one line of ours instead
        try:
            with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
                executor = submitit.SlurmExecutor(folder=str(self.job_dir.slurm_folder), max_num_timeout=0)
                executor.update_parameters(**self.parameters())
                with executor.batch():
                    handles = [executor.submit(function) for function in functions]
        except (FailedJobError, FailedSubmissionError, OSError, RuntimeError, ValueError) as exc:
            lines = [line.strip() for line in f"{said.getvalue()}\n{exc}".splitlines() if line.strip()]
            errors = [line for line in lines if "error" in line.lower()] or lines or [type(exc).__name__]
            raise SlurmError(f"sbatch refused the jobs: {errors[0]}") from None
        submitted = [dataclasses.replace(a, job_id=str(h.job_id)) for a, h in zip(attempts, handles, strict=True)]
        self.job_dir.record_submitted(submitted)
        return submitted

    def poll(self) -> Poll:
        attempts, settled = self.job_dir.attempts()
        mine = [a for a in attempts if a.key not in settled and a.executor == "slurm"]
        poll = Poll()
        if not mine:
            return poll
        live = self._queue()
        for attempt in mine:
            marker = attempt.marker(EXITED)
            if marker is not None and marker.get("returncode") == 0 and not marker.get("timed_out"):
                poll.outcomes.append(Outcome(attempt, "exited", 0, None, placement_of(attempt)))
                continue
            job_id = attempt.job_id or _hand_job_id(attempt)
            state, reason, node = (live or {}).get(job_id, ("RUNNING" if live is None else None, None, None))
            if state is None and attempt.job_id is not None:  # not in squeue's answer: ended, unless scontrol knows
                state, node = self._final_state(attempt.job_id)
            where = queue_state(state, reason)
            if where == "never":
                self.stop([attempt])
                why = f"Slurm can never start the job as asked ({reason}: more than the partition or its limits allow)"
                why += "; cancelled: change the --slurm-* request, then run the same command again"
                poll.outcomes.append(Outcome(attempt, "cancelled", None, why, placement_of(attempt)))
            elif where:
                (poll.queued if where == "queued" else poll.running).append(attempt)
            elif attempt.job_id is None:  # submitted by hand: its exit marker is all there is
                if marker is not None:
                    kind, error = exit_outcome(marker)
                    poll.outcomes.append(Outcome(attempt, kind, marker.get("returncode"), error, placement_of(attempt)))
            else:
                log = self._log(attempt.job_id)
                started = attempt.marker(STARTED) is not None
                kind, error = removed(attempt) or ended_outcome(state, log, marker, self.request.time_min, started)
                node = node or from_log(log)[1]
                code = marker.get("returncode") if marker else None
                poll.outcomes.append(Outcome(attempt, kind, code, error, placement_of(attempt, node)))
        return poll

    def stop(self, attempts: Sequence[Attempt]) -> None:
        """scancel these attempts' jobs (queued or running); their next poll finds them cancelled."""
        job_ids = [job_id for attempt in attempts if (job_id := attempt.job_id or _hand_job_id(attempt))]
        if job_ids and (done := self._run(["scancel", *job_ids])) is not None and done.returncode != 0:
            print(f"scancel failed: {(done.stderr.strip().splitlines() or ['no answer'])[-1]}", file=sys.stderr)

    def close(self) -> None:
        """Nothing to stop: the jobs live on in Slurm's queue; the same command collects them."""

    def _run(self, command: list[str]) -> subprocess.CompletedProcess | None:
        try:
            return subprocess.run(command, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError):
            return None

    def _queue(self) -> dict[str, tuple[str, str, None]] | None:
        """{job id (ARRAYJOB_TASK for array tasks): (state, why it pends, None)} of this user's jobs in the queue;
        None when squeue does not answer (then every job counts as still running, and the next poll asks again)."""
        user = pwd.getpwuid(os.getuid()).pw_name
        done = self._run(["squeue", "-h", "-r", "-u", user, "-o", "%i|%T|%r"])
        if done is None or done.returncode != 0:
            if not self.squeue_failed:
                why = (done.stderr.strip().splitlines() or ["no answer"])[-1] if done else "did not run"
                print(f"squeue failed ({why}); the jobs count as running until it answers", file=sys.stderr)
            self.squeue_failed = True
            return None
        self.squeue_failed = False
        states = {}
        for line in done.stdout.splitlines():
            job, _, rest = line.strip().partition("|")
            state, _, reason = rest.partition("|")
            if job:
                states[job] = (normalise_state(state), reason.strip(), None)
        return states

    def _final_state(self, job_id: str) -> tuple[str | None, str | None]:
        """(state, node) of a job that left the queue: scontrol while it remembers the job, else sacct. A
        scontrol that does not answer (a busy controller) leaves the job RUNNING until a later poll asks again."""
        shown = self._run(["scontrol", "show", "job", "-o", job_id])
        if shown is None or shown.returncode and not re.search("Invalid job id|not found", shown.stdout + shown.stderr):
            return "RUNNING", None
        if shown.returncode == 0 and "JobState=" in shown.stdout:
            fields = parse_scontrol(shown.stdout)
            node = fields.get("NodeList")
            return normalise_state(fields.get("JobState") or ""), node if node and node != "(null)" else None
        accounted = self._run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State,NodeList"])
        if accounted is not None and accounted.returncode == 0 and accounted.stdout.strip():
            state, _, node = accounted.stdout.strip().splitlines()[0].partition("|")
            return normalise_state(state), node if node and node != "None assigned" else None
        return None, None

    def _log(self, job_id: str) -> str:
        from submitit.core.utils import JobPaths

        paths = JobPaths(self.job_dir.slurm_folder, job_id=job_id, task_id=0)
        text = ""
        for path in (paths.stdout, paths.stderr):
            with contextlib.suppress(OSError), open(path, "rb") as handle:
                handle.seek(max(0, os.fstat(handle.fileno()).st_size - LOG_BYTES))
                text += handle.read().decode(errors="replace")
        return text


def _hand_job_id(attempt: Attempt) -> str | None:
    return attempt.number.removeprefix("hand-") if attempt.number.startswith("hand-") else None


def _shell_word(part: str) -> str:
    """One word of a job's command for the script: quoted, its attempt directory the shell's "$dir"."""
    pieces = part.split(ATTEMPT_DIR)
    return (
        '"$dir"'.join(shlex.quote(piece) if piece else "" for piece in pieces) if len(pieces) > 1 else shlex.quote(part)
    )
