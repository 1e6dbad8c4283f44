"""The user's code in a real process of the tool, third round: whatever it leaves (another working
directory, a forked copy, ignored signals, threads and exit hooks that never end, a closed stdout, helper
processes), the rows are written once where the user said, the tool stops when told and exits when done,
and nothing it started outlives it."""

from __future__ import annotations

import signal
import subprocess
import time

import psutil
import pytest

from tests.helpers import HANG_GUARD_S, PYTHON, REPO, child_env
from tests.tiny import CELL, TINY, TINY_CPU, TINY_SHAPE

ONE = [*TINY, "--pass-type", "forward"]
GRID = [*TINY_SHAPE, *TINY_CPU, "--no-profile-step", *CELL]  # each test gives its steps


def _gone(pid: int, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def _helpers(pidfile) -> list[int]:
    return [int(pid) for pid in pidfile.read_text().split()] if pidfile.exists() else []


def test_a_factory_that_leaves_a_mess_loses_no_row_and_leaves_nothing_running(tmp_path):
    pidfile = tmp_path / "helpers.txt"
    result = subprocess.run(  # a wait for its thread or its exit hook would be an hour
        [PYTHON, "-m", "cs336_systems.benchmark", *ONE]
        + ["--model-factory", "tests.fixtures.hostile.models:leaves_a_mess", "--output", "rows.csv"],
        cwd=tmp_path,
        env={**child_env(), "HOSTILE_HELPER_PIDFILE": str(pidfile), "HOSTILE_CWD_PARENT": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert result.returncode == 0, result.stderr
    lines = (tmp_path / "rows.csv").read_text().splitlines()  # where the user said, not where it chdir'd
    assert len(lines) == 2 and lines[0].startswith("tool,model_size,") and ",ok," in lines[1]  # one header, one row
    assert not list(tmp_path.glob(".*.lock"))  # our exit cleanup ran before its hanging hook
    assert _helpers(pidfile) and all(_gone(pid) for pid in _helpers(pidfile))


@pytest.mark.parametrize(
    "tool, sig, status",
    [  # (a SIGKILLed process's helpers: test_lifetime's reaper test, without a tool around it)
        ("benchmark_direct", signal.SIGTERM, 143),
        ("run_benchmarks", signal.SIGKILL, -signal.SIGKILL),  # the child's reaper ends its helpers
    ],
)
def test_stopping_the_tool_ends_the_helpers_of_the_users_code(tmp_path, tool, sig, status):
    pidfile = tmp_path / "helpers.txt"
    process = subprocess.Popen(
        [PYTHON, "-m", f"cs336_systems.{tool}", *GRID, "--warmup-steps", "1", "--measure-steps", "2000"]
        + ["--model-factory", "tests.fixtures.hostile.models:slow_forward", "--output", str(tmp_path / "r.jsonl")],
        cwd=REPO,
        env={**child_env(), "HOSTILE_HELPER_PIDFILE": str(pidfile)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # every build's helper (the up-front check's, the meta count's, the measured model's) started, none
        # for 1.5 s: into the measured steps, and the reapers (a snapshot every 0.5 s) have seen them all
        deadline, seen, quiet_since = time.monotonic() + 90, [], time.monotonic()
        while time.monotonic() < deadline and (len(seen) < 2 or time.monotonic() - quiet_since < 1.5):
            if len(now := _helpers(pidfile)) != len(seen):
                seen, quiet_since = now, time.monotonic()
            time.sleep(0.1)
        process.send_signal(sig)  # SIGTERM: the factory ignored it, yet the tool stops
        _, stderr = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == status, stderr
    assert _helpers(pidfile) and all(_gone(pid) for pid in _helpers(pidfile))
