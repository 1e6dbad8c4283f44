"""Process lifetime: children die with their parent, SIGTERM is Ctrl-C, temporary directories are
never left behind. torch-free on import.

- `die_with_parent()`: the kernel sends this process SIGKILL when its parent exits, even when the
  parent is SIGKILLed (Linux `prctl(PR_SET_PDEATHSIG)`). Call it first thing in a multiprocessing
  child; give `subprocess.Popen` `preexec_fn=child_preexec(...)`. Elsewhere it returns False and the
  parent's own cleanup (children in their own process group, killed with it) is all there is.
- `child_preexec(deadline_s)` also arms the child's own alarm: SIGALRM's default action ends it at
  its deadline even when the parent that would have killed it is gone (interval timers survive exec).
- `signals_interrupt()`: SIGTERM raises `Terminated` (a KeyboardInterrupt), so every command
  cleans up as on Ctrl-C and exits 143; an interrupt Python swallowed is still seen (check_interrupted).
- `ignoring_interrupts()` / `deferring_interrupts()`: processes started inside do not see a
  terminal's Ctrl-C (their parent ends them), and no interrupt is lost while they start.
- `temporary_directory(kind)`: `cs336-KIND-PID-…` in the temp directory; a directory whose owner
  pid is no longer running (it was SIGKILLed) is removed by the next one made.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
TEMP_PREFIX = "cs336-"
_OWNED = re.compile(rf"^{re.escape(TEMP_PREFIX)}[a-z]+-(\d+)-")
_libc = None


def _prctl():
    global _libc
    if not sys.platform.startswith("linux"):
        return None
    if _libc is None:  # loaded in the parent: a forked child must not dlopen
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
        except OSError:
            return None
    return getattr(_libc, "prctl", None)


def die_with_parent(parent_pid: int | None = None) -> bool:
    """SIGKILL this process when its parent exits. With `parent_pid`, exit now if the parent is already
    gone (it died between starting us and this call). False where the kernel cannot do it."""
    prctl = _prctl()
    if prctl is None or prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return False
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)
    return True


def child_preexec(deadline_s: float | None = None) -> Callable[[], None]:
    """A `preexec_fn` for subprocess.Popen: the child dies with this process, and by SIGALRM after
    `deadline_s` (when given) whatever became of this process."""
    parent = os.getpid()
    _prctl()  # load libc here, before the fork

    def preexec() -> None:
        die_with_parent(parent)
        if deadline_s is not None:
            signal.setitimer(signal.ITIMER_REAL, deadline_s)

    return preexec


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C would raise KeyboardInterrupt."""


_received: list[int] = []  # signals seen by signals_interrupt's handler, in order


def _raise_interrupt(signum, frame):
    _received.append(signum)
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def interrupt_received() -> int | None:
    """The signal (SIGINT or SIGTERM) seen inside signals_interrupt, if any. An interrupt can be
    swallowed (raised inside an at-fork hook or a __del__, where Python only prints it), so loops
    check this between rows as well."""
    return _received[-1] if _received else None


def check_interrupted() -> None:
    """Raise the interrupt again if one was received and swallowed."""
    if interrupt_received() is not None:
        _raise_interrupt(interrupt_received(), None)


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """Inside, Ctrl-C raises KeyboardInterrupt and SIGTERM raises Terminated, and both are remembered
    (interrupt_received). Main thread only; elsewhere this does nothing."""
    with _handlers(dict.fromkeys((signal.SIGINT, signal.SIGTERM), _raise_interrupt)) as installed:
        if installed:
            _received.clear()
        yield


@contextlib.contextmanager
def deferring_interrupts() -> Iterator[None]:
    """Inside, Ctrl-C and SIGTERM are only remembered, and delivered again on leaving. For forking
    code (DataLoader workers): an interrupt raised in an at-fork hook is swallowed, with a traceback."""
    got: list[int] = []
    try:
        with _handlers(dict.fromkeys((signal.SIGINT, signal.SIGTERM), lambda signum, frame: got.append(signum))):
            yield
    finally:
        if got:
            signal.raise_signal(got[-1])


@contextlib.contextmanager
def ignoring_interrupts() -> Iterator[None]:
    """Processes started inside inherit SIGINT ignored: a terminal's Ctrl-C reaches only this
    process, which ends them itself (no traceback from every child)."""
    with _handlers({signal.SIGINT: signal.SIG_IGN}):
        yield


@contextlib.contextmanager
def _handlers(handlers: dict) -> Iterator[bool]:
    """These signal handlers inside, the previous ones again on leaving; yields whether they were
    installed (only the main thread can: elsewhere this does nothing)."""
    try:
        previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
    except ValueError:  # not the main thread
        yield False
        return
    try:
        yield True
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temporary_directories(root: str | Path | None = None) -> list[Path]:
    """Remove the `cs336-KIND-PID-…` directories in `root` (the temp directory) whose owner is gone."""
    root = Path(root or tempfile.gettempdir())
    removed = []
    with contextlib.suppress(OSError):
        for entry in root.iterdir():
            match = _OWNED.match(entry.name)
            if match and int(match.group(1)) != os.getpid() and not _pid_running(int(match.group(1))):
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
    return removed


def temporary_directory(kind: str, dir: str | Path | None = None) -> tempfile.TemporaryDirectory:  # noqa: A002
    """A TemporaryDirectory named after its kind and owner pid; stale ones of dead owners go first."""
    remove_stale_temporary_directories(dir)
    return tempfile.TemporaryDirectory(prefix=f"{TEMP_PREFIX}{kind}-{os.getpid()}-", dir=dir)
