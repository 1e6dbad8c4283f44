"""The handout's steps as executor jobs (--executor local or slurm): each runnable step of the plan one Job,
running the step's own command with its outputs in the job's attempt directory:

    python -m cs336_systems.executor.step JOBDIR/jobs/STEP-HASH/N -- STEP'S COMMAND (outputs in that directory)

Only this process writes OUTPUT_DIR. An attempt that ends with its command's exit status 0 or 1 (its rows
written, failed ones included) has its output files moved into OUTPUT_DIR and the step's done marker written
(run.py's), as an inline run leaves them; whatever the end, its log becomes OUTPUT_DIR/logs/STEP.log and its
outcome a row of the plan file. A crash, a refusal, and a job cancelled, preempted or at Slurm's time limit
leave the step to run again, as a crashed inline step is. A job's name is the step's id and its exact command
(as its done marker records it), hashed: a changed plan is another job, and a done step is never submitted
again. A sweep that could `--resume` runs whole again in its job (its attempt directory starts empty).

Rounds: a step that reads an earlier step's output (plan.INPUT_FLAGS: the timeline that draws a memory
snapshot) is submitted once that output is in OUTPUT_DIR, in a later round of the same run (of the next
run, with --no-wait).

On Slurm the plan is for the nodes' device, not this machine's: a first job reports it (nodes.py).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import stat
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..executor import ATTEMPT_DIR, Job, JobDir, Outcome, Poll, collect
from ..executor.jobs import EXITED, STARTED, STEP_LOG
from ..progress import progress_bar
from ..results import open_to_write
from .outputs import MARKERS, claim, written
from .plan import Step
from .run import (
    BUDGET_STOPPED,
    DONE_STATUSES,
    PLAN_FILE,
    log_name,
    mark_done,
    outcome_of,
    plan_rows,
    read_marker,
    say_changed,
    write_plan,
)
from .target import Target

JOBS = f"{MARKERS}/executor"  # the default job directory, inside OUTPUT_DIR (a filesystem the nodes share)
# how an attempt that did not run its command to an exit status ended, in the plan's `outcome` column
NOT_EXITED = {
    "timeout": "timeout (Slurm's time limit)",
    "cancelled": "cancelled",
    "preempted": "preempted",
    "error": "crashed (the job ended without an exit status)",
    "abandoned": "interrupted",
}
IN_FLIGHT = ("queued", "running")


def job_name(step: Step, output_dir: Path) -> str:
    """The step's id and a hash of its id and exact command (as its done marker records it)."""
    digest = hashlib.sha1(json.dumps([step.id, step.shell(output_dir)]).encode()).hexdigest()[:12]
    return f"{step.id}-{digest}"


def step_job(step: Step, output_dir: Path) -> Job:
    """The step as a Job: its outputs in the attempt's directory, the earlier steps' it reads in OUTPUT_DIR;
    a tool that prints its result has its stdout kept in the attempt's copy of that file."""
    command = step.command(Path(ATTEMPT_DIR), inputs_dir=output_dir.absolute())  # the job's setup may `cd`
    if step.capture:
        command = ["sh", "-c", 'exec "$@" > "$0"', f"{ATTEMPT_DIR}/{step.capture}", *command]
    return Job(job_name(step, output_dir), tuple(command), label=step.id, payload={"step": step.id})


def job_dir_of(output_dir: Path, given: Path | None) -> JobDir:
    """--job-dir, else OUTPUT_DIR/.handout/executor (never through a link planted there: JobDir)."""
    return JobDir(output_dir / JOBS if given is None else given)


# -- settling an attempt ---------------------------------------------------------------------------------


def settle(outcome: Outcome, step: Step, output_dir: Path, stopped: bool = False) -> dict:
    """The step's outcome (the plan file's entry) from how its attempt ended; a done step's files moved into
    OUTPUT_DIR and its done marker written, its log into OUTPUT_DIR/logs/ whatever the end. A `stopped`
    attempt (at the end of --budget) is done only if its command had exited 0 before the stop."""
    attempt = outcome.attempt
    code = outcome.exit_code
    entry = {
        "command": step.shell(output_dir),
        "exit_status": code,
        "elapsed_s": _elapsed(attempt.directory),
        "outcome": outcome_of(code) if outcome.kind == "exited" else NOT_EXITED[outcome.kind],
        "executor": outcome.placement.get("executor") or attempt.executor,
        "hostname": outcome.placement.get("hostname"),
        "slurm_job_id": outcome.placement.get("slurm_job_id"),
    }
    done = outcome.kind == "exited" and code in DONE_STATUSES
    if stopped and not (done and code == 0):
        entry["outcome"], done = BUDGET_STOPPED, False
    ours = written(output_dir)
    theirs = [name for name in step.outputs() if os.path.lexists(output_dir / name) and name not in ours]
    if done and theirs:  # put there while the job ran: never replaced (outputs.py)
        entry["outcome"], done = f"refused: {theirs[0]} is in the output directory and handout did not write it", False
    claim(output_dir, [*step.outputs(), log_name(step), f"{MARKERS}/{step.id}.json"])
    _write_log(attempt.directory, output_dir / log_name(step), entry, outcome.error)
    if done:
        for name in step.outputs():
            _move(attempt.directory / name, output_dir / name)
        mark_done(output_dir, step, entry)
    return entry


def _elapsed(directory: Path) -> float | None:
    """Seconds from the step's start marker to its exit marker (both written on the node, by its clock)."""
    try:
        return round((directory / EXITED).stat().st_mtime - (directory / STARTED).stat().st_mtime, 1)
    except OSError:
        return None


def _write_log(directory: Path, path: Path, entry: dict, error: str | None) -> None:
    """OUTPUT_DIR/logs/STEP.log as an inline run writes it (the command, then what it printed), and where
    the job ran and how it ended."""
    where = " ".join(f"{k}={entry[k]}" for k in ("executor", "slurm_job_id", "hostname") if entry.get(k))
    with open_to_write(path) as log:
        log.write(f"$ {entry['command']}\n")
        with contextlib.suppress(OSError), open(directory / STEP_LOG, errors="replace") as printed:
            shutil.copyfileobj(printed, log)
        log.write(f"# {where}: {entry['outcome']}{f' ({error})' if error else ''}; job files in {directory}\n")


def _move(source: Path, target: Path) -> None:
    """The attempt's file into OUTPUT_DIR (a rename, never through a link at `target`); an output the attempt
    did not write leaves none behind (a stale one of an earlier run is removed, as run.prepare does)."""
    try:
        regular = stat.S_ISREG(source.lstat().st_mode)
    except FileNotFoundError:
        regular = False
    if not regular:
        target.unlink(missing_ok=True)
        return
    try:
        os.replace(source, target)
    except OSError as exc:
        if exc.errno != errno.EXDEV:  # --job-dir on another filesystem: copied beside, then renamed
            raise
        temporary = target.with_name(target.name + ".moving")
        temporary.unlink(missing_ok=True)
        shutil.copyfile(source, temporary)
        os.replace(temporary, target)
        source.unlink()


# -- the rounds ------------------------------------------------------------------------------------------


@dataclass
class JobsRun:
    """What a run of the plan's jobs left: each step's outcome, the steps still in flight (--no-wait) and
    those waiting for the output of one in flight."""

    outcomes: dict[str, dict]
    in_flight: list[Step] = field(default_factory=list)
    waiting: list[Step] = field(default_factory=list)
    wall_s: float = 0.0


class PlanJobs:
    """The plan's runnable steps as jobs, their outcomes, and the plan file that records them."""

    def __init__(self, steps: list[Step], target: Target, output_dir: Path, edition: str, scale: str, job_dir: JobDir):
        self.steps, self.target, self.output_dir, self.edition, self.scale = steps, target, output_dir, edition, scale
        self.job_dir = job_dir
        self.runnable = [s for s in steps if s.status == "run"]
        self.by_name = {job_name(s, output_dir): s for s in self.runnable}
        self.jobs = {s.id: step_job(s, output_dir) for s in self.runnable}
        self.producers = {name: s for s in self.runnable for name in s.outputs()}
        say_changed(self.runnable, output_dir)
        self.outcomes: dict[str, dict] = {s.id: m for s in self.runnable if (m := read_marker(output_dir, s))}
        self.done = set(self.outcomes)
        self.ended: set[str] = set()  # steps whose attempt this run settled, done or not
        self.stopping: set[str] = set()  # steps whose job this run stopped at the end of --budget

    def write_plan(self) -> None:
        claim(self.output_dir, [PLAN_FILE])
        rows = plan_rows(self.steps, self.target, self.output_dir, self.outcomes, self.edition, self.scale)
        write_plan(self.output_dir / PLAN_FILE, rows)

    def merge(self, outcomes: Sequence[Outcome]) -> None:
        """Settle every attempt that ended (once, whoever polled it), then rewrite the plan file."""
        _, settled = self.job_dir.attempts()
        for outcome in outcomes:
            if outcome.attempt.key in settled:
                continue
            step = self.by_name.get(outcome.attempt.name)
            if step is None or step.id in self.done:  # another plan's job (a flag changed since), or done meanwhile
                self.job_dir.record_settled(outcome, None)
                continue
            entry = settle(outcome, step, self.output_dir, stopped=step.id in self.stopping)
            self.outcomes[step.id] = entry
            self.ended.add(step.id)
            if read_marker(self.output_dir, step) is not None:
                self.done.add(step.id)
            self.job_dir.record_settled(outcome, entry["outcome"])
        self.write_plan()

    def waits_for(self, step: Step) -> list[str]:
        """The inputs of `step` not yet in OUTPUT_DIR from a done step (its memory snapshot, drawn later)."""
        missing = []
        for name in step.inputs():
            producer = self.producers.get(name)
            if (producer is not None and producer.id not in self.done) or not (self.output_dir / name).is_file():
                missing.append(name)
        return missing

    def in_flight(self, poll: Poll) -> dict[str, str]:
        """{step id: queued or running} of the plan's attempts in flight, their outcome in the plan file meanwhile."""
        states = {}
        for state, attempts in (("queued", poll.queued), ("running", poll.running)):
            for attempt in attempts:
                step = self.by_name.get(attempt.name)
                if step is not None and step.id not in self.done:
                    states[step.id] = state
                    job = {"executor": attempt.executor, "slurm_job_id": attempt.job_id}
                    self.outcomes[step.id] = {"outcome": state, **job}
        return states

    def counts(self) -> tuple[int, int]:
        """(done, failed): steps done, and those whose attempt this run ended not done."""
        return len(self.done), len(self.ended - self.done)


def run_jobs(plan: PlanJobs, runner, wait: bool, budget_s: float | None = None) -> JobsRun:
    """Submit the plan's steps in rounds and, unless not `wait`, merge them as they end: each round, every
    step not done, not in flight and not yet tried in this run whose inputs are in OUTPUT_DIR; the rest wait
    for the next round. With `budget_s`, a step that would end past it (now plus its prediction) is not
    submitted ('over budget'), and the jobs still queued or running when it ends are stopped (local workers
    signalled, Slurm jobs cancelled: 'stopped at --budget'); the next command runs both. A
    KeyboardInterrupt propagates after the plan file records what ended."""
    started = time.monotonic()

    def past_budget() -> bool:
        return budget_s is not None and time.monotonic() - started >= budget_s

    tried: set[str] = set()
    rounds = 0
    done = plan.counts()[0]
    if done:
        print(f"{done} of {len(plan.runnable)} steps already done in {plan.output_dir}", file=sys.stderr)
    bar = progress_bar(len(plan.runnable), "step", initial=done)

    def show(poll: Poll) -> None:
        live = plan.in_flight(poll)
        done, failed = plan.counts()
        queued = sum(state == "queued" for state in live.values())
        bar.n = done + failed
        bar.set_postfix_str(f"queued {queued}, running {len(live) - queued}, done {done}, failed {failed}")
        bar.refresh()

    try:
        while True:
            poll = runner.poll()
            plan.merge(poll.outcomes)
            live = plan.in_flight(poll)
            ready, waiting = [], []
            for step in plan.runnable:
                if step.id in plan.done or step.id in live or step.id in tried:
                    continue
                if plan.waits_for(step):
                    waiting.append(step)
                elif budget_s is not None and (left := budget_s - (time.monotonic() - started)) < (
                    step.predicted_s or 0
                ):
                    tried.add(step.id)
                    step.reason = (
                        f"not started: predicted {step.predicted_s:.0f} s, {max(0.0, left):.0f} s of --budget left"
                    )
                    plan.outcomes[step.id] = {"outcome": "over budget"}
                else:
                    ready.append(step)
            if ready:
                rounds += 1
                attempts = runner.submit([plan.jobs[step.id] for step in ready])
                tried.update(step.id for step in ready)
                for step, attempt in zip(ready, attempts, strict=True):
                    live[step.id] = "queued"
                    plan.outcomes[step.id] = {
                        "outcome": "queued",
                        "executor": runner.kind,
                        "slurm_job_id": attempt.job_id,
                    }
                bar.write(_round_line(rounds, ready, attempts, waiting, plan, wait), file=sys.stderr)
            plan.write_plan()
            if not live or not wait:
                break
            names = {plan.jobs[s].name for s in live}
            last = collect(runner.poll, plan.merge, names, wait=True, stopped=past_budget, show=show)
            if past_budget() and (stopping := last.live(names)):
                plan.stopping.update(plan.by_name[attempt.name].id for attempt in stopping)
                bar.write(
                    f"--budget is spent: {len(stopping)} job(s) stopped; the same command runs them again",
                    file=sys.stderr,
                )
                runner.stop(stopping)
                collect(runner.poll, plan.merge, names, wait=True, stopped=lambda: False, show=show)
    finally:
        bar.close()
    in_flight = [s for s in plan.runnable if plan.outcomes.get(s.id, {}).get("outcome") in IN_FLIGHT]
    waiting = [s for s in plan.runnable if s.id not in plan.done and s.id not in tried and plan.waits_for(s)]
    if not in_flight:  # what still waits, waits for a step that ended not done: nothing to draw, a failure
        for step in waiting:
            plan.outcomes[step.id] = {"outcome": f"not run: {', '.join(plan.waits_for(step))} was not made"}
        waiting = []
        plan.write_plan()
    return JobsRun(plan.outcomes, in_flight, waiting, time.monotonic() - started)


def _round_line(number: int, ready: list[Step], attempts, waiting: list[Step], plan: PlanJobs, wait: bool) -> str:
    ids = [a.job_id for a in attempts if a.job_id]
    jobs = f" (Slurm jobs {ids[0]} .. {ids[-1]})" if len(ids) > 1 else f" (Slurm job {ids[0]})" if ids else ""
    line = f"round {number}: {len(ready)} step(s) submitted{jobs}; jobs in {plan.job_dir.path}"
    if waiting:
        reads = "; ".join(f"{s.id} reads {', '.join(plan.waits_for(s))}" for s in waiting)
        then = "the next round, once those are done" if wait else "the same command again, once those are done"
        line += f"\n{len(waiting)} step(s) wait for an earlier step's output ({reads}): submitted in {then}"
    return line
