"""One benchmark configuration in a fresh child process: limits, the run, the row it left.

A child cannot leave the next configuration a fragmented heap or a broken CUDA context;
a timeout kills it with all its children, and a crash is a row with its stderr's tail.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .argtypes import (
    EXIT_USAGE,
    add_memory_limit_argument,
    describe_memory_limit,
    resolve_memory_limit,
    timeout_seconds,
)
from .config import BenchmarkConfig
from .device import resolve_device
from .errors import UsageError
from .factory import check_user_model, count_parameters_for
from .lifetime import child_preexec, exit_with, temporary_directory
from .progress import HEARTBEAT_ENV, HeartbeatRelay, heartbeat_interval
from .results import ENVIRONMENT_FIELDS, BenchmarkRecord, Environment, collect_environment
from .tools import module_name
from .user_model import ModelFactoryError


def failed_record(
    config: BenchmarkConfig, env: Environment | None, status: str, error: str, num_params: int | None
) -> BenchmarkRecord:
    """A row for a configuration that produced none of its own (timeout, crash, a model that could not be built)."""
    record = BenchmarkRecord.for_config(config, torch.device(config.device), env, num_params)
    record.status, record.error = status, error
    return record


@dataclass(frozen=True)
class ChildLimits:
    timeout_s: float | None = None
    memory_limit_bytes: int | None = None  # CPU address-space headroom (cs336_systems.memory_cap)

    def annotate(self, record: BenchmarkRecord) -> BenchmarkRecord:
        """A row measured under a memory cap says so: its OOM is the cap's, not the machine's."""
        if self.memory_limit_bytes is not None:
            cap = describe_memory_limit(self.memory_limit_bytes)
            record.notes = f"{record.notes}; {cap}" if record.notes else cap
        return record


def add_child_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("child processes")
    group.add_argument(
        "--timeout",
        type=timeout_seconds,
        metavar="SECONDS",
        help="per configuration; status 'timeout' (at most a week)",
    )
    add_memory_limit_argument(
        group,
        help="CPU only: each child may allocate this much beyond torch's own libraries (e.g. 8GiB), "
        "through an address-space cap: emulates a smaller machine, OOMs become rows",
    )


def child_limits_from_args(args: argparse.Namespace, device: torch.device) -> ChildLimits:
    limit = resolve_memory_limit(args.memory_limit, device.type)
    if args.timeout is not None and not 0 < args.timeout < math.inf:  # nan and inf too
        raise UsageError(f"--timeout must be positive, got {args.timeout}")
    return ChildLimits(timeout_s=args.timeout, memory_limit_bytes=limit)


def benchmark_arguments(config: BenchmarkConfig, limits: ChildLimits) -> list[str]:
    """`python -m` arguments that run `config` alone (under the memory cap): the configuration
    is handed over as data (BenchmarkConfig.to_dict), not rebuilt from flags."""
    cap = [] if limits.memory_limit_bytes is None else [module_name("memory_cap"), str(limits.memory_limit_bytes)]
    return [*cap, module_name("benchmark"), "--config", json.dumps(config.to_dict())]


def benchmark_command(config: BenchmarkConfig, limits: ChildLimits) -> str:
    """The shell command that runs `config` alone as a sweep's child does, to copy and paste."""
    return shlex.join(["python", "-m", *benchmark_arguments(config, limits)])


STDERR_TAIL_LINES = 8
# the child's own alarm goes off this long after the parent's --timeout, so the parent's
# timeout row wins while the parent lives, and a child outliving its parent still ends
WATCHDOG_GRACE_S = 5.0


def run_in_child(config: BenchmarkConfig, limits: ChildLimits, env: Environment | None = None) -> BenchmarkRecord:
    """Run `benchmark` for one configuration in a fresh process (its own session, so a
    terminal Ctrl-C does not reach it, and a timeout kills it with all its children).

    The row is the child's own (with its environment). `env` goes into the rows of a
    child that wrote none (timeout, crash); when it is None it is collected here only
    then, so a parent driving CUDA children does not hold a CUDA context of its own.

    The child dies with this process (lifetime.child_preexec), and by its own alarm
    WATCHDOG_GRACE_S after --timeout."""
    with temporary_directory("child") as tmp:
        output = Path(tmp) / "row.jsonl"
        # Never the user's factory here: it may be what hangs or crashes (the child counts it).
        num_params = None if config.model_factory else count_parameters_for(config.model)
        command = [sys.executable, "-m", *benchmark_arguments(config, limits), "--output", str(output)]
        # what the parent can import (a user's --model-factory module), the child can too
        variables = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        variables[HEARTBEAT_ENV] = str(heartbeat_interval())  # its stderr is a file; ours may be a terminal
        watchdog = None if limits.timeout_s is None else limits.timeout_s + WATCHDOG_GRACE_S
        # stderr to a file, not a pipe: a process the user's code starts inherits it, and a pipe would
        # stay open (no end of file) for as long as that process lives
        with open(Path(tmp) / "stderr.txt", "w+") as stderr_file:
            process = subprocess.Popen(
                command,
                stdout=subprocess.DEVNULL,
                stderr=stderr_file,
                text=True,
                env=variables,
                start_new_session=True,
                preexec_fn=child_preexec(watchdog),
            )
            try:
                _wait_relaying(process, limits.timeout_s, HeartbeatRelay(stderr_file.name))
            except subprocess.TimeoutExpired:
                _kill_group(process)
                env = env or collect_environment(torch.device(config.device))
                return failed_record(
                    config, env, "timeout", f"no result within --timeout {limits.timeout_s:g} s", num_params
                )
            except BaseException:
                _kill_group(process)
                raise
            _kill_group(process)  # what the user's code started in the child (a helper process) ends with it
            stderr_file.seek(0)
            stderr = stderr_file.read()
        if output.exists() and output.stat().st_size:
            return limits.annotate(record_from_row(json.loads(output.read_text().splitlines()[-1])))
        tail = " | ".join(stderr.strip().splitlines()[-STDERR_TAIL_LINES:])
        code = process.returncode
        how = f"killed by signal {_signal_name(-code)}" if code < 0 else f"exited with status {code}"
        if code == -signal.SIGKILL:
            how += " (the Linux OOM killer sends this)"
        env = env or collect_environment(torch.device(config.device))
        error = f"child {how}: {tail or '(nothing on stderr)'}"
        return limits.annotate(failed_record(config, env, "error", error, num_params))


def _wait_relaying(process: subprocess.Popen, timeout_s: float | None, relay: HeartbeatRelay) -> None:
    """process.wait(timeout_s), passing on the child's lines that say a slow configuration lives, once a second."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise subprocess.TimeoutExpired(process.args, timeout_s)
        try:
            process.wait(timeout=1.0 if left is None else min(1.0, left))
            return
        except subprocess.TimeoutExpired:
            relay.relay()


def check_user_model_in_child(config: BenchmarkConfig) -> None:
    """factory.check_user_model of `config`'s --model-factory in a child process (a sweep keeps the
    user's code out of its own process, where a crash would end the sweep): the child's one line as a
    ModelFactoryError, or nothing where the child could not say (it crashed: each row will)."""
    code = f"from {module_name('child')} import check_model_main; check_model_main()"
    variables = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    with temporary_directory("child") as tmp, open(Path(tmp) / "stderr.txt", "w+") as stderr_file:
        process = subprocess.Popen(  # stderr to a file: a helper process the model starts keeps a pipe open
            [sys.executable, "-c", code, json.dumps(config.to_dict())],
            stdout=subprocess.DEVNULL,
            stderr=stderr_file,
            env=variables,
            start_new_session=True,
            preexec_fn=child_preexec(),
        )
        try:
            process.wait()
        finally:
            _kill_group(process)
        stderr_file.seek(0)
        lines = stderr_file.read().strip().splitlines()
    if process.returncode == EXIT_USAGE and lines:
        raise ModelFactoryError(lines[-1])


def check_model_main() -> None:
    """The child of check_user_model_in_child: exit status 2 and the one line, or 0."""
    config = BenchmarkConfig.from_dict(json.loads(sys.argv[1]))
    try:
        check_user_model(config.model, config.model_factory, resolve_device(config.device))
    except UsageError as exc:
        print(exc, file=sys.stderr, flush=True)
        exit_with(lambda: EXIT_USAGE)
    exit_with(lambda: 0)  # whatever the model left running (a thread, an exit hook)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _kill_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def record_from_row(row: dict, record_type: type = BenchmarkRecord):
    """The child's JSONL line back into a record, environment and raw samples included."""
    names = {f.name for f in dataclasses.fields(record_type)} - {"environment"}
    record = record_type(**{name: row[name] for name in names if name in row})
    record.environment = Environment(**{name: row.get(name) for name in ENVIRONMENT_FIELDS})
    return record
