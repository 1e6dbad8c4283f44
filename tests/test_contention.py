"""How busy other processes kept the machine (contention.py), with a busy loop the test starts."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

import pytest

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


def test_a_busy_process_of_our_own_is_our_work_not_another_load(monkeypatch):
    """ddp_bench's ranks, torch.compile's workers: processes this run started are not contention. The
    machine is made one where only this process and its spinner run (its busy time read from the two
    directly), so what other tests run beside this one does not count."""
    import psutil

    from cs336_systems import contention

    spinner = subprocess.Popen(["sh", "-c", f"exec {SPIN}"])
    processes = [psutil.Process(), psutil.Process(spinner.pid)]

    def only_us() -> float:
        return sum(t.user + t.system for t in (p.cpu_times() for p in processes))

    monkeypatch.setattr(contention, "_busy_seconds", only_us)
    try:
        time.sleep(0.3)
        with LoadMeter(threads=1) as meter:
            time.sleep(1.0)
    finally:
        spinner.kill()
        spinner.wait()
    assert meter.load.other_cores < 0.1 and meter.load.own_share < 0.2  # the share is this process's alone


def test_idle_processes_of_ours_take_no_load_off_as_tick_rounding(monkeypatch):
    """Only our processes that ran in the window can have their tick counts rounded: twenty idle ones
    (torch.compile's worker pool) take nothing off a core of load elsewhere."""
    from cs336_systems import contention

    busy = iter([100.0, 101.0])  # one core busy elsewhere over one second
    clock = iter([0.0, 1.0])
    idle = {pid: 5.0 for pid in range(1000, 1020)}
    monkeypatch.setattr(contention, "_busy_seconds", lambda: next(busy))
    monkeypatch.setattr(contention, "_own_seconds", lambda: dict(idle))
    monkeypatch.setattr(contention.time, "monotonic", lambda: next(clock))
    with LoadMeter(threads=1) as meter:
        pass
    cores = contention.psutil.cpu_count()  # the machine's own ticks are still taken off
    assert meter.load.other_cores == pytest.approx(1.0 - 2 * cores / contention.TICKS_PER_S)


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
