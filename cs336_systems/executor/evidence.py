"""How an attempt ended, from its evidence: the scheduler's state for its job, the lines Slurm writes into
the job's log, and the step's exit marker. Pure functions of text and dicts; the executors gather them.

Without an accounting store (`sacct` fails; the one-node test cluster), a job's final state is kept by
`scontrol show job` only MinJobAge seconds (default 300) after it ends; Slurm's own line in the job's log
(`slurmstepd: error: *** JOB 12 ON node CANCELLED AT ... DUE TO TIME LIMIT ***`) lasts as long as the log.
"""

from __future__ import annotations

import re

# Slurm states (squeue / scontrol / sacct) of a job that has not ended
LIVE_STATES = frozenset(
    ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD",
     "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD")
)  # fmt: skip
QUEUED_STATES = frozenset(("PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "CONFIGURING", "RESV_DEL_HOLD"))
# A final Slurm state -> an outcome; any other final state (FAILED, NODE_FAIL, OUT_OF_MEMORY, ...) is an error
# unless the step's exit marker says more.
STATE_OUTCOMES = {"TIMEOUT": "timeout", "DEADLINE": "timeout", "CANCELLED": "cancelled", "PREEMPTED": "preempted"}
SLURM_LINE = re.compile(
    r"\*\*\* (?:JOB|STEP) (?P<job>\S+) ON (?P<node>\S+) CANCELLED AT (?P<at>\S+)(?P<why>[^*]*)\*\*\*"
)
# The start of a row's error for a job Slurm ended at its time limit: resume runs such a row again.
SLURM_TIME_LIMIT = "Slurm ended the job at its time limit"
# Why a job pends (squeue's %r) when it can never start as asked (and any "...PerJob..." limit); ReqNodeNotAvail
# and PartitionNodeLimit also mean a node down or drained for now: those wait.
NEVER_STARTS = frozenset(
    ("PartitionConfig", "PartitionTimeLimit", "BadConstraints", "InvalidAccount", "InvalidQOS", "DependencyNeverSatisfied")
)  # fmt: skip


def queue_state(state: str | None, reason: str | None = None) -> str | None:
    """A Slurm state as 'queued', 'running', None (ended), or 'never': pending for a reason it never outgrows."""
    if state not in LIVE_STATES:
        return None
    if state not in QUEUED_STATES:
        return "running"
    return "never" if reason in NEVER_STARTS or "PerJob" in (reason or "") else "queued"


def parse_scontrol(text: str) -> dict[str, str]:
    """`scontrol show job -o ID`'s one line as {Key: value} (JobState, NodeList, Reason, ExitCode, ...)."""
    fields = {}
    for word in text.split():
        key, sep, value = word.partition("=")
        if sep and key not in fields:
            fields[key] = value
    return fields


def normalise_state(state: str) -> str:
    """'CANCELLED by 0' (sacct) and 'CANCELLED+' are CANCELLED."""
    return state.strip().split()[0].rstrip("+") if state.strip() else ""


def from_log(text: str) -> tuple[str | None, str | None]:
    """(outcome, node) from Slurm's own line in a job's log: cancelled, timeout (DUE TO TIME LIMIT),
    preempted (DUE TO PREEMPTION), error (DUE TO NODE FAILURE...), or (None, None) when there is none."""
    found = None
    for match in SLURM_LINE.finditer(text):
        found = match
    if found is None:
        return None, None
    why = found.group("why").strip().upper()
    if "TIME LIMIT" in why:
        return "timeout", found.group("node")
    if "PREEMPTION" in why:
        return "preempted", found.group("node")
    if why:
        return "error", found.group("node")
    return "cancelled", found.group("node")


def ended_outcome(
    state: str | None, log_text: str, exit_marker: dict | None, time_limit_min: int | None, started: bool = True
) -> tuple[str, str | None]:
    """(outcome, error) of a Slurm job that has left the queue: the scheduler's state first (a cancelled step
    still writes its exit marker), then Slurm's line in the log, then the step's exit marker. One that never
    `started` and left no state (a pending array task cancelled alone...) runs again, as a cancelled one."""
    outcome = STATE_OUTCOMES.get(normalise_state(state or ""))
    if outcome is None:
        outcome = from_log(log_text)[0]
    limit = f" (--slurm-time {time_limit_min} min)" if time_limit_min else ""
    if outcome == "timeout":
        return "timeout", f"{SLURM_TIME_LIMIT}{limit}; raise --slurm-time, then run the same command again"
    if outcome == "cancelled":
        return "cancelled", "the Slurm job was cancelled (scancel); the same command runs it again"
    if outcome == "preempted":
        return "preempted", "Slurm preempted the job; the same command runs it again"
    if exit_marker is not None and exit_marker.get("terminated_by"):
        return "cancelled", f"Slurm ended the job ({exit_marker['terminated_by']}); the same command runs it again"
    if exit_marker is not None:
        return exit_outcome(exit_marker)
    if not started and not state:
        return "cancelled", "the Slurm job left the queue before it started, with no record of why; it runs again"
    named = f"Slurm state {normalise_state(state)}" if state else "no Slurm state left (sacct, scontrol)"
    return "error", f"the job ended without finishing its step ({named}); see its log"


def exit_outcome(marker: dict) -> tuple[str, str | None]:
    """(outcome, error) from the step's exit marker alone: the job's own --timeout, a stop (SIGTERM), else
    the exit status and what the command printed last."""
    if marker.get("timed_out"):
        return "timeout", f"no result within --timeout {marker.get('timeout_s'):g} s"
    if marker.get("terminated_by"):  # a local worker stopped with its submitting process: it runs again
        return "abandoned", f"stopped by {marker['terminated_by']} before its end"
    code = marker.get("returncode")
    last = marker.get("last_line") or "(nothing printed)"
    if code == 0:
        return "exited", None
    return "exited", f"exited with status {code}: {last}"
