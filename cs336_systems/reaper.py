"""A small process beside ours that ends what our process leaves behind, and ends our process when
it is stuck where nothing inside it can act. Linux only; standard library only.

`start()` (called by usercode.guarded, once per process) starts it in a bare interpreter
(python -I -S), in its own session so a terminal's Ctrl-C does not reach it, and makes this process a
child subreaper (Linux PR_SET_CHILD_SUBREAPER): a process whose parent below us ends (a helper started by
a copy the user's code forked) becomes our child, not init's, so it is still ours to end. It reads a pipe whose
writing end only this process holds, and every SNAPSHOT_S notes the processes this one started:
- at end of file, or when this process is no longer its parent (this process ended, however:
  returned, SIGTERM, SIGKILL), every process this one had started, and their children, get
  SIGTERM, then SIGKILL TERM_GRACE_S later: a helper the user's code started never outlives the run
  (lifetime.exit_with ends them itself first, with no snapshot to miss: `end_descendants()`);
- after `arm(deadline, text)` (usercode under an address-space cap, where no watchdog thread fits),
  past `deadline` (the monotonic clock) with no `disarm()`, `text` goes to stderr and this process
  gets SIGKILL: a hang inside one native call still ends.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import time

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
SNAPSHOT_S = 0.5  # a helper started and abandoned faster than this, just before a SIGKILL, can escape
TERM_GRACE_S = 1.0
# Runs this file's serve() in the bare interpreter (no __main__ guard here: tools.py lists those as tools).
_BOOT = "import runpy, sys; runpy.run_path(sys.argv[1])['serve'](*sys.argv[2:])"

_owner: int | None = None  # the pid that started the reaper; a forked child has its own pid
_pipe: int | None = None
_pid: int | None = None  # the reaper's


def start() -> bool:
    """Start this process's reaper unless it runs already; False where it cannot run."""
    global _owner, _pipe, _pid
    if _owner == os.getpid():
        return True
    if not sys.platform.startswith("linux") or not sys.executable:
        return False
    read, write = os.pipe()
    try:
        os.set_inheritable(read, True)
        _pid = os.posix_spawn(
            sys.executable,
            [sys.executable, "-I", "-S", "-c", _BOOT, os.path.abspath(__file__), str(os.getpid()), str(read)],
            os.environ,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                (os.POSIX_SPAWN_CLOSE, write),
            ],
            setsid=True,
        )
    except OSError:  # no process to spare (a process limit, an address-space cap)
        os.close(write)
        return False
    finally:
        os.close(read)
    _owner, _pipe = os.getpid(), write
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    return True


def _send(line: str) -> None:
    if _pipe is None or _owner != os.getpid():
        return
    with contextlib.suppress(OSError):
        os.write(_pipe, (line.replace("\n", " ") + "\n").encode())


def arm(deadline: float, text: str) -> bool:
    """Kill this process past `deadline` (time.monotonic) unless disarmed; False with no reaper."""
    if _pipe is None or _owner != os.getpid():
        return False
    _send(f"arm {deadline!r} {text}")
    return True


def disarm() -> None:
    _send("disarm")


def end_descendants() -> None:
    """End every process below this one now (lifetime.exit_with, as the tool exits): the reaper's
    snapshot may be up to SNAPSHOT_S old, this is not. Each ended process is reaped here, and the reaper
    let go and waited for: a zombie left to the init of a container (which may reap late) still has its
    pid, and is counted as a process that outlived the tool."""
    global _pipe
    ours = _owner == os.getpid()
    skip = _pid if ours else None
    _end(
        _descendants({pid: started for pid in _children(os.getpid()) if pid != skip and (started := _start_time(pid))})
    )
    for pid in _children(os.getpid()):  # ended above, or before: reparented to us (the subreaper) when their parent was
        if pid != skip:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
    if ours and _pipe is not None:
        with contextlib.suppress(OSError):
            os.close(_pipe)  # end of file: the reaper ends what it knew of (ended already) and exits
        _pipe = None
        deadline = time.monotonic() + TERM_GRACE_S
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(_pid, os.WNOHANG) == (0, 0) and time.monotonic() < deadline:
                time.sleep(0.01)


# -- the reaper's side ------------------------------------------------------------------------


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (ticks since boot): with the pid, names one process across pid reuse.
    None once it has ended (a zombie, not yet reaped, too)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return fields[19].decode() if len(fields) > 19 and fields[0] not in (b"Z", b"X") else None


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as handle:
            found += [int(child) for child in handle.read().split()]
    return found


def _descendants(roots: dict[int, str]) -> dict[int, str]:
    """`roots` still running (same start time) and every process below them."""
    found: dict[int, str] = {}
    todo = [pid for pid, started in roots.items() if _start_time(pid) == started]
    while todo:
        pid = todo.pop()
        started = _start_time(pid)
        if started is None or pid in found:
            continue
        found[pid] = started
        todo += _children(pid)
    return found


def _end(processes: dict[int, str]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [pid for pid, started in processes.items() if _start_time(pid) == started]
        for pid in alive:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        deadline = time.monotonic() + TERM_GRACE_S  # after SIGKILL too: the kernel takes a moment to end them
        while alive and time.monotonic() < deadline:
            time.sleep(0.05)
            alive = [pid for pid in alive if _start_time(pid) == processes[pid]]


def serve(owner: str, fd: str) -> None:
    """The reaper's loop (in its own interpreter): `owner` is the process it serves, `fd` the pipe."""
    owner_pid, pipe = int(owner), int(fd)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # it ends when its owner does, and only then
    started: dict[int, str] = {}  # the owner's children, as last seen
    deadline, text, pending = None, "", b""
    while True:
        ready, _, _ = select.select([pipe], [], [], SNAPSHOT_S)
        if ready:
            chunk = os.read(pipe, 65536)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                word, _, rest = line.decode(errors="replace").partition(" ")
                if word == "arm":
                    when, _, text = rest.partition(" ")
                    deadline = float(when)
                elif word == "disarm":
                    deadline = None
        if os.getppid() != owner_pid:
            break
        now = {pid: _start_time(pid) for pid in _children(owner_pid) if pid != os.getpid()}
        started = {pid: when for pid, when in {**started, **now}.items() if when and _start_time(pid) == when}
        if deadline is not None and time.monotonic() > deadline:
            with contextlib.suppress(OSError):
                os.write(2, f"{text}\n".encode())
                os.kill(owner_pid, signal.SIGKILL)
            break
    _end(_descendants(started))
