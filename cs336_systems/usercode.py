"""The user's code (a model factory, an optimizer, adapters, an attention implementation) runs inside
`guarded(what, timeout_s)`, so what it does becomes a row, never our exit status. torch-free.

    with guarded("--model-factory pkg.mod:make", timeout_s=600) as rearm:
        model = factory(...)
        for _ in steps:
            rearm()          # each step gets the whole timeout again
            step()

Inside the block:
- `sys.exit(n)` raises UserCodeError naming it;
- a KeyboardInterrupt the code raised itself (no SIGINT or SIGTERM arrived: our handlers record those or
  raise their own subclasses) raises UserCodeError; a real Ctrl-C stays a KeyboardInterrupt;
- `os._exit(n)` raises UserCodeError: os._exit is replaced inside the block for this process only
  (a process forked inside, e.g. a DataLoader worker, still exits for real);
- no return within `timeout_s` raises UserCodeTimeout (SIGALRM, main thread only). Code stuck where
  Python cannot raise (inside one C call) is ended by a watchdog thread WATCHDOG_GRACE_S later: one
  line on stderr, then the process exits with status 1 (its children die with it: lifetime).

device.failure_status makes UserCodeError an 'error' row and UserCodeTimeout a 'timeout' row.
The cost inside a timed step is one `rearm()`: a setitimer system call (about a microsecond).
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator

from . import lifetime

# No honest step, model build or import comes near these (a 2.7B-parameter training step on a CPU
# takes minutes); they exist so that a hang ends on its own.
DEFAULT_TIMEOUT_S = 3600.0
DEFAULT_IMPORT_TIMEOUT_S = 600.0
MAX_TIMEOUT_S = 7 * 24 * 3600.0  # setitimer and threading take no more; a week is past any run
WATCHDOG_GRACE_S = 30.0
REPEAT_S = 1.0  # a timeout the code caught and swallowed is raised again this often
_real_os_exit = os._exit  # guarded replaces os._exit; the watchdog must still end the process


class UserCodeError(Exception):
    """The user's code tried to end the process (sys.exit, os._exit) or raised KeyboardInterrupt itself."""


class UserCodeTimeout(Exception):
    """The user's code did not return within its time limit."""


def check_timeout(value: float, flag: str = "--timeout") -> float:
    """A time limit in seconds within (0, MAX_TIMEOUT_S]; ValueError (one line) otherwise, nan and inf too."""
    if not 0 < value <= MAX_TIMEOUT_S:
        raise ValueError(f"{flag} {_BOUNDS}, got {value:g}")
    return value


_BOUNDS = f"must be more than 0 and at most {MAX_TIMEOUT_S:g} seconds (a week)"


def timeout_seconds(text: str) -> float:
    """argparse type for --timeout: a number of seconds within check_timeout's bounds."""
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value <= MAX_TIMEOUT_S:  # argparse names the flag
        raise argparse.ArgumentTypeError(f"{_BOUNDS}, got {text}")
    return value


def _real_interrupt(exc: KeyboardInterrupt) -> bool:
    """Whether a KeyboardInterrupt is the user's Ctrl-C (or SIGTERM) rather than the code's own raise.
    Our handlers raise subclasses (lifetime.Terminated, a sweep's Abort) or record the signal (lifetime);
    under Python's own handler we cannot tell, and an interrupt must never be swallowed."""
    if type(exc) is not KeyboardInterrupt or lifetime.interrupt_received() is not None:
        return True
    return signal.getsignal(signal.SIGINT) in (signal.default_int_handler, signal.SIG_DFL, None)


def _address_space_capped() -> bool:
    """Whether this process runs under an address-space limit (memory_cap, --memory-limit)."""
    return resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY


class _Watchdog:
    """Ends the process when the deadline passed WATCHDOG_GRACE_S ago and the code has not returned."""

    def __init__(self, what: str, timeout_s: float):
        self.what, self.timeout_s = what, timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.done = threading.Event()
        if _address_space_capped():
            return  # a thread's stack and malloc arena count against --memory-limit: the alarm alone guards
        thread = threading.Thread(target=self._watch, name="cs336-user-code-watchdog", daemon=True)
        with contextlib.suppress(RuntimeError):  # no room left for a thread: the alarm alone guards
            thread.start()

    def _watch(self) -> None:
        while not self.done.wait(1.0):
            if time.monotonic() > self.deadline + WATCHDOG_GRACE_S:
                print(
                    f"error: {self.what} did not return within {self.timeout_s:g} s and cannot be interrupted "
                    "(stuck inside one native call); ending the process",
                    file=sys.stderr,
                    flush=True,
                )
                _real_os_exit(1)

    def stop(self) -> None:
        self.done.set()


@contextlib.contextmanager
def guarded(what: str, timeout_s: float | None = DEFAULT_TIMEOUT_S) -> Iterator[Callable[[], None]]:
    """Run the user's code inside; yields `rearm()`, which restarts the time limit (call it per step)."""
    owner = os.getpid()
    real_exit = os._exit  # a guard inside a guard puts back the outer one's

    def exit_instead(status: int = 0) -> None:
        if os.getpid() != owner:  # a child forked inside: its exit is its own
            _real_os_exit(status)
        raise _OsExit(status)

    timer = _Alarm(what, timeout_s) if timeout_s is not None else None
    os._exit = exit_instead
    try:
        with timer or contextlib.nullcontext():
            yield timer.rearm if timer else (lambda: None)
    except _OsExit as exc:
        raise UserCodeError(f"{what} called os._exit({exc.status})") from None
    except SystemExit as exc:
        raise UserCodeError(f"{what} called sys.exit({exc.code!r})") from None
    except KeyboardInterrupt as exc:
        if _real_interrupt(exc):
            raise
        raise UserCodeError(f"{what} raised KeyboardInterrupt itself (no Ctrl-C or SIGTERM arrived)") from None
    finally:
        os._exit = real_exit


class _OsExit(BaseException):
    def __init__(self, status: int):
        super().__init__(status)
        self.status = status


class _Alarm:
    """SIGALRM after `timeout_s`, raising UserCodeTimeout; an alarm already set (lifetime.child_preexec's
    watchdog) still goes off at its own time, and is set again on leaving."""

    def __init__(self, what: str, timeout_s: float):
        self.what, self.timeout_s = what, check_timeout(timeout_s)
        self.installed = False

    def __enter__(self) -> _Alarm:
        self.watchdog = _Watchdog(self.what, self.timeout_s)
        try:
            self.previous_handler = signal.signal(signal.SIGALRM, self._fire)
        except ValueError:  # not the main thread: only the watchdog guards
            return self
        self.installed = True
        remaining, _ = signal.setitimer(signal.ITIMER_REAL, 0)
        self.outer_deadline = time.monotonic() + remaining if remaining > 0 else None
        self.rearm()
        return self

    def rearm(self) -> None:
        now = time.monotonic()
        self.deadline = now + self.timeout_s
        self.watchdog.deadline = self.deadline
        if self.installed:
            until = self.deadline if self.outer_deadline is None else min(self.deadline, self.outer_deadline)
            signal.setitimer(signal.ITIMER_REAL, max(until - now, 1e-3), REPEAT_S)

    def _fire(self, signum, frame) -> None:
        if self.outer_deadline is not None and time.monotonic() >= self.outer_deadline - 1e-3:
            self._restore(rearm_outer=False)
            signal.raise_signal(signal.SIGALRM)  # the outer alarm's own action (usually: end the process)
            return
        raise UserCodeTimeout(f"{self.what} did not return within --timeout {self.timeout_s:g} s")

    def _restore(self, rearm_outer: bool = True) -> None:
        if not self.installed:
            return
        self.installed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.previous_handler)
        if rearm_outer and self.outer_deadline is not None:
            signal.setitimer(signal.ITIMER_REAL, max(self.outer_deadline - time.monotonic(), 1e-3))

    def __exit__(self, *exc_info) -> None:
        self.watchdog.stop()
        self._restore()
