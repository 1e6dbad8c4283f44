"""How busy other processes kept the machine (contention.py), with a busy loop the test starts."""

from __future__ import annotations

import subprocess
import sys
import time

from cs336_systems.contention import Load, LoadMeter


def test_a_busy_loop_elsewhere_is_seen_and_said():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # the loop is running
        with LoadMeter(threads=1) as meter:
            time.sleep(1.0)  # this process is idle: the busy core is another's
    finally:
        spinner.kill()
        spinner.wait()
    load = meter.load
    assert load.other_cores > 0.5 and load.busy
    assert load.own_share is not None and load.own_share < 0.2  # we slept: we asked for nothing
    assert load.words().startswith("other processes kept ")


def test_the_words_of_a_quiet_and_a_busy_machine():
    assert Load(0.04, 2, 0.98, None).words() == "quiet (0.0 of 2 cores busy elsewhere)"
    assert not Load(0.04, 2, 0.98, None).busy
    busy = Load(1.7, 2, 0.55, 1)
    assert busy.busy and busy.words() == "other processes kept 1.7 of 2 cores busy and 1 other process(es) used the GPU"
