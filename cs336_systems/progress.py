"""Progress bars that suit where stderr goes: tqdm's redrawn bar on a terminal, whole lines in a log
(a Slurm job's log, nohup.out, a handout step's log), where a bar redrawn with carriage returns is
kept as one endless line."""

from __future__ import annotations

import contextlib
import math
import os
import re
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

from tqdm import tqdm

from .terminal import show

LOG_EVERY_S = 60.0  # in a log, a line between two finished units at most this often: a long unit shows it lives
TERMINAL_EVERY_S = 10.0  # on a terminal, a slow configuration's line this often
# a sweep's parent, whose stderr is the user's, tells the child measuring a configuration how often to say it lives
HEARTBEAT_ENV = "CS336_BENCH_HEARTBEAT_S"
STILL_MEASURING = ": still measuring: "  # marks StepHeartbeat's lines, which a sweep's parent relays from its child


def progress_bar(total: int, unit: str, description: str | None = None, initial: int = 0) -> tqdm:
    """The bar every tool shows on stderr: tqdm on a terminal, LogLines elsewhere."""
    bar = tqdm if sys.stderr.isatty() else LogLines
    return bar(total=total, initial=initial, desc=description, unit=unit, file=sys.stderr, dynamic_ncols=True)


def postfix(text: str, width: int = 120) -> str:
    """`text` for a bar's postfix: a bar inside it (a step's own progress line) as its count alone, and at
    most `width` characters, cut between words."""
    text = re.sub(r":\s+\d+%\|[^|]*\|\s*(\d+/\d+)[^\]]*\]?", r" \1", text)
    return textwrap.shorten(text, width, placeholder=" ...")


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
    """A line on stderr at least every `every_s` seconds while one configuration runs (from a thread, within
    `running()`: a step or a probe may be longer): its phase or last step. `phase(doing)` also says it at
    once with `announce` (benchmark's one configuration); it is time_steps' after_step too."""

    def __init__(self, label: str, every_s: float | None = None, clock=time.monotonic, announce: bool = False):
        self.label, self.clock, self.announce = label, clock, announce
        self.every_s = every_s if every_s is not None else heartbeat_interval()
        self.started = self.last = clock()
        self.doing = "starting"
        self._lock = threading.Lock()

    def phase(self, doing: str) -> None:
        self.doing = doing
        if self.announce:
            self._say(f"{self.label}: {doing}")

    def __call__(self, kind: str, index: int, planned: int, ms: float) -> None:
        of = (
            f"of {planned}"
            if index <= planned
            else f"({planned} planned, then more until IQR/median reaches the target)"
        )
        self.doing = f"{kind} step {index} {of} took {ms / 1e3:.1f} s"
        self.beat()

    def beat(self) -> None:
        elapsed = self.clock() - self.started
        self._say(f"{self.label}{STILL_MEASURING}{self.doing} ({elapsed:.0f} s since this configuration started)", True)

    def _say(self, line: str, only_if_quiet: bool = False) -> None:
        with self._lock:  # the thread's beat and the run's own line, one at a time
            now = self.clock()
            if not only_if_quiet or now - self.last >= self.every_s:
                self.last = now
                show(line, sys.stderr)

    @contextlib.contextmanager
    def running(self) -> Iterator[StepHeartbeat]:
        stop = threading.Event()

        def beat_until_stopped() -> None:
            while not stop.wait(1.0):
                self.beat()

        thread = threading.Thread(target=beat_until_stopped, name="cs336-heartbeat", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()


def heartbeat_interval() -> float:
    """How often a slow configuration says it lives: as the sweep's parent asked (HEARTBEAT_ENV), else as
    suits this process's stderr."""
    try:
        asked = float(os.environ.get(HEARTBEAT_ENV, ""))
    except ValueError:
        asked = math.nan
    if math.isfinite(asked) and asked > 0:
        return asked
    return TERMINAL_EVERY_S if sys.stderr.isatty() else LOG_EVERY_S / 2  # a line at least once a minute


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
