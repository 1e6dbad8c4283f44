"""How busy other processes kept the machine (contention.py), with a busy loop the test starts."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

from cs336_systems import reaper
from cs336_systems.contention import Load, LoadMeter

SPIN = f"{sys.executable} -c 'while True: pass'"


def test_a_busy_loop_elsewhere_is_seen_and_said():
    # started through a shell that exits: the loop is not a process of ours (init adopts it, once this
    # process is no child subreaper, which an earlier test's reaper.start makes it)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(reaper.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
    try:
        pid = int(subprocess.run(["sh", "-c", f"{SPIN} >/dev/null 2>&1 & echo $!"], capture_output=True).stdout)
    finally:
        if reaper._owner == os.getpid():
            libc.prctl(reaper.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    try:
        time.sleep(0.3)  # the loop is running
        with LoadMeter(threads=1) as meter:
            time.sleep(1.0)  # this process is idle: the busy core is another's
    finally:
        os.kill(pid, signal.SIGKILL)
    load = meter.load
    assert load.other_cores > 0.5 and load.busy
    assert load.own_share is not None and load.own_share < 0.2  # we slept: we asked for nothing
    assert load.words().startswith("other processes kept ")


def test_a_busy_process_of_our_own_is_our_work_not_another_load():
    """ddp_bench's ranks, torch.compile's workers: processes this run started are not contention."""
    spinner = subprocess.Popen(["sh", "-c", f"exec {SPIN}"])
    try:
        time.sleep(0.3)
        with LoadMeter(threads=1) as meter:
            time.sleep(1.0)
    finally:
        spinner.kill()
        spinner.wait()
    assert meter.load.other_cores < 0.5 and meter.load.own_share < 0.2  # the share is this process's alone


def test_the_load_never_passes_the_machines_cores(monkeypatch):
    """The kernel counts busy time in ticks: over a short window busy minus own can pass the cores."""
    from cs336_systems import contention

    busy = iter([100.0, 100.0 + 10.0])  # 10 busy seconds over about 0 s of wall time
    monkeypatch.setattr(contention, "_busy_seconds", lambda: next(busy))
    with LoadMeter(threads=1) as meter:
        pass
    assert meter.load.other_cores == meter.load.cores


def test_the_words_of_a_quiet_and_a_busy_machine():
    assert Load(0.04, 2, 0.98, None).words() == "quiet (0.0 of 2 cores busy elsewhere)"
    assert not Load(0.04, 2, 0.98, None).busy
    busy = Load(1.7, 2, 0.55, 1)
    assert busy.busy and busy.words() == "other processes kept 1.7 of 2 cores busy and 1 other process(es) used the GPU"


def test_a_window_of_a_few_milliseconds_reads_no_load_from_the_kernels_tick_rounding(monkeypatch):
    """Busy time moves in ticks (10 ms at 100 Hz): one tick per core over a 20 ms window read as a core
    of load on a quiet machine (a tiny model's five measured steps)."""
    from cs336_systems import contention

    busy = iter([100.0, 100.0 + 2 / contention.TICKS_PER_S])  # two ticks the kernel rounded up
    clock = iter([0.0, 0.02])
    monkeypatch.setattr(contention, "_busy_seconds", lambda: next(busy))
    monkeypatch.setattr(contention.time, "monotonic", lambda: next(clock))
    with LoadMeter(threads=1) as meter:
        pass
    assert meter.load.other_cores == 0.0 and not meter.load.busy
