"""Progress bars that suit where stderr goes: tqdm's redrawn bar on a terminal, whole lines in a log
(a Slurm job's log, nohup.out, a handout step's log), where a bar redrawn with carriage returns is
kept as one endless line."""

from __future__ import annotations

import math
import os
import sys
import time

from tqdm import tqdm

LOG_EVERY_S = 60.0  # in a log, a line between two finished units at most this often: a long unit shows it lives
TERMINAL_EVERY_S = 10.0  # on a terminal, a slow configuration's line this often
# a sweep's parent, whose stderr is the user's, tells the child measuring a configuration how often to say it lives
HEARTBEAT_ENV = "CS336_BENCH_HEARTBEAT_S"
STILL_MEASURING = ": still measuring: "  # marks StepHeartbeat's lines, which a sweep's parent relays from its child


def progress_bar(total: int, unit: str, description: str | None = None, initial: int = 0) -> tqdm:
    """The bar every tool shows on stderr: tqdm on a terminal, LogLines elsewhere."""
    bar = tqdm if sys.stderr.isatty() else LogLines
    return bar(total=total, initial=initial, desc=description, unit=unit, file=sys.stderr, dynamic_ncols=True)


class LogLines(tqdm):
    """tqdm as whole lines: one when a unit finishes (and at the start and end), and between two,
    a new description or postfix at most once every LOG_EVERY_S seconds."""

    _line_open = False  # the last line printed has no newline yet: the next line or the end gives it one
    _printed_n: float | None = None
    _printed_at = -math.inf

    def __init__(self, *args, **kwargs):
        super().__init__(*args, mininterval=0, **kwargs)

    def status_printer(self, file):  # tqdm calls self.status_printer(self.fp): a method, not tqdm's staticmethod
        def print_line(text: str) -> None:
            if not text.strip():
                return
            if self._line_open:
                file.write("\n")
            file.write(text.rstrip())
            file.flush()
            self._line_open = True

        return print_line

    def refresh(self, nolock=False, lock_args=None):
        now = time.monotonic()
        if self.n == self._printed_n and now - self._printed_at < LOG_EVERY_S:
            return False
        self._printed_n, self._printed_at = self.n, now
        return super().refresh(nolock=nolock, lock_args=lock_args)

    def clear(self, nolock=False):
        """Before tqdm.write's line: end the open line (a terminal bar would be erased)."""
        if self._line_open:
            self.fp.write("\n")
            self._line_open = False

    def close(self):
        if not self.disable and self._printed_n == self.n:
            self.sp = lambda text: None  # tqdm's close draws the last state again: its line is already there
        super().close()


class StepHeartbeat:
    """While one configuration's steps run long (a large model on a CPU), a line on stderr now and
    then: which step ended and how long it took. A configuration that ends within `every_s` says
    nothing. Called between timed steps, never inside one."""

    def __init__(self, label: str, every_s: float | None = None, clock=time.monotonic):
        self.label, self.clock = label, clock
        self.every_s = every_s if every_s is not None else heartbeat_interval()
        self.started = self.last = clock()

    def __call__(self, kind: str, index: int, planned: int, ms: float) -> None:
        now = self.clock()
        if now - self.last < self.every_s:
            return
        self.last = now
        of = (
            f"of {planned}"
            if index <= planned
            else f"({planned} planned, then more until IQR/median reaches the target)"
        )
        print(
            f"{self.label}{STILL_MEASURING}{kind} step {index} {of} took {ms / 1e3:.1f} s "
            f"({now - self.started:.0f} s since this configuration's first step)",
            file=sys.stderr,
            flush=True,
        )


def heartbeat_interval() -> float:
    """How often a slow configuration says it lives: as the sweep's parent asked (HEARTBEAT_ENV), else as
    suits this process's stderr."""
    try:
        asked = float(os.environ.get(HEARTBEAT_ENV, ""))
    except ValueError:
        asked = math.nan
    if math.isfinite(asked) and asked > 0:
        return asked
    return TERMINAL_EVERY_S if sys.stderr.isatty() else LOG_EVERY_S


class HeartbeatRelay:
    """A sweep's parent, waiting for the child that measures one configuration: the child's StepHeartbeat
    lines, read from its stderr file as they come (through a handle of our own: the child's shares its
    file offset with the one it was given), written on our stderr above any progress bar."""

    def __init__(self, path):
        self.path, self.offset = path, 0

    def relay(self) -> None:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                text = handle.read()
        except OSError:
            return
        complete = text[: text.rfind(b"\n") + 1]  # a line still being written waits for the next look
        self.offset += len(complete)
        for line in complete.decode(errors="replace").splitlines():
            if STILL_MEASURING in line:
                tqdm.write(line.strip(), file=sys.stderr)
