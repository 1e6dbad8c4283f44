"""Where a tool's units of work run: here one after another (inline), as processes on this machine
(local: --workers at once, one GPU each), or as Slurm jobs through submitit (slurm: one job array per
submission). The sweeps hand it one job per configuration (sweep_jobs.py); the handout hands it its steps
the same way (handout/jobs.py).

A job is a command that writes its results into its own attempt directory; the executor runs it, keeps
its log and two markers beside them, and says how each attempt ended. Merging results into the outputs
is the caller's, and only the submitting process does it, under the lock of its outputs:

    settings = settings_from_args(args, cuda_count)       # --executor, --workers/--gpus, --slurm-*, --no-wait
    job_dir = JobDir(settings.job_dir or default_dir)      # on a filesystem the nodes share
    runner = open_runner(settings, job_dir)                # LocalRunner or SlurmRunner
    jobs = [Job(name="9f2c...", label="small T=128",       # name: the same work, the same name, every run
                command=("python", "-m", "cs336_bench.benchmark", "--config", "{...}",
                         "--output", "{attempt_dir}/rows.jsonl"),
                payload={"config": {...}})]                # JSON handed back with the outcome, in any later run
    print(runner.dry_run(jobs))                            # --dry-run: the sbatch script / the commands

    with the outputs locked:                               # (ResultSink): merge what ended, then submit
        for outcome in runner.poll().outcomes:             # every unsettled attempt that has ended
            ...write its rows (outcome.attempt.directory), or a row for outcome.kind
            job_dir.record_settled(outcome, status)        #   (timeout, cancelled, preempted, error)
        runner.submit([jobs not done and not in flight])   # poll().queued / .running: in flight
    collect(runner.poll, merge, names, wait=..., ...)      # the same, until none of `names` is queued or running
    runner.close()                                         # local: stop the workers; slurm: nothing (jobs live on)

An Outcome's kind: jobs.OUTCOMES; how the handout settles its steps: handout/jobs.py.

Modules: settings (flags), jobs (Job, Attempt, Outcome, JobDir: the ledger and attempt directories),
step (what runs around a command, in a job or a worker), evidence (how an attempt ended, from its
evidence), runner (Poll, collect), local, slurm. torch-free.
"""

from __future__ import annotations

from .jobs import ATTEMPT_DIR, OUTCOMES, Attempt, Job, JobDir, Outcome
from .runner import Poll, collect, placement_of
from .settings import EXECUTORS, ExecutorSettings, add_executor_arguments, settings_from_args


def open_runner(settings: ExecutorSettings, job_dir: JobDir, job_name: str = "cs336-bench"):
    """The runner of `settings.kind` (local or slurm) over `job_dir`."""
    if settings.kind == "local":
        from .local import LocalRunner

        return LocalRunner(settings, job_dir)
    if settings.kind == "slurm":
        from .slurm import SlurmRunner

        return SlurmRunner(settings, job_dir, job_name)
    raise ValueError(f"no runner for the {settings.kind} executor: inline runs in the caller's own loop")


__all__ = [
    "ATTEMPT_DIR",
    "EXECUTORS",
    "OUTCOMES",
    "Attempt",
    "ExecutorSettings",
    "Job",
    "JobDir",
    "Outcome",
    "Poll",
    "add_executor_arguments",
    "collect",
    "open_runner",
    "placement_of",
    "settings_from_args",
]
