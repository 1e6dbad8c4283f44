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
  raise their own subclasses, lifetime.OurInterrupt) raises UserCodeError, a subclass of its own too;
  a real Ctrl-C stays a KeyboardInterrupt;
- any other BaseException (GeneratorExit, a class of the user's own) raises UserCodeError;
- `os._exit(n)` raises UserCodeError: os._exit is replaced inside the block for this process only
  (a process forked inside, e.g. a DataLoader worker, still exits for real); a process the code forked
  that comes back out of the block ends there, so only the process that started writes rows;
- our SIGINT, SIGTERM and SIGALRM handlers are put back at each rearm() and on leaving, so a handler
  the code installed cannot make the tool unstoppable; inside, signal.signal cannot replace them;
- no return within the time limit raises UserCodeTimeout (SIGALRM, main thread only). The limit is
  `timeout_s` seconds (a user's --timeout), or by default StepLimits: FIRST_STEP_TIMEOUT_S up to the end
  of the first step (torch.compile can take minutes), then LATER_STEP_FACTOR times the step before
  (at least LATER_STEP_FLOOR_S). Imports and adapter getters get import_limit_s(): the command's --timeout,
  inherited by the processes it starts, else DEFAULT_IMPORT_TIMEOUT_S. The limit does not rest on the alarm
  alone: code that cancels it (signal.alarm(0)) gets SIGALRM from the watchdog thread NUDGE_S late. Code stuck
  where Python cannot raise (inside one C call) is ended WATCHDOG_GRACE_S later: one line on stderr,
  then the process exits with status 1 (a watchdog thread), or, under an address-space cap where no
  thread fits, is killed by the reaper (reaper.py), which also ends every helper process the code left.

device.failure_status makes UserCodeError an 'error' row and UserCodeTimeout a 'timeout' row.
The cost inside a timed step is one `rearm()`: a setitimer system call (about a microsecond).
"""

from __future__ import annotations

import contextlib
import math
import os
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from . import lifetime, process_state, reaper


class DefaultLimit(float):
    """A limit in seconds the user did not set (not their --timeout): its message says so."""


# No honest import or getter comes near this; it exists so that a hang ends on its own, soon.
DEFAULT_IMPORT_TIMEOUT_S = DefaultLimit(60.0)
# A model build and first step (a 2.7B-parameter training step on a CPU takes minutes, a compile too),
# then each later step against the one before it.
FIRST_STEP_TIMEOUT_S = 1800.0
LATER_STEP_FACTOR = 10.0
LATER_STEP_FLOOR_S = 60.0
MAX_TIMEOUT_S = 7 * 24 * 3600.0  # setitimer and threading take no more; a week is past any run
WATCHDOG_GRACE_S = 10.0
REPEAT_S = 1.0  # a timeout the code caught and swallowed is raised again this often
NUDGE_S = 1.0  # past the deadline by this, the watchdog sends the alarm itself (the code may have cancelled ours)
_real_os_exit = os._exit  # guarded replaces os._exit; the watchdog must still end the process
_real_signal = signal.signal  # and signal.signal; our alarm installs its handler with the real one


@dataclass(frozen=True)
class StepLimits:
    """The default time limit of code run in steps: `first_s` until the first step has been measured
    (from entering the block to the second rearm), then `factor` times the step before, at least `floor_s`."""

    first_s: float = FIRST_STEP_TIMEOUT_S
    factor: float = LATER_STEP_FACTOR
    floor_s: float = LATER_STEP_FLOOR_S

    def limit_s(self, last_step_s: float | None) -> float:
        return self.first_s if last_step_s is None else max(self.floor_s, self.factor * last_step_s)

    def __str__(self) -> str:  # what --help shows as the default
        return (
            f"{self.first_s / 60:g} min for the build and first step, then {self.factor:g}x the step before "
            f"(at least {self.floor_s:g} s)"
        )


DEFAULT_TIMEOUT = StepLimits()


# The command's limit on importing the user's code where the user set one (--timeout), for every
# process it starts too (spawned ranks, a sweep's children read it from their environment).
IMPORT_TIMEOUT_ENV = "CS336_BENCH_IMPORT_TIMEOUT"


def import_limit_s() -> float:
    """The limit in force on importing the user's code (and on an adapter's getter): the --timeout of this
    command or of the one that started it (IMPORT_TIMEOUT_ENV), else DEFAULT_IMPORT_TIMEOUT_S."""
    try:
        value = float(os.environ.get(IMPORT_TIMEOUT_ENV, "nan"))
    except ValueError:
        value = math.nan
    return value if 0 < value <= MAX_TIMEOUT_S else DEFAULT_IMPORT_TIMEOUT_S


@contextlib.contextmanager
def import_limit(timeout: float | StepLimits | None) -> Iterator[None]:
    """Inside, import_limit_s() is `timeout` where the user gave a number (their --timeout), in this process
    and in every process started inside; the limit before is put back on leaving."""
    saved = os.environ.get(IMPORT_TIMEOUT_ENV)
    if isinstance(timeout, float | int) and not isinstance(timeout, DefaultLimit):
        os.environ[IMPORT_TIMEOUT_ENV] = repr(float(timeout))
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(IMPORT_TIMEOUT_ENV, None)
        else:
            os.environ[IMPORT_TIMEOUT_ENV] = saved


class UserCodeError(Exception):
    """The user's code tried to end the process (sys.exit, os._exit) or raised KeyboardInterrupt itself."""


class UserCodeTimeout(Exception):
    """The user's code did not return within its time limit."""


class _Expired(BaseException):
    """UserCodeTimeout inside the block: the code's own `except Exception` cannot swallow it."""


def check_timeout(value: float, flag: str = "--timeout") -> float:
    """A time limit in seconds within (0, MAX_TIMEOUT_S]; ValueError (one line) otherwise, nan and inf too."""
    if not 0 < value <= MAX_TIMEOUT_S:
        raise ValueError(f"{flag} {TIMEOUT_BOUNDS}, got {value:g}")
    return value


TIMEOUT_BOUNDS = f"must be more than 0 and at most {MAX_TIMEOUT_S:g} seconds (a week)"


def _real_interrupt(exc: KeyboardInterrupt) -> bool:
    """Whether a KeyboardInterrupt is the user's Ctrl-C (or SIGTERM) rather than the code's own raise.
    Our handlers raise lifetime.OurInterrupt (Terminated, a sweep's Abort) or record the signal; under
    Python's own handler we cannot tell a plain KeyboardInterrupt apart, and an interrupt must never be
    swallowed, but a subclass of the code's own is the code's."""
    if isinstance(exc, lifetime.OurInterrupt) or lifetime.interrupt_received() is not None:
        return True
    if type(exc) is not KeyboardInterrupt:
        return False
    return signal.getsignal(signal.SIGINT) in (signal.default_int_handler, signal.SIG_DFL, None)


def _address_space_capped() -> bool:
    """Whether this process runs under an address-space limit (memory_cap, --memory-limit)."""
    return resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY


class _Watchdog:
    """Ends the process when the deadline passed WATCHDOG_GRACE_S ago and the code has not returned:
    a thread of ours, or under an address-space cap (where a thread's stack and malloc arena count
    against --memory-limit) the reaper process."""

    def __init__(self, what: str, nudge: Callable[[], None]):
        self.what, self.limit_s, self.nudge = what, 0.0, nudge
        self.deadline = math.inf
        self.done = threading.Event()
        self.by_reaper = _address_space_capped()
        if self.by_reaper:
            return
        thread = threading.Thread(target=self._watch, name="cs336-user-code-watchdog", daemon=True)
        with contextlib.suppress(RuntimeError):  # no room left for a thread: the alarm alone guards
            thread.start()

    def message(self) -> str:
        return (
            f"error: {self.what} did not return within {self.limit_s:g} s and could not be interrupted (stuck in "
            "one native call, or blocking or catching every interrupt); ending the process"
        )

    def set(self, deadline: float, limit_s: float) -> None:
        self.deadline, self.limit_s = deadline, limit_s
        if self.by_reaper:
            reaper.arm(deadline + WATCHDOG_GRACE_S, self.message())

    def _watch(self) -> None:
        with contextlib.suppress(ValueError, OSError):  # the alarm is the main thread's to receive
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        while not self.done.wait(min(1.0, max(0.05, self.deadline + NUDGE_S - time.monotonic()))):
            late_s = time.monotonic() - self.deadline
            if late_s > WATCHDOG_GRACE_S:
                print(self.message(), file=sys.stderr, flush=True)
                _real_os_exit(1)
            if late_s > NUDGE_S:
                self.nudge()

    def stop(self) -> None:
        self.done.set()
        if self.by_reaper:
            reaper.disarm()


_OUR_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _restore_handlers(handlers: dict) -> None:
    """Put back the handlers the block was entered with, where the user's code replaced them, and
    unblock the signals it may have blocked (main thread only)."""
    for sig, handler in handlers.items():
        if signal.getsignal(sig) is not handler:
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, handler)
    with contextlib.suppress(ValueError, OSError):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, (*handlers, signal.SIGALRM))


@contextlib.contextmanager
def guarded(
    what: str, timeout_s: float | StepLimits | None = DEFAULT_TIMEOUT, changed: dict | None = None
) -> Iterator[Callable[[], None]]:
    """Run the user's code inside; yields `rearm()`, which starts the next step's time limit (call it
    at the start of each step). `timeout_s`: seconds per step (a user's --timeout), StepLimits, or None.
    `changed` gets the process settings the code changed, each put back on leaving (process_state.kept)."""
    owner = os.getpid()
    real_exit = os._exit  # a guard inside a guard puts back the outer one's
    handlers = {sig: signal.getsignal(sig) for sig in _OUR_SIGNALS}
    handlers = {sig: handler for sig, handler in handlers.items() if handler is not None}
    reaper.start()  # a helper process the code starts and abandons ends with us

    def exit_instead(status: int = 0) -> None:
        if os.getpid() != owner:  # a child forked inside: its exit is its own
            _real_os_exit(status)
        raise _OsExit(status)

    timer = _Alarm(what, timeout_s, lambda: _restore_handlers(handlers)) if timeout_s is not None else None
    os._exit = exit_instead
    real_signal = signal.signal
    signal.signal = _keeping(handlers, real_signal, timer)
    try:
        with process_state.kept({} if changed is None else changed), timer or contextlib.nullcontext():
            yield timer.rearm if timer else (lambda: None)
    except _OsExit as exc:
        raise UserCodeError(f"{what} called os._exit({exc.status})") from None
    except SystemExit as exc:
        raise UserCodeError(f"{what} called sys.exit({exc.code!r})") from None
    except _Expired as exc:
        raise UserCodeTimeout(str(exc)) from None
    except KeyboardInterrupt as exc:
        if _real_interrupt(exc):
            raise
        kind = "KeyboardInterrupt" if type(exc) is KeyboardInterrupt else f"{type(exc).__name__} (a KeyboardInterrupt)"
        raise UserCodeError(f"{what} raised {kind} itself (no Ctrl-C or SIGTERM arrived)") from None
    except Exception:
        raise
    except BaseException as exc:  # GeneratorExit, a BaseException of the code's own: its row's error
        try:
            text = " ".join(str(exc).split())  # one line
        except Exception:  # a __str__ of the code's own that raises
            text = ""
        raise UserCodeError(
            f"{what} raised {type(exc).__name__} (a BaseException, not an Exception): {text}".rstrip(": ")
        ) from None
    finally:
        os._exit = real_exit
        signal.signal = real_signal
        if os.getpid() != owner:  # a process the code forked came back out here: it must not go on as us
            _real_os_exit(0)
        _restore_handlers(handlers)


def _keeping(handlers: dict, real_signal: Callable, timer: _Alarm | None) -> Callable:
    """signal.signal inside the block: the code may install any handler but ours for SIGINT and SIGTERM
    (one that ignores them would make the tool unstoppable) and, while our alarm is set, SIGALRM (one that
    ignores it would lift the time limit); those calls are no-ops returning ours."""

    def install(signum, handler):
        if signum == signal.SIGALRM and timer is not None and timer.installed:
            return timer._fire
        if signum in handlers:
            return (
                real_signal(signum, handlers[signum])
                if signal.getsignal(signum) is not handlers[signum]
                else handlers[signum]
            )
        return real_signal(signum, handler)

    return install


class _OsExit(BaseException):
    def __init__(self, status: int):
        super().__init__(status)
        self.status = status


class _Alarm:
    """SIGALRM at the limit, raising UserCodeTimeout; an alarm already set (lifetime.child_preexec's
    watchdog) still goes off at its own time, and is set again on leaving."""

    def __init__(self, what: str, timeout: float | StepLimits, restore: Callable[[], None]):
        self.what, self.restore, self.owner = what, restore, os.getpid()
        self.limits = timeout if isinstance(timeout, StepLimits) else None
        self.fixed_s = None if self.limits else check_timeout(timeout)
        self.step_started: float | None = None
        self.last_step_s: float | None = None
        self.installed = False
        self.lock = threading.RLock()  # the watchdog's nudge never lands after _restore put the handler back

    @property
    def timeout_s(self) -> float:
        return self.fixed_s if self.limits is None else self.limits.limit_s(self.last_step_s)

    def __enter__(self) -> _Alarm:
        self.watchdog = _Watchdog(self.what, self._nudge)
        try:
            self.previous_handler = _real_signal(signal.SIGALRM, self._fire)
        except ValueError:  # not the main thread: only the watchdog guards
            self._arm()
            return self
        self.installed = True
        remaining, _ = signal.setitimer(signal.ITIMER_REAL, 0)
        self.outer_deadline = time.monotonic() + remaining if remaining > 0 else None
        self._arm()
        return self

    def rearm(self) -> None:
        """A step starts: the one before it is measured (StepLimits), the limit starts again."""
        if os.getpid() != self.owner:  # a process the code forked, running our steps: it must not go on as us
            _real_os_exit(0)
        now = time.monotonic()
        if self.step_started is not None:
            self.last_step_s = now - self.step_started
        self.step_started = now
        if self.installed:
            self.restore()
            if signal.getsignal(signal.SIGALRM) is not self._fire:  # the code replaced ours
                _real_signal(signal.SIGALRM, self._fire)
        self._arm(now)

    def _arm(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self.deadline = now + self.timeout_s
        self.watchdog.set(self.deadline, self.timeout_s)
        if self.installed:
            until = self.deadline if self.outer_deadline is None else min(self.deadline, self.outer_deadline)
            signal.setitimer(signal.ITIMER_REAL, max(until - now, 1e-3), REPEAT_S)

    def _nudge(self) -> None:
        """The watchdog thread's: the deadline passed and the code is still inside (it cancelled our alarm)."""
        with self.lock, contextlib.suppress(OSError, ValueError):
            if self.installed:
                signal.pthread_kill(threading.main_thread().ident, signal.SIGALRM)

    def _fire(self, signum, frame) -> None:
        if self.outer_deadline is not None and time.monotonic() >= self.outer_deadline - 1e-3:
            self._restore(rearm_outer=False)
            signal.raise_signal(signal.SIGALRM)  # the outer alarm's own action (usually: end the process)
            return
        if (early_s := self.deadline - time.monotonic()) > 1e-3:  # the code's own signal.alarm(n): ours again
            until = early_s if self.outer_deadline is None else min(early_s, self.outer_deadline - time.monotonic())
            signal.setitimer(signal.ITIMER_REAL, max(until, 1e-3), REPEAT_S)
            return
        raise _Expired(f"{self.what} did not return within {self.describe()}")

    def describe(self) -> str:
        if isinstance(self.fixed_s, DefaultLimit):
            return f"{self.fixed_s:g} s (the default limit of an import or an adapter's getter; --timeout SECONDS sets one)"
        if self.limits is None:
            return f"--timeout {self.timeout_s:g} s"
        which = (
            "for the build and first step" if self.last_step_s is None else f"{self.limits.factor:g}x the step before"
        )
        return f"{self.timeout_s:g} s (the default limit {which}; --timeout SECONDS sets one)"

    def _restore(self, rearm_outer: bool = True) -> None:
        with self.lock:
            if not self.installed:
                return
            self.installed = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            _real_signal(signal.SIGALRM, self.previous_handler)
        if rearm_outer and self.outer_deadline is not None:
            signal.setitimer(signal.ITIMER_REAL, max(self.outer_deadline - time.monotonic(), 1e-3))

    def __exit__(self, *exc_info) -> None:
        self.watchdog.stop()
        self._restore()
