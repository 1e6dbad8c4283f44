"""On Slurm the handout plans for the nodes' device, not this machine's: a first job reports it (target.py),
kept in OUTPUT_DIR/.handout/target.json for every later run; --slurm-same-node pins every step's job to
that job's node (sbatch --nodelist), so that a table's rows all come from one GPU."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from .. import jsontext
from ..executor import ATTEMPT_DIR, Job, JobDir, Outcome, collect
from ..executor.jobs import STEP_LOG
from ..results import write_whole
from ..tools import module_name
from .outputs import MARKERS, claim
from .target import Target, target_from_record

TARGET_RECORD = f"{MARKERS}/target.json"  # the nodes' device, as the first Slurm job found it
TARGET_FILE = "target.json"  # what that job writes in its attempt directory


def target_job(device: str) -> Job:
    """The first Slurm job: the device of the node it gets (target.py), to plan for."""
    command = (sys.executable, "-m", module_name("handout.target"), "--device", device, f"{ATTEMPT_DIR}/{TARGET_FILE}")
    name = f"target-{device.split(':')[0]}"
    return Job(name, command, label="the nodes' device", payload={"target": device})


def known_target(output_dir: Path, device: str) -> tuple[Target, dict] | None:
    """The target an earlier run's first job found, when it is of `device`'s type (cpu, cuda)."""
    try:
        record = jsontext.loads((output_dir / TARGET_RECORD).read_text())
    except (OSError, ValueError):
        return None
    target = target_from_record(record) if isinstance(record, dict) else None
    if target is None or target.type != device.split(":")[0]:
        return None
    return target, record


def node_of(record: dict) -> str | None:
    """Slurm's name of the node the first job ran on (sbatch --nodelist takes it)."""
    return record.get("slurm_node") or (str(record.get("hostname") or "").split(".")[0] or None)


class TargetJobFailed(Exception):
    """The first job ended without saying the nodes' device (its log says why)."""


def find_target(runner, job_dir: JobDir, output_dir: Path, device: str, wait: bool) -> tuple[Target, dict] | None:
    """The nodes' device: as an earlier run found it, else from a first job (submitted unless one is in flight,
    and waited for unless not `wait`: then None while it is). TargetJobFailed when this run's job failed."""
    known = known_target(output_dir, device)
    if known is not None:
        return known
    job = target_job(device)
    failed: list[str] = []

    def merge(outcomes: Sequence[Outcome]) -> None:
        _, settled = job_dir.attempts()
        for outcome in outcomes:
            if outcome.attempt.name != job.name or outcome.attempt.key in settled:
                continue
            found = _read_json(outcome.attempt.directory / TARGET_FILE) if outcome.exit_code == 0 else None
            if found is not None and target_from_record(found) is not None:
                claim(output_dir, [TARGET_RECORD])
                write_whole(output_dir / TARGET_RECORD, json.dumps(found, indent=2) + "\n")
            else:
                log = outcome.attempt.directory / STEP_LOG
                failed.append(f"{outcome.error or outcome.kind} (log: {log})")
            job_dir.record_settled(outcome, "ok" if found else outcome.kind)

    first = runner.poll()
    merge(first.outcomes)  # an earlier run's job that ended since
    failed.clear()
    if known_target(output_dir, device) is None and not first.live({job.name}):
        (attempt,) = runner.submit([job])
        where = f"Slurm job {attempt.job_id}" if attempt.job_id else "a job"
        print(f"submitted {where} to find the nodes' device; the plan is made for it", file=sys.stderr)
    collect(runner.poll, merge, {job.name}, wait=wait, stopped=lambda: False, show=lambda poll: None)
    known = known_target(output_dir, device)
    if known is None and failed:
        raise TargetJobFailed(failed[-1])
    return known


def _read_json(path: Path) -> dict | None:
    try:
        value = jsontext.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None
