"""python -m cs336_systems.monitor: run a command and sample it."""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from ..argtypes import EXIT_FAILED, ArgumentParser, non_negative_int, positive_float, timeout_seconds
from ..command import Command
from ..errors import UsageError
from ..lifetime import child_preexec
from ..terminal import show
from ..tools import prog
from .files import SampleCsvWriter, check_monitor_path, report_text, write_report
from .sampling import DEFAULT_INTERVAL_S, GpuProbe, ResourceMonitor

PROG = prog("monitor")


def _wait_without_reaping(process: subprocess.Popen) -> None:
    """Block until the child exits but leave it a zombie, so its CPU times can still be read."""
    if hasattr(os, "waitid"):
        while True:
            try:
                os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)
                return
            except InterruptedError:
                continue
            except ChildProcessError:
                return
    process.wait()


KILL_GRACE_S = 10.0  # --kill-grace's default: after a SIGTERM, how long the command has to end before SIGKILL


def _kill(process: subprocess.Popen) -> None:
    """SIGKILL the command; it is not reaped yet (its CPU times are read first), so the pid is still its."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGKILL)


def exit_status(returncode: int) -> int:
    """A shell's convention: killed by signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def run_monitored(
    command: Sequence[str], csv_path: Path, interval_s: float, gpu_indices=None, kill_grace_s: float = KILL_GRACE_S
) -> int:
    writer = SampleCsvWriter(csv_path)
    try:
        # the command dies with the monitor, even a SIGKILLed one (nothing left unmeasured)
        process = subprocess.Popen(list(command), preexec_fn=child_preexec())
    except OSError as exc:  # not a program (e.g. exec format error): nothing was run
        writer.close()
        csv_path.unlink(missing_ok=True)
        raise UsageError(f"cannot run {command[0]}: {exc.strerror}") from None
    # Ctrl-C reaches the command (same process group); the monitor waits for it to finish. SIGTERM is
    # passed on, and a command still running kill_grace_s later is killed (it ignores SIGTERM).
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT,)}
    killer: list[threading.Timer] = []

    def forward(signum, frame) -> None:
        process.send_signal(signum)
        if not killer:
            killer.append(threading.Timer(kill_grace_s, _kill, (process,)))
            killer[0].daemon = True
            killer[0].start()

    previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, forward)
    try:
        monitor = ResourceMonitor(interval_s, root_pid=process.pid, gpu_indices=gpu_indices, on_sample=writer)
        with monitor:
            _wait_without_reaping(process)
        returncode = process.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for timer in killer:
            timer.cancel()
        writer.close()
    status = exit_status(returncode)
    unwritten = [writer.error] if writer.error is not None else []
    report = write_report(monitor, csv_path, shlex.join(command), status, unwritten)
    show(report_text(report, csv_path), sys.stderr)  # the summary, whatever a full disk kept from the files
    for exc in unwritten:  # a full disk: one line per file
        show(f"{PROG}: error: {exc.strerror}", sys.stderr)
    return status or (EXIT_FAILED if unwritten else 0)


def check_command(name: str) -> None:
    """Refuse a command that cannot start, before any file is made (as a shell would find it)."""
    if shutil.which(name) is not None:
        return
    path = Path(name)
    if os.sep in name and path.exists():
        what = "a directory" if path.is_dir() else "not executable"
        raise UsageError(f"cannot run {name}: {what}")
    raise UsageError(f"command not found: {name}")


class CommandLineParser(ArgumentParser):
    """The monitor's flags, then `--` and the command it runs (args.command): everything after the
    first `--` is the command's own, even words that look like the monitor's flags."""

    def parse_known_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        split = args.index("--") if "--" in args else len(args)
        namespace, extras = super().parse_known_args(args[:split], namespace)
        namespace.command = args[split + 1 :]
        return namespace, extras


def build_parser() -> ArgumentParser:
    parser = CommandLineParser(
        prog=PROG,
        description="Run a command and sample GPU, CPU, memory, network and disk on one clock.",
        usage=f"{PROG} [--monitor-interval S] [--output PATH.csv] [--gpus I ...] [--kill-grace S] -- COMMAND [ARGS...]",
    )
    parser.add_argument(
        "--monitor-interval",
        "--interval",
        dest="interval",
        type=positive_float,
        default=DEFAULT_INTERVAL_S,
        metavar="SECONDS",
        help="seconds between samples",
    )
    parser.add_argument(
        "--output", help="time series CSV (default monitor-YYYYmmdd-HHMMSS.csv); .png and .json beside it"
    )
    parser.add_argument(
        "--kill-grace",
        type=timeout_seconds,
        default=KILL_GRACE_S,
        metavar="SECONDS",
        help="after a SIGTERM, how long the command has to end before it is killed (a loop that saves a "
        "checkpoint on SIGTERM may need longer)",
    )
    parser.add_argument(
        "--gpus",
        "--gpu",
        type=non_negative_int,
        nargs="+",
        metavar="I",
        help="NVML indices (default: those in CUDA_VISIBLE_DEVICES, else the current device, 0)",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    if not args.command:
        raise UsageError("no command to run: put it after --, e.g. -- python train.py")
    check_command(args.command[0])
    csv_path = check_monitor_path(args.output or time.strftime("monitor-%Y%m%d-%H%M%S.csv"), "--output")
    if args.gpus is not None:
        GpuProbe(args.gpus)
    return run_monitored(args.command, csv_path, args.interval, args.gpus, args.kill_grace)


main = Command(build_parser, run)
