"""What a job runs around its command: step.log for its output, started.json when it starts, exit.json
when it ends (exit status, whether the job's --timeout ended it, the log's last line).

The same markers three ways: inside a Slurm job (StepFunction, which submitit pickles by reference and
calls on the node), as a local worker and from the --dry-run script submitted by hand:

    python -m cs336_systems.executor.step ATTEMPT_DIR [--timeout SECONDS] -- COMMAND...

torch-free, so a job's own start costs a fraction of a second. The markers are written whole (a rename),
so a reader sees one or none.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..lifetime import child_preexec
from ..placement import placement, visible_gpus
from .jobs import EXITED, STARTED, STEP_LOG, Attempt, utc_timestamp

TERMINATE_GRACE_S = 10.0  # after SIGTERM the command may write its last row (a sweep's tool does)


def write_marker(path: Path, value: dict) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(value, default=str) + "\n")
    os.replace(temporary, path)


def run_step(
    directory: Path, command: Sequence[str], timeout_s: float | None = None, env: Mapping[str, str] | None = None
) -> int:
    """Run `command` with its output in DIRECTORY/step.log, between the two markers; its exit status (or
    128 + the signal that ended it). SIGTERM (scancel, a local worker stopped) is passed on to it."""
    directory.mkdir(parents=True, exist_ok=True)
    ranks = rank_variables()
    variables = {**os.environ, **(env or {}), **ranks}
    per_node = int(ranks.get("LOCAL_WORLD_SIZE", 1))
    cores = variables.get("SLURM_CPUS_PER_TASK") or int(variables.get("SLURM_CPUS_ON_NODE") or 0) // per_node
    if cores and not variables.get("OMP_NUM_THREADS"):
        variables["OMP_NUM_THREADS"] = str(cores)  # torch's threads: the cores Slurm gave the task, not the node's
    if ranks.get("RANK", "0") != "0":  # another rank of a job of several tasks: its own log, no markers
        with open(directory / f"rank{ranks['RANK']}.{STEP_LOG}", "ab") as log:
            return subprocess.run(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=variables
            ).returncode
    where = placement("cuda" if visible_gpus(variables) else None, 0, variables)
    write_marker(
        directory / STARTED,
        {
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            **where,
            "gpus": visible_gpus(variables),
            "time": utc_timestamp(),
        },
    )
    timed_out, terminated = False, None
    with open(directory / STEP_LOG, "ab") as log:
        process = subprocess.Popen(
            list(command),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=variables,
            start_new_session=True,
            preexec_fn=child_preexec(),
        )

        def pass_on(signum, frame):
            nonlocal terminated
            terminated = signal.Signals(signum).name
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)

        previous = signal.signal(signal.SIGTERM, pass_on)
        try:
            try:
                code = process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(process)
                code = process.wait()
            if terminated:
                try:
                    code = process.wait(timeout=TERMINATE_GRACE_S)
                except subprocess.TimeoutExpired:
                    _kill_group(process)
                    code = process.wait()
        finally:
            signal.signal(signal.SIGTERM, previous)
            _kill_group(process)  # what the command left running ends with it
    code = 128 - code if code < 0 else code
    attempt = Attempt(directory.parent.name, directory.name, directory, where["executor"])
    write_marker(
        directory / EXITED,
        {
            "returncode": code,
            "timed_out": timed_out,
            "timeout_s": timeout_s,
            "terminated_by": terminated,
            "last_line": attempt.log_tail(),
            "time": utc_timestamp(),
        },
    )
    return code


def rank_variables() -> dict[str, str]:
    """In a Slurm job of several tasks (a distributed tool's): torchrun's variables for this task, from Slurm's
    (submitit's TorchDistributedEnvironment: MASTER_ADDR the first node of SLURM_JOB_NODELIST, MASTER_PORT
    drawn from the job id, RANK = SLURM_PROCID); none in a job of one task."""
    if int(os.environ.get("SLURM_NTASKS") or 1) < 2 or "SLURM_PROCID" not in os.environ:
        return {}
    from submitit.helpers import TorchDistributedEnvironment

    os.environ.setdefault("SUBMITIT_EXECUTOR", "slurm")  # the job environment it reads
    ranks = TorchDistributedEnvironment()
    names = ("master_addr", "master_port", "rank", "world_size", "local_rank", "local_world_size")
    return {name.upper(): str(getattr(ranks, name)) for name in names}


def _kill_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


@dataclass(frozen=True)
class StepFunction:
    """The callable submitit runs in a Slurm job: the step, then its exit status as the job's result."""

    directory: str
    command: tuple[str, ...]
    timeout_s: float | None = None
    env: dict = field(default_factory=dict)

    def __call__(self) -> int:
        return run_step(Path(self.directory), self.command, self.timeout_s, self.env)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m cs336_systems.executor.step", description=__doc__.split("\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--timeout", type=float, metavar="SECONDS")
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        parser.error("give the command after --")
    split = argv.index("--")  # the command's own words are never ours, whatever they look like
    args = parser.parse_args(argv[:split])
    return run_step(args.directory, argv[split + 1 :], args.timeout)


if __name__ == "__main__":
    sys.exit(main())
