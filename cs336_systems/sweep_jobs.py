"""A sweep's grid as executor jobs (--executor local or slurm): one job per configuration, each running

    python -m cs336_systems.benchmark --config JSON --output JOBDIR/jobs/NAME/N/rows.jsonl

as run_benchmarks' children do (under --memory-limit's cap, within --timeout, when given). Each job writes
its own row file; only this process merges rows into the outputs, under their lock, so no two nodes ever
append to one file. A pass, under the lock: merge every attempt of the job directory that has ended (its
row, or a row saying how it ended: timeout, cancelled, preempted, error), then submit the configurations
with no final row that are not in flight. Then, unless --no-wait, wait and merge as jobs end. The same
command again is the same pass: it never runs a configuration that has a final row, and runs again one
whose job was cancelled, preempted or reached Slurm's time limit (sweep.is_redone).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import hashlib
import json
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from . import benchmark_flags, jsontext
from .argtypes import EXIT_FAILED, EXIT_OK, exit_status
from .child import ChildLimits, benchmark_arguments, child_limits_from_args, failed_record, record_from_row
from .config import BenchmarkConfig
from .errors import UsageError
from .executor import ATTEMPT_DIR, Job, JobDir, Outcome, Poll, collect, open_runner, settings_from_args
from .factory import count_parameters_for
from .lifetime import temporary_directory
from .monitor import check_monitor_arguments, monitored
from .results import (
    BenchmarkRecord,
    Environment,
    ResultSink,
    ResultWriteError,
    check_output_paths,
    collect_environment,
)
from .results.errors import OutputLockedError
from .step import describe_config, describe_measurement
from .sweep import (
    StopRequest,
    existing_rows,
    final_keys,
    grid_from_args,
    grid_size_table,
    is_redone,
    latest_rows,
    pending_configs,
    progress,
    recorded_outputs,
    resume_command,
    rows_by_output,
)
from .terminal import show

ROWS = "rows.jsonl"
# A row's status for an attempt that ended without writing one, by how it ended (timeout, cancelled and
# preempted are their own status).
STATUS_OF = {"exited": "error", "error": "error"}


def job_name(config: BenchmarkConfig) -> str:
    """A configuration's job name: its identity (the resume key), hashed."""
    return hashlib.sha1(json.dumps(config.key()).encode()).hexdigest()[:16]


def config_job(config: BenchmarkConfig, limits: ChildLimits) -> Job:
    command = (sys.executable, "-m", *benchmark_arguments(config, limits), "--output", f"{ATTEMPT_DIR}/{ROWS}")
    payload = {"config": config.to_dict(), "memory_limit_bytes": limits.memory_limit_bytes}
    return Job(job_name(config), command, describe_config(config), limits.timeout_s, payload)


def default_job_dir(outputs: Sequence[Path]) -> Path | None:
    """OUTPUT.jobs beside the first .csv / .jsonl output (results/sweep.csv: results/sweep.jobs)."""
    recorded = recorded_outputs(outputs)
    return recorded[0].with_name(recorded[0].stem + ".jobs") if recorded else None


@functools.cache
def _submitter_environment() -> Environment:
    return collect_environment(torch.device("cpu"))


def environment_of(outcome: Outcome):
    """The environment of a row this process writes for a job that wrote none: the libraries are the job's
    (the same Python), the machine is not known beyond the node's name and the job's placement."""
    unknown = dict.fromkeys(("device_name", "cpu_name", "platform", "device_memory_bytes", "num_threads"))
    placed = {k: v for k, v in outcome.placement.items() if k != "hostname"}
    return dataclasses.replace(
        _submitter_environment(), **unknown, hostname=outcome.placement.get("hostname"), **placed
    )


def records_of(outcome: Outcome, payload: dict | None = None) -> list[BenchmarkRecord]:
    """The rows the attempt's command wrote (its rows.jsonl), annotated with the memory cap it ran under
    (`payload`: its job's, when the attempt keeps none)."""
    try:
        text = (outcome.attempt.directory / ROWS).read_text()
    except OSError:
        return []
    limits = ChildLimits(memory_limit_bytes=(payload or outcome.attempt.payload).get("memory_limit_bytes"))
    records = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError, TypeError):  # a line cut by a killed job: not a row
            records.append(limits.annotate(record_from_row(jsontext.loads(line))))
    return records


def failure_record(outcome: Outcome, payload: dict) -> BenchmarkRecord:
    """The row of a configuration (`payload`, its job's) whose attempt ended without writing one."""
    config = BenchmarkConfig.from_dict(payload["config"])
    num_params = None if config.model_factory else count_parameters_for(config.model)
    error = outcome.error or "the job ended without writing a row (exit status 0)"
    limits = ChildLimits(memory_limit_bytes=payload.get("memory_limit_bytes"))
    return limits.annotate(
        failed_record(config, environment_of(outcome), STATUS_OF.get(outcome.kind, outcome.kind), error, num_params)
    )


FIRST_MERGE_PATIENCE_S = 10.0  # how long a first merge waits out another collector's merge


class Merger:
    """Writes outcomes into the outputs, each under their lock (taken per merge, so that two submitting
    processes share one output), and settles each in the job directory under the same lock."""

    def __init__(self, outputs: list[Path], job_dir: JobDir, stop: StopRequest, wait_lock: bool, jobs: dict):
        self.outputs, self.job_dir, self.stop, self.wait_lock = outputs, job_dir, stop, wait_lock
        self.payloads = {name: job.payload for name, job in jobs.items()}  # for attempts submitted by hand
        self.statuses: dict[tuple[str, str], str | None] = {}  # what each attempt merged this run left

    def open(self) -> ResultSink:
        """The outputs, locked. Another collector of the same outputs holds their lock only for one merge,
        so a first pass that finds it held tries again for a few seconds before it refuses (a sweep
        writing there holds it for its whole run); after the first pass our merges wait for it."""
        deadline = time.monotonic() + FIRST_MERGE_PATIENCE_S
        while True:
            try:
                sink = ResultSink(self.outputs, wait_lock=self.wait_lock, wait_flag="--wait-lock")
            except OutputLockedError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
                continue
            self.wait_lock = True
            return sink

    def merge(self, outcomes: Sequence[Outcome], sink: ResultSink) -> None:
        _, settled = self.job_dir.attempts()  # another process may have merged some since they were polled
        held = rows_by_output(self.outputs)
        sink.holds = {path: final_keys(rows) for path, rows in held.items()}
        sink.set_previous_rows(existing_rows(self.outputs))
        for outcome in outcomes:
            if outcome.attempt.key in settled:
                continue
            payload = outcome.attempt.payload or self.payloads.get(outcome.attempt.name, {})
            records = records_of(outcome, payload)
            if not records and outcome.kind != "abandoned":
                if "config" in payload:
                    records = [failure_record(outcome, payload)]
                else:  # submitted by hand, of another grid: no configuration to write a row of; it runs again
                    print(f"{outcome.attempt.directory}: no row ({outcome.error or outcome.kind})", file=sys.stderr)
            with self.stop.writing():
                for record in records:
                    sink.write(record)
                    if not is_redone(record.to_row()):  # a second attempt's row of this key is not written again
                        for keys in sink.holds.values():
                            keys.add(record.key())
                status = records[-1].status if records else None
                self.job_dir.record_settled(outcome, status)
            self.statuses[outcome.attempt.key] = status

    def merge_locked(self, outcomes: Sequence[Outcome]) -> None:
        sink = self.open()
        try:
            self.merge(outcomes, sink)
        finally:
            sink.close()


def run(args: argparse.Namespace, prog: str, child_processes: bool) -> int:
    settings = settings_from_args(args, torch.cuda.device_count() if args.executor == "local" else 0)
    device = torch.device(settings.device)
    table = grid_size_table(args)
    configs = grid_from_args(args, device, table)
    benchmark_flags.check_runnable(configs[0], device)
    outputs = check_output_paths(args.output)
    check_monitor_arguments(args)
    if settings.kind == "slurm" and args.monitor:
        raise UsageError(
            "--monitor samples this machine; the Slurm jobs run on others (watch them with their node's tools)"
        )
    limits = child_limits_from_args(args, device) if child_processes else ChildLimits()
    jobs = {job_name(config): config_job(config, limits) for config in configs}
    path = settings.job_dir or default_job_dir(outputs)
    if path is None and (settings.kind == "slurm" or settings.dry_run):
        raise UsageError(
            f"--executor {settings.kind} needs --output FILE.csv (or .jsonl), or --job-dir: the jobs' rows are "
            "merged into it, and the same command continues from it"
        )
    with temporary_directory("jobs") if path is None else contextlib.nullcontext() as temporary:
        job_dir = JobDir(Path(temporary) if path is None else path)
        runner = open_runner(settings, job_dir, job_name=f"cs336-{prog.split()[-1].split('.')[-1]}")
        if settings.dry_run:
            held = rows_by_output(outputs)
            pending = pending_configs(configs, held, resume=True)
            sys.stdout.write(runner.dry_run([jobs[job_name(config)] for config in pending]))
            return EXIT_OK
        if settings.kind == "slurm":
            runner.check()
        with monitored(args.monitor, args.monitor_interval):
            benchmark_flags.announce_size_table(table)
            return _run(args, prog, configs, jobs, outputs, job_dir, runner, settings)


def _run(args, prog, configs, jobs, outputs, job_dir: JobDir, runner, settings) -> int:
    names = set(jobs)
    continuing = job_dir.exists()
    stop = StopRequest()
    merger = Merger(outputs, job_dir, stop, args.wait_lock, jobs)
    threads = (
        settings.threads_per_worker or settings.slurm.cpus_per_task or ("the job's" if runner.kind == "slurm" else None)
    )
    print("\n".join(describe_measurement(configs, threads=threads)), file=sys.stderr)
    print(runner.describe(), file=sys.stderr)
    if continuing and not args.resume:
        print(f"continuing the sweep whose jobs are in {job_dir.path} (as --resume)", file=sys.stderr)
    with stop.installed():
        try:
            first, pending, submitted = _pass(merger, runner, configs, jobs, args.resume or continuing)
        except ResultWriteError as exc:
            return _write_failed(prog, args, exc)
        flying = len(pending) - len(submitted)
        print(
            f"{len(configs)} configurations: {len(configs) - len(pending)} already done, {flying} in flight, "
            f"{len(submitted)} submitted{_ids(submitted)}; jobs in {job_dir.path}",
            file=sys.stderr,
        )
        last = first
        if flying + len(submitted):
            counts = {"done": 0, "failed": 0}

            def stopped() -> bool:
                if stop.requested and runner.kind == "local":
                    runner.waiting.clear()  # the running workers finish and their rows are saved; the rest wait
                    return False
                return stop.requested

            rerun: set[str] = set()
            with progress(flying + len(submitted), prog) as bar:
                try:
                    while True:
                        last = collect(
                            runner.poll,
                            _counting(merger, names, counts),
                            names,
                            wait=settings.wait,
                            stopped=stopped,
                            show=_progress(bar, names, counts),
                        )
                        if not settings.wait or stop.requested or last.live(names):
                            break
                        last, _, again = _pass(merger, runner, configs, jobs, True, rerun)
                        if not again:
                            break
                        bar.total += len(again)
                        bar.write(f"{len(again)} job(s) of a stopped submitter, no row: submitted again", sys.stderr)
                except ResultWriteError as exc:
                    runner.close()
                    return _write_failed(prog, args, exc)
                except KeyboardInterrupt:  # a second Ctrl-C, or SIGTERM: this process's workers stop now
                    stop.requested = True
                    runner.close()
                    last = runner.poll() if runner.kind == "slurm" else Poll()
    rows = _grid_rows(configs, outputs)
    if rows:
        show(BenchmarkRecord.console(rows, args.all_columns))
    live = last.live(names)
    if live:
        where = "in Slurm's queue" if runner.kind == "slurm" else "running"
        print(
            f"{len(live)} job(s) still {where}; the same command collects them:\n  {prog} {shlex.join(args.argv)}",
            file=sys.stderr,
        )
    redo = sorted({row["status"] for row in rows if is_redone(row)})
    if redo:
        print(f"configurations to redo ({', '.join(redo)}): run the same command again", file=sys.stderr)
    if stop.requested:
        return stop.exit_status
    keys, flying = _keys(rows), {attempt.name for attempt in live}
    missing = sum(config.key() not in keys and job_name(config) not in flying for config in configs)
    if missing and recorded_outputs(outputs):
        print(f"{prog}: {missing} configuration(s) have no row: run the same command again", file=sys.stderr)
        return EXIT_FAILED
    return exit_status(row.get("status") for row in rows)


def _pass(merger: Merger, runner, configs, jobs: dict, resume: bool, rerun: set[str] | None = None):
    """Under the outputs' lock: merge every attempt that ended, then submit each configuration that has no final
    row and is not in flight; (the poll, the configurations pending, the attempts submitted). `rerun`, a later
    pass: only those with no row at all (their job ended with another submitting process), once a run each."""
    sink = merger.open()
    try:
        pending_configs(configs, rows_by_output(merger.outputs), resume)  # refuses a foreign file
        poll = runner.poll()
        merger.merge(poll.outcomes, sink)
        in_flight = {attempt.name for attempt in (*poll.queued, *poll.running)}
        held = rows_by_output(merger.outputs)
        pending = pending_configs(configs, held, True)
        todo = [config for config in pending if job_name(config) not in in_flight]
        if rerun is not None:
            written = _keys(row for rows in held.values() for row in rows) if held else {c.key() for c in configs}
            todo = [c for c in todo if c.key() not in written and job_name(c) not in rerun]
            rerun.update(job_name(config) for config in todo)
        return poll, pending, runner.submit([jobs[job_name(config)] for config in todo]) if todo else []
    finally:
        sink.close()


def _keys(rows) -> set[tuple]:
    return {BenchmarkRecord.row_key(row) for row in rows}


def _ids(attempts) -> str:
    ids = [a.job_id for a in attempts if a.job_id]
    if not ids:
        return ""
    return f" (Slurm job {ids[0]})" if len(ids) == 1 else f" (Slurm jobs {ids[0]} .. {ids[-1]})"


def _counting(merger: Merger, names: set[str], counts: dict):
    def merge(outcomes: Sequence[Outcome]) -> None:
        merger.merge_locked(outcomes)
        for outcome in outcomes:
            if outcome.attempt.name in names and outcome.attempt.key in merger.statuses:
                status = merger.statuses[outcome.attempt.key]
                if status is not None:
                    counts["done" if exit_status([status]) == 0 else "failed"] += 1

    return merge


def _progress(bar, names: set[str], counts: dict):
    def show_poll(poll: Poll) -> None:
        queued = sum(a.name in names for a in poll.queued)
        running = sum(a.name in names for a in poll.running)
        bar.n = min(bar.total, counts["done"] + counts["failed"])
        bar.set_postfix_str(f"queued {queued}, running {running}, done {counts['done']}, failed {counts['failed']}")
        bar.refresh()

    return show_poll


def _grid_rows(configs: Sequence[BenchmarkConfig], outputs: Sequence[Path]) -> list[dict]:
    """The grid's rows, each configuration's last, in grid order (jobs end in any order)."""
    held = rows_by_output(outputs)
    latest = {}
    for rows in held.values():
        for key, row in latest_rows(rows).items():
            latest.setdefault(key, row)
    return [latest[config.key()] for config in configs if config.key() in latest]


def _write_failed(prog: str, args, exc: ResultWriteError) -> int:
    print(f"{prog}: error: {exc.strerror}", file=sys.stderr)
    print(
        f"The jobs' rows stay in their files. Free space, then run again:\n  {resume_command(prog, args.argv)}",
        file=sys.stderr,
    )
    return EXIT_FAILED
