"""find_max --executor slurm: the whole search as one Slurm job.

Each probe depends on the one before it, and all of them must run on one GPU for the answer to mean
anything, so the search is not spread over jobs: one job runs `find_max` itself (inline, its own
command line less the executor's flags) on the node it is given, writing its probe rows and its answer
into its attempt directory; this process merges the rows into --output and the answer into --summary,
under the outputs' lock. The same command again waits for a search in flight, says the answer of one
that finished, and submits the search again after a job that was cancelled, preempted or timed out.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import shlex
import sys
from pathlib import Path

from . import jsontext
from .argtypes import EXIT_FAILED, EXIT_OK, argv_without
from .errors import UsageError
from .executor import ATTEMPT_DIR, Job, JobDir, Outcome, collect, settings_from_args
from .executor.settings import EXECUTOR_DESTS
from .executor.slurm import SlurmRunner
from .results import ResultSink, check_output_path, check_output_paths, write_whole
from .sweep import StopRequest
from .sweep_jobs import records_of
from .tools import module_name

SUMMARY = "summary.json"
ANSWERED = "answered"  # a settled attempt's status when its search ended with an answer file


def run(args: argparse.Namespace, parser: argparse.ArgumentParser, prog: str) -> int:
    settings = settings_from_args(args)
    outputs = check_output_paths(args.output)
    summary = args.summary or (outputs[0].with_suffix(".json") if outputs else None)
    if summary is None:
        raise UsageError("--executor slurm needs --output or --summary: the search's rows and answer come back there")
    summary = check_output_path(summary, "--summary")
    job_dir = JobDir(settings.job_dir or summary.with_name(summary.stem + ".jobs"))
    argv = argv_without(parser, args.argv, {*EXECUTOR_DESTS, "output", "summary", "device"})
    command = (
        *(sys.executable, "-m", module_name("find_max"), *argv, "--device", settings.device),
        *("--output", f"{ATTEMPT_DIR}/rows.jsonl", "--summary", f"{ATTEMPT_DIR}/{SUMMARY}"),
    )
    name = hashlib.sha1(json.dumps([*argv, settings.device]).encode()).hexdigest()[:16]
    job = Job(name, command, f"find_max --dimension {args.dimension}")
    runner = SlurmRunner(settings, job_dir, "cs336-find_max")
    if settings.dry_run:
        sys.stdout.write(runner.dry_run([job]))
        return EXIT_OK
    runner.check()
    stop = StopRequest()
    print(f"{runner.describe()}; the whole search is one job", file=sys.stderr)

    def merge(outcomes: list[Outcome]) -> None:
        with ResultSink(outputs, wait_lock=True) as held:  # (within the first pass's: one process shares a lock)
            _, settled = job_dir.attempts()
            for outcome in outcomes:
                if outcome.attempt.key in settled:
                    continue
                with stop.writing():
                    for record in records_of(outcome):
                        held.write(record)
                    answer = outcome.attempt.directory / SUMMARY
                    status = ANSWERED if answer.exists() else outcome.kind
                    if answer.exists():
                        write_whole(summary, answer.read_text())
                    elif outcome.error:
                        print(f"{prog}: the search's job ended ({outcome.kind}): {outcome.error}", file=sys.stderr)
                    job_dir.record_settled(outcome, status)

    with stop.installed():
        with ResultSink(outputs, wait_lock=True):  # one search at a time: a second command finds it in flight
            first = runner.poll()
            merge(first.outcomes)
            if _answer(job_dir, name, summary) is not None:
                print(
                    f"answered before, by the job in {job_dir.path}; --job-dir elsewhere to search again",
                    file=sys.stderr,
                )
            elif not first.live({name}):
                (attempt,) = runner.submit([job])
                print(f"submitted the search as Slurm job {attempt.job_id}; jobs in {job_dir.path}", file=sys.stderr)
        last = collect(
            runner.poll, merge, {name}, wait=settings.wait, stopped=lambda: stop.requested, show=lambda poll: None
        )
    if last.live({name}):
        again = f"{prog} {shlex.join(args.argv)}"
        print(f"the search is still in Slurm's queue; the same command collects it:\n  {again}", file=sys.stderr)
        return stop.exit_status if stop.requested else EXIT_OK
    answer = _answer(job_dir, name, summary)
    if answer is None:
        print(f"{prog}: no answer; the same command submits the search again", file=sys.stderr)
        return EXIT_FAILED
    return _print_answer(answer, summary)


def _answer(job_dir: JobDir, name: str, summary: Path) -> dict | None:
    """The answer of the search's job that ended with one (--summary, written again from the job's copy if removed)."""
    copies = [
        job_dir.attempt_directory(name, str(e.get("attempt"))) / SUMMARY
        for e in job_dir.entries()
        if (e.get("event"), e.get("job"), e.get("status")) == ("settled", name, ANSWERED)
    ]
    with contextlib.suppress(OSError, ValueError):
        if copies and not summary.is_file():
            write_whole(summary, copies[-1].read_text())
        return jsontext.loads(summary.read_text()) if copies else None
    return None


def _print_answer(answer: dict, summary: Path) -> int:
    dimension = answer.get("dimension")
    print(answer.get("config"))
    print(f"largest {dimension} that runs: {answer.get('largest_ok')}")
    print(f"smallest {dimension} that runs out of memory: {answer.get('smallest_oom')}")
    print(f"({answer.get('stopped_because')}; {len(answer.get('probes') or [])} probes)")
    print(f"wrote {summary}", file=sys.stderr)
    return EXIT_OK if answer.get("complete") else EXIT_FAILED
