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
  pid is no longer running (it was SIGKILLed) is removed by the next one made, if it holds our mark.
- `exit_with(main)`: a tool's process ends when main returns, whatever the user's code left: the
  processes it started end, its non-daemon threads are not waited for, exit hooks get
  EXIT_HOOKS_GRACE_S, not forever.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

from . import reaper

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
EXIT_HOOKS_GRACE_S = 2.0  # ours (temporary directories, child processes) take milliseconds; a user's may hang
TEMP_PREFIX = "cs336-"
_OWNED = re.compile(rf"^{re.escape(TEMP_PREFIX)}[a-z]+-(\d+)-")
_libc = None
_os_exit = os._exit  # saved at import, before any user code could replace it
_signal = signal.signal  # and signal.signal, which usercode.guarded replaces for the user's code
OWNER_MARK = ".cs336-owned"  # inside each temporary directory we make: only those are removed as stale


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


class OurInterrupt(KeyboardInterrupt):
    """An interrupt raised by one of our signal handlers: a real signal, never the user's code's own
    raise (usercode.guarded tells the two apart by this class)."""


class Terminated(OurInterrupt):
    """SIGTERM, raised where Ctrl-C would raise KeyboardInterrupt."""


_received: list[int] = []  # signals seen by signals_interrupt's handler, in order


def _raise_interrupt(signum, frame):
    _received.append(signum)
    raise Terminated() if signum == signal.SIGTERM else OurInterrupt()


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
        previous = {sig: _signal(sig, handler) for sig, handler in handlers.items()}
    except ValueError:  # not the main thread
        yield False
        return
    try:
        yield True
    finally:
        for sig, handler in previous.items():
            _signal(sig, handler)


def pid_running(pid: int, started: float | None = None) -> bool:
    """Whether process `pid` runs here (one we may not inspect counts), and, given its `started` (psutil's
    create_time), is that process: not a later one given its pid."""
    import psutil

    try:
        made = psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True
    return started is None or abs(made - started) < 1.0


def _ours(entry: Path) -> bool:
    """A directory (not a link) of this user holding our mark: one of ours, whoever named it alike."""
    try:
        info = os.lstat(entry)
        mark = os.lstat(entry / OWNER_MARK)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and stat.S_ISREG(mark.st_mode)


def remove_stale_temporary_directories(root: str | Path | None = None) -> list[Path]:
    """Remove the `cs336-KIND-PID-…` directories we made in `root` (the temp directory) whose owner is gone;
    a link or a directory without our mark is never touched, whatever its name."""
    root = Path(root or tempfile.gettempdir())
    removed = []
    with contextlib.suppress(OSError):
        for entry in root.iterdir():
            match = _OWNED.match(entry.name)
            owner = int(match.group(1)) if match else None
            if owner is not None and owner != os.getpid() and not pid_running(owner) and _ours(entry):
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
    return removed


def temporary_directory(kind: str, dir: str | Path | None = None) -> tempfile.TemporaryDirectory:  # noqa: A002
    """A TemporaryDirectory named after its kind and owner pid, holding our mark; stale ones of dead
    owners go first."""
    remove_stale_temporary_directories(dir)
    directory = tempfile.TemporaryDirectory(prefix=f"{TEMP_PREFIX}{kind}-{os.getpid()}-", dir=dir)
    (Path(directory.name) / OWNER_MARK).touch()
    return directory


_cleanups: list[Callable[[], None]] = []


def at_exit(cleanup: Callable[[], None]) -> Callable[[], None]:
    """atexit.register for our own cleanups (lock files): exit_with runs them first, before any hook the
    user's code registered (exit hooks run last-registered first, and a user's may never return)."""
    _cleanups.append(cleanup)
    return atexit.register(cleanup)


def exit_with(main: Callable[[], int | None]) -> NoReturn:
    """Run a tool's main and end the process with its status once it returns. Python's own exit would
    first wait for every non-daemon thread and then run every exit hook to its end: a thread or an
    atexit hook the user's code left would keep a finished tool alive for ever. Here the exit hooks
    (ours remove lock files and temporary directories) run in a thread given EXIT_HOOKS_GRACE_S, the
    streams are flushed, and the process ends."""
    try:
        status = main()
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
        if isinstance(code, str):
            print(code, file=sys.stderr)
        status = code if isinstance(code, int) else (0 if code is None else 1)
    for cleanup in reversed(_cleanups):
        with contextlib.suppress(Exception):
            cleanup()
    reaper.end_descendants()  # helpers the user's code started and left
    hooks = threading.Thread(target=atexit._run_exitfuncs, name="cs336-exit-hooks", daemon=True)
    hooks.start()
    hooks.join(EXIT_HOOKS_GRACE_S)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a stream the user's code or the shell closed
            stream.flush()
    _os_exit(status or 0)
