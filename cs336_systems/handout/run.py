"""Running a plan: each step is its tool's own command in a child process, so a crash, an OOM or a
hang ends that step only. A step that ran (its rows written, failed ones included) leaves a done marker
(its exact command, outcome and the size of each output) in OUTPUT_DIR/.handout/, and each output's sha256
in OUTPUT_DIR/.cs336-bench.sha256 (results.writing.MADE, which `report --verify` checks too); the same
command later skips it while its outputs are there and as it finished them, continues a sweep the tool
can resume (--resume), and runs any other step again from empty outputs (a crashed or refused one too),
so no row is written twice. An output changed after its step finished (cut short, deleted, or edited in
place, even to the same size) is not what the step measured: the step runs again, said in one line, and
its fresh outputs replace the changed ones (move a file away first to keep an edit). A marker from before
checksums is trusted by sizes alone.
The plan and every step's outcome are kept in OUTPUT_DIR/handout_plan.csv, rewritten after each step.
Files are written and removed as outputs.py allows: only handout's own, never through a link.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from .. import jsontext
from ..lifetime import child_preexec
from ..progress import postfix, progress_bar
from ..results import ResultFileError, open_to_write, write_whole
from ..results.origin import named
from ..results.writing import MADE, file_sha256, made_sums, record_made
from ..units import format_bytes
from .budget import format_seconds
from .outputs import LOGS, MARKERS, claim, written
from .plan import Step, fit_verdict
from .target import Target

PLAN_FILE = "handout_plan.csv"
DONE_STATUSES = (0, 1)  # rows written (failed ones are rows); a crash or a refusal runs again next time
INTERRUPT_GRACE_S = 20.0  # a sweep asked to stop finishes the configuration in progress, then saves it


def marker_path(output_dir: Path, step: Step) -> Path:
    return output_dir / MARKERS / f"{step.id}.json"


def _load_marker(output_dir: Path, step: Step) -> dict | None:
    try:
        marker = jsontext.loads(marker_path(output_dir, step).read_text())
    except (OSError, ValueError):  # none, unreadable, a directory of that name
        return None
    return marker if isinstance(marker, dict) else None


def changed_outputs(output_dir: Path, step: Step) -> list[str] | None:
    """The outputs of `step` that are not as it finished them (missing, another size or sha256 than its
    marker and results.writing.MADE recorded; a marker from before those: empty); None when no marker records
    this very command (a changed plan runs the step again)."""
    marker = _load_marker(output_dir, step)
    if marker is None or marker.get("command") != step.shell(output_dir):
        return None
    sizes = marker["outputs"] if isinstance(marker.get("outputs"), dict) else dict.fromkeys(step.outputs())
    sums = marker["sha256"] if isinstance(marker.get("sha256"), dict) else made_sums(output_dir)  # older: its own
    return [name for name, size in sizes.items() if not _as_recorded(output_dir / str(name), size, sums.get(name))]


def _as_recorded(path: Path, size: int | None, sha256: str | None) -> bool:
    """Whether `path` is a regular file of `size` bytes (None: not empty) and, if given, that sha256."""
    try:
        actual = path.lstat()
    except OSError:
        return False
    if not stat.S_ISREG(actual.st_mode) or (actual.st_size != size if size is not None else not actual.st_size):
        return False
    return sha256 is None or file_sha256(path) == sha256


def read_marker(output_dir: Path, step: Step) -> dict | None:
    """The done marker of `step` when it records this very command and its outputs are still there and
    as the step finished them (changed_outputs)."""
    changed = changed_outputs(output_dir, step)
    return None if changed is None or changed else _load_marker(output_dir, step)


def mark_done(output_dir: Path, step: Step, outcome: dict) -> None:
    """The step's done marker: `outcome` (its command, exit status, time, where it ran) and the size of each
    output now in `output_dir`; each output's sha256 goes to results.writing.MADE (read_marker checks both,
    `report --verify` the sha256)."""
    files = [name for name in step.outputs() if (output_dir / name).is_file()]
    claim(output_dir, [MADE])
    for name in files:
        record_made(output_dir / name)
    sizes = {name: (output_dir / name).stat().st_size for name in files}
    write_whole(marker_path(output_dir, step), json.dumps({**outcome, "outputs": sizes}))


def recorded_by_markers(steps: list[Step], output_dir: Path) -> list[str]:
    """What the done markers an older handout left (before the ledger) record as its own: each marker,
    its step's log and the outputs it names (a marker from before output sizes: those of the command it
    records), and the plan file when it says it is a handout plan. Nothing else there is claimed."""
    names = []
    for step in (s for s in steps if s.status == "run"):  # their markers' names were checked: regular files
        marker = _load_marker(output_dir, step)
        if marker is None or not isinstance(marker.get("command"), str):
            continue
        recorded = marker.get("outputs")
        if isinstance(recorded, dict):
            names += [name for name in step.outputs() if name in recorded]
        elif marker["command"] == step.shell(output_dir):
            names += step.outputs()
        names += [log_name(step), f"{MARKERS}/{step.id}.json"]
    if _is_plan(output_dir / PLAN_FILE):
        names.append(PLAN_FILE)
    return names


def _is_plan(path: Path) -> bool:
    try:
        with path.open(newline="") as handle:
            row = next(csv.DictReader(handle), None)
    except (OSError, UnicodeDecodeError, csv.Error):
        return False
    return row is not None and row.get("tool") == "handout"


def say_changed(steps: list[Step], output_dir: Path) -> None:
    """One line per done step whose outputs changed since it finished: it runs again."""
    for step in steps:
        if changed := changed_outputs(output_dir, step):
            print(
                f"{step.id}: {', '.join(changed)} changed since the step finished (cut short, removed or edited): "
                "it runs again",
                file=sys.stderr,
            )


def plan_rows(
    steps: list[Step], target: Target, output_dir: Path, outcomes: dict[str, dict], edition: str, scale: str
) -> list[dict]:
    rows = []
    for order, step in enumerate(steps, 1):
        done = outcomes.get(step.id, {})
        plan_status = "skipped" if step.status == "skipped" else "reduced" if step.reductions else "run"
        rows.append(
            dict(
                order=order,
                edition=edition,
                scale=scale,
                problem=step.problem,
                step=step.id,
                part=step.part,
                runs=Path(step.tool).name if step.tool.endswith((".py", ".sh")) else step.tool,
                plan_status=plan_status,
                outcome=done.get("outcome", "skipped" if step.status == "skipped" else "pending"),
                reason=step.reason,
                reductions="; ".join(step.reductions),
                fits=fit_verdict(step.predicted_peak_bytes, target)[0],
                predicted_peak_bytes=step.predicted_peak_bytes,
                device_memory_bytes=target.memory_bytes,
                predicted_s=None if step.predicted_s is None else round(step.predicted_s, 1),
                elapsed_s=done.get("elapsed_s"),
                exit_status=done.get("exit_status"),
                command=step.shell(output_dir) if step.flags else "",  # a skipped step's too: how to measure it
                outputs=" ".join(step.outputs()),
                reads=" ".join(step.reads),
                figures=" ".join(step.figures),
                text_output=step.capture or "",
                device_name=target.name,
                device_assumed=target.assumed,
                # where it ran: inline here, or the executor's job (handout/jobs.py)
                executor=done.get("executor"),
                hostname=done.get("hostname"),
                slurm_job_id=done.get("slurm_job_id"),
            )
        )
    return rows


def write_plan(path: Path, rows: list[dict]) -> None:
    """Replaced whole (written beside, then renamed): a kill never leaves half a plan."""
    write_whole(path, pd.DataFrame(named("handout", rows)).to_csv(index=False))


def outcome_of(exit_status: int) -> str:
    return {0: "ok", 1: "failed rows", 2: "refused", 130: "interrupted", 143: "interrupted"}.get(
        exit_status, f"crashed (exit {exit_status})"
    )


def prepare(step: Step, output_dir: Path) -> list[str]:
    """The command to run now: a sweep continues its own outputs (measured as this plan measures them: a plan
    changed since, another --budget say, starts them again); any other tool starts from none."""
    marker = marker_path(output_dir, step)
    marker.unlink(missing_ok=True)
    command = step.command(output_dir)
    if step.resumable and not _measured_otherwise(step, output_dir):
        return [*command, "--resume"]
    ours = written(output_dir)
    for name in step.outputs():
        if name in ours:  # never a file handout did not write (outputs.check_output_dir refused those)
            (output_dir / name).unlink(missing_ok=True)
    return command


def _measured_otherwise(step: Step, output_dir: Path) -> bool:
    """Whether a sweep's outputs hold rows measured with other settings than the step's (the sweep refuses them)."""
    from ..sweep import existing_rows, other_protocol
    from .plan import benchmark_configs

    with contextlib.suppress(ResultFileError):  # a damaged file: the tool names it
        return bool(other_protocol(benchmark_configs(step), existing_rows(output_dir / n for n in step.outputs())))
    return False


def log_name(step: Step) -> str:
    return f"{LOGS}/{step.id}.log"


BUDGET_STOP = -1  # run_step's status for a step stopped at the end of --budget (not done: resumed later)
BUDGET_STOPPED = "stopped at --budget"  # its outcome in the plan file


def last_line(path: Path) -> str:
    """The last line a step's log shows now (its tool's progress), for the progress bar."""
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, path.stat().st_size - 4096))
            lines = [
                line for line in handle.read().decode(errors="replace").replace("\r", "\n").splitlines() if line.strip()
            ]
    except OSError:
        return ""
    return lines[-1].strip() if lines else ""


def run_step(
    step: Step, output_dir: Path, show: Callable[[str], None] = lambda line: None, deadline: float | None = None
) -> tuple[int, float]:
    """Run one step's command to its end; (exit status, seconds). Its log's last line goes to `show`
    every second. At `deadline` (time.monotonic) the step is stopped as Ctrl-C stops it (a sweep saves
    the configuration in progress): BUDGET_STOP. Ctrl-C asks the child to stop, then kills its process
    group, and raises again."""
    claim(output_dir, [*step.outputs(), log_name(step), f"{MARKERS}/{step.id}.json"])
    command = prepare(step, output_dir)
    log = output_dir / log_name(step)
    # what this process can import (the user's adapters, model, optimizer), the child can too
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    start = time.perf_counter()
    with (
        open_to_write(log) as err,
        open_to_write(output_dir / step.capture) if step.capture else contextlib.nullcontext(err) as out,
    ):
        err.write(f"$ {step.shell(output_dir)}\n")
        err.flush()
        process = subprocess.Popen(
            command, stdout=out, stderr=err, env=env, start_new_session=True, preexec_fn=child_preexec()
        )
        try:
            while True:
                try:
                    status = process.wait(timeout=1.0)
                    break
                except subprocess.TimeoutExpired:
                    show(last_line(log))
                    if deadline is not None and time.monotonic() >= deadline:
                        _stop(process)
                        status = BUDGET_STOP
                        break
        except BaseException:
            _stop(process)
            raise
    return status, time.perf_counter() - start


def _stop(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGINT)
    try:
        process.wait(timeout=INTERRUPT_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def execute(
    steps: list[Step], target: Target, output_dir: Path, edition: str, scale: str, budget_s: float | None = None
) -> dict[str, dict]:
    """Run every pending step in order under one progress bar (the running step's own progress line
    beside it); returns each step's outcome. Within `budget_s`, a step predicted to take longer than
    what is left is not started, and one still running at the end is stopped (both resumed by the same
    command later). KeyboardInterrupt (Ctrl-C, SIGTERM) propagates after the plan file records what
    finished."""
    started = time.monotonic()
    (output_dir / MARKERS).mkdir(parents=True, exist_ok=True)  # outputs.check_output_dir refused a link there
    claim(output_dir, [PLAN_FILE])
    plan_path = output_dir / PLAN_FILE
    runnable = [s for s in steps if s.status == "run"]
    say_changed(runnable, output_dir)
    outcomes = {s.id: m for s in runnable if (m := read_marker(output_dir, s))}
    write_plan(plan_path, plan_rows(steps, target, output_dir, outcomes, edition, scale))
    if outcomes:
        print(f"{len(outcomes)} of {len(runnable)} steps already done in {output_dir}; continuing", file=sys.stderr)
    bar = progress_bar(len(runnable), "step", initial=len(outcomes))
    try:
        for step in runnable:
            if step.id in outcomes:
                continue
            bar.set_description(step.problem)
            bar.set_postfix_str(step.id)
            deadline = None if budget_s is None else started + budget_s
            if deadline is not None and (step.predicted_s or 0) > deadline - time.monotonic():
                left = max(0.0, deadline - time.monotonic())
                step.reason = f"not started: predicted {step.predicted_s:.0f} s, {left:.0f} s of --budget left"
                outcomes[step.id] = {"outcome": "over budget"}
                write_plan(plan_path, plan_rows(steps, target, output_dir, outcomes, edition, scale))
                bar.update(1)
                continue

            def show(line: str, step: Step = step) -> None:
                bar.set_postfix_str(postfix(f"{step.id}: {line}"))

            try:
                status, elapsed = run_step(step, output_dir, show, deadline)
            except KeyboardInterrupt:
                outcomes[step.id] = {"outcome": "interrupted"}
                write_plan(plan_path, plan_rows(steps, target, output_dir, outcomes, edition, scale))
                raise
            outcome = {
                "command": step.shell(output_dir),
                "exit_status": status,
                "elapsed_s": round(elapsed, 1),
                "outcome": outcome_of(status),
                "executor": "inline",
                "hostname": socket.gethostname(),
            }
            if status == BUDGET_STOP:
                outcome["outcome"] = BUDGET_STOPPED
            elif status in (130, 143):  # the child itself was interrupted: not done
                outcomes[step.id] = {"outcome": "interrupted"}
                write_plan(plan_path, plan_rows(steps, target, output_dir, outcomes, edition, scale))
                raise KeyboardInterrupt
            if status in DONE_STATUSES:
                mark_done(output_dir, step, outcome)
            outcomes[step.id] = outcome
            write_plan(plan_path, plan_rows(steps, target, output_dir, outcomes, edition, scale))
            bar.update(1)
            if outcome["outcome"] != "ok":
                bar.write(f"{step.id}: {outcome['outcome']} (log: {output_dir / log_name(step)})")
    finally:
        bar.close()
    return outcomes


def plan_table(steps: list[Step], target: Target) -> str:
    """The plan as a Markdown table, for --dry-run."""
    from tabulate import tabulate

    body = []
    for step in steps:
        fits = fit_verdict(step.predicted_peak_bytes, target)[0] if step.status == "run" else "-"
        why = step.reason + ("; " + "; ".join(step.reductions) if step.reductions else "")
        body.append(
            [
                step.problem,
                step.part,
                step.status,
                format_bytes(step.predicted_peak_bytes) or "?",
                format_seconds(step.predicted_s) if step.status == "run" else "",
                fits,
                why,
            ]
        )
    headers = ["problem", "what runs", "plan", "predicted peak", "predicted time", "fits", "why"]
    return tabulate(body, headers=headers, tablefmt="github", disable_numparse=True)


def not_measured_line(edition: str) -> str:
    """The edition's problems that have nothing to measure, by kind (--dry-run prints it under the plan)."""
    from .problems import MEASURED, of_edition

    kinds: dict[str, list[str]] = {}
    for problem in of_edition(edition):
        if problem.kind != MEASURED:
            kinds.setdefault(problem.kind, []).append(problem.label)
    parts = [f"{kind}: {', '.join(problems)}" for kind, problems in kinds.items()]
    return "Not measured (" + "; ".join(parts) + ")"
