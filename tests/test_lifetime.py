"""No orphans: children die with a SIGKILLed parent, SIGTERM is Ctrl-C, Ctrl-C is one line and 130,
temporary directories of dead owners are removed, bad inputs are refused in one line."""

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from cs336_systems.lifetime import (
    OWNER_MARK,
    child_preexec,
    deferring_interrupts,
    remove_stale_temporary_directories,
    temporary_directory,
)
from tests.helpers import HANG_GUARD_S, PYTHON, REPO, child_env
from tests.tiny import TINY_SHAPE, TINY_SWEEP

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")


def _gone(pid: int) -> bool:
    """Not running: no such process, or a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _gone_within(pids, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not all(_gone(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _wait_for(predicate, process: subprocess.Popen, seconds: float = 120):
    deadline = time.monotonic() + seconds
    while not (value := predicate()):
        assert process.poll() is None, process.communicate()[1]
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)
    return value


def _kill(pids) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _start(args, tmp_path, **env) -> subprocess.Popen:
    """A command in its own session (as from a terminal), temp files in tmp_path."""
    return subprocess.Popen(
        [PYTHON, "-m", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**child_env(), "TMPDIR": str(tmp_path), **env},
        start_new_session=True,
    )


def _rows(path: Path) -> int:
    try:
        return len(pd.read_csv(path)) if path.exists() and path.stat().st_size else 0
    except (pd.errors.EmptyDataError, pd.errors.ParserError):
        return 0


# -- children die with a SIGKILLed parent ----------------------------------------------------


def test_sweep_child_dies_with_its_sigkilled_parent_and_the_next_run_removes_its_temp_dir(tmp_path):
    pids = tmp_path / "pids"
    process = _start(
        [
            "cs336_systems.run_benchmarks",
            *TINY_SWEEP,
            "--model-factory",
            "user_models:hangs_with_a_child",
            "--context-lengths",
            "8",
            "--timeout",
            "600",
        ],
        tmp_path,
        CS336_TEST_PIDS=str(pids),
    )
    child, grandchild = _wait_for(lambda: pids.exists() and [int(p) for p in pids.read_text().split()], process)
    leftover = list(tmp_path.glob(f"cs336-child-{process.pid}-*"))
    assert len(leftover) == 1  # the child's row directory, named after its owner
    process.kill()
    process.wait()
    try:
        assert _gone_within([child], 1.0)
    finally:
        _kill([child, grandchild])  # the user's own process is the user's (it is not ours to reach)
    assert leftover[0].exists()  # SIGKILL left it; the next run removes it
    with temporary_directory("child", dir=tmp_path):
        assert not leftover[0].exists()


def test_spawned_ranks_die_with_their_sigkilled_parent(tmp_path):
    # rank 1 hangs at its first unit, rank 0 waits for it in the all-reduce: both have joined the group
    process = _start(
        [
            "cs336_systems.allreduce_bench",
            "--device",
            "cpu",
            "--world-sizes",
            "2",
            "--sizes",
            "4KB",
            "--timeout",
            "600",
        ],
        tmp_path,
        CS336_SYSTEMS_INJECT_FAILURE="1:hang",
    )
    parent = psutil.Process(process.pid)

    def command_line(child: psutil.Process) -> str:
        try:
            return " ".join(child.cmdline())
        except psutil.Error:  # a short-lived helper of the parent that ended (a zombie) meanwhile
            return ""

    def joined():
        ranks = [p for p in parent.children() if "spawn_main" in command_line(p)]
        try:
            return len(ranks) == 2 and all(r.net_connections("tcp") for r in ranks) and [r.pid for r in ranks]
        except psutil.Error:
            return False

    ranks = _wait_for(joined, process)
    process.kill()
    process.wait()
    try:
        assert _gone_within(ranks, 1.0)
    finally:
        _kill(ranks)


def test_http_store_dies_with_its_sigkilled_parent(tmp_path):
    script = textwrap.dedent(f"""
        import time
        from cs336_systems.latency_model import LatencyModel
        from cs336_systems.storage import http_server, write_items
        write_items({str(tmp_path)!r}, 2, 8, 0)
        with http_server({str(tmp_path)!r}, LatencyModel()) as url:
            print(url, flush=True)
            time.sleep(600)
    """)
    process = subprocess.Popen([PYTHON, "-c", script], stdout=subprocess.PIPE, text=True, env=child_env())
    assert process.stdout.readline().startswith("http://")
    (server,) = psutil.Process(process.pid).children()
    process.kill()
    process.wait()
    try:
        assert _gone_within([server.pid], 1.0)
    finally:
        _kill([server.pid])


def test_a_child_outliving_its_parent_is_ended_by_its_own_alarm():
    child = subprocess.Popen(["sleep", "30"], preexec_fn=child_preexec(0.5))
    assert child.wait(timeout=HANG_GUARD_S) == -signal.SIGALRM  # its own alarm, not the end of its sleep


# -- SIGTERM and Ctrl-C ---------------------------------------------------------------------


def test_sigterm_on_a_sweep_keeps_the_finished_rows_and_exits_143(tmp_path):
    out, pids = tmp_path / "rows.csv", tmp_path / "pids"
    process = _start(
        [
            "cs336_systems.run_benchmarks",
            *TINY_SWEEP,
            "--model-factory",
            "user_models:hangs_at_batch_4",
            "--context-lengths",
            "8",
            "--batch-sizes",
            "1",
            "4",
            "--output",
            str(out),
        ],
        tmp_path,
        CS336_TEST_PIDS=str(pids),
    )
    (child,) = _wait_for(lambda: pids.exists() and [int(p) for p in pids.read_text().split()], process)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 143, stderr
    assert "Traceback" not in stderr and "Resume with:" in stderr
    rows = pd.read_csv(out)
    assert list(rows["batch_size"]) == [1] and list(rows["status"]) == ["ok"]
    assert _gone_within([child], 5.0)


CTRL_C_CASES = {
    "allreduce_bench": [
        "--device",
        "cpu",
        "--world-sizes",
        "2",
        "--sizes",
        "1KB",
        "2KB",
        "4KB",
        "8KB",
        "16KB",
        "32KB",
        "--warmup-steps",
        "1",
        "--measure-steps",
        "400",
    ],
    "ddp_bench": [
        *TINY_SHAPE,
        "--device",
        "cpu",
        "--world-sizes",
        "2",
        "--strategies",
        "ddp",
        "naive",
        "--context-length",
        "8",
        "--batch-size",
        "2",
        "--warmup-steps",
        "1",
        "--measure-steps",
        "300",
    ],
    "loader_bench": [
        "--num-items",
        "64",
        "--item-bytes",
        "64",
        "--batch-size",
        "4",
        "--epochs",
        "3",
        "--compute-ms",
        "50",
        "--num-workers",
        "0",
        "1",
        "2",
        "--device",
        "cpu",
    ],
}


@pytest.mark.parametrize(
    "module, signum",
    [
        *((module, signal.SIGINT) for module in CTRL_C_CASES),
        ("ddp_bench", signal.SIGTERM),
        ("loader_bench", signal.SIGTERM),
    ],
)
def test_ctrl_c_or_sigterm_is_one_line_and_keeps_finished_rows_and_no_child(module, signum, tmp_path):
    out = tmp_path / "rows.csv"
    process = _start([f"cs336_systems.{module}", *CTRL_C_CASES[module], "--output", str(out)], tmp_path)
    _wait_for(lambda: _rows(out) >= 1, process, seconds=240)
    children = [child.pid for child in psutil.Process(process.pid).children(recursive=True)]
    if signum == signal.SIGINT:
        os.killpg(process.pid, signum)  # as a terminal does: to the whole process group
    else:
        process.send_signal(signum)  # as kill does: to the command alone
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signum, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    how = "interrupted" if signum == signal.SIGINT else "terminated"
    assert stderr.strip().splitlines()[-1].endswith(f"{how}; the rows finished so far are in the outputs")
    assert _rows(out) >= 1
    assert _gone_within(children, 5.0)  # ranks, workers: ended by the cleanup, none left behind


def test_an_interrupt_while_workers_fork_is_delivered_once_they_started():
    reached = False
    with pytest.raises(KeyboardInterrupt), deferring_interrupts():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)  # the handler runs here and only remembers it
        reached = True
    assert reached


# -- temporary directories and bad inputs ------------------------------------------------------


def test_only_our_temp_dirs_of_dead_owners_are_removed(tmp_path):
    finished = subprocess.Popen(["true"])
    finished.wait()
    dead = tmp_path / f"cs336-child-{finished.pid}-abc"
    mine = tmp_path / f"cs336-child-{os.getpid()}-abc"
    alive = tmp_path / "cs336-loader-1-abc"  # pid 1 always runs
    other = tmp_path / f"not-ours-{finished.pid}-abc"
    unmarked = tmp_path / f"cs336-child-{finished.pid}-someone-elses"  # named alike, not made by us
    for path in (dead, mine, alive, other, unmarked):
        path.mkdir()
        (path / "row.jsonl").write_text("{}\n")
    for path in (dead, mine, alive, other):
        (path / OWNER_MARK).touch()
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / OWNER_MARK).touch()
    link = tmp_path / f"cs336-child-{finished.pid}-link"
    link.symlink_to(victim)  # a planted link: never followed, never removed
    assert remove_stale_temporary_directories(tmp_path) == [dead]
    assert not dead.exists() and mine.exists() and alive.exists() and other.exists() and unmarked.exists()
    assert link.is_symlink() and (victim / OWNER_MARK).exists()
    with temporary_directory("child", dir=tmp_path) as made:
        assert (Path(made) / OWNER_MARK).is_file()  # what marks it ours


def _bad_inputs_script():
    spec = importlib.util.spec_from_file_location("bad_inputs", REPO / "scripts" / "checks" / "bad_inputs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bad_inputs", module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "command, args",
    [
        ("monitor", ["--", "{tmp}/not_executable.sh"]),
        ("monitor", ["--", "no-such-command-xyz"]),
        ("run_benchmarks", ["--timeout", "nan"]),
        ("loader_bench", ["--processes", "0"]),
        ("memory", ["--find-max", "batch-size"]),
    ],
)
def test_bad_inputs_table_cases_are_one_line_and_exit_2(command, args, tmp_path, monkeypatch):
    script = _bad_inputs_script()
    assert args in script.TABLE[command]  # the script checks this very case
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setattr(script, "CASE_TIMEOUT_S", 300.0)  # a loaded test machine imports torch slowly
    script.make_files(tmp_path)
    outcome = script.run_case(command, args, tmp_path, 0)
    assert outcome.passed, (outcome.returncode, outcome.stderr)


def test_bad_inputs_cover_every_command_at_least_ten_times_but_the_small_ones():
    table = _bad_inputs_script().TABLE
    commands = {path.stem for path in (REPO / "cs336_systems").glob("*.py")} | {
        path.parent.name for path in (REPO / "cs336_systems").glob("*/__main__.py")
    }
    tools = {
        "benchmark",
        "benchmark_direct",
        "run_benchmarks",
        "find_max",
        "memory",
        "report",
        "compare",
        "attention_bench",
        "allreduce_bench",
        "ddp_bench",
        "loader_bench",
        "monitor",
        "mixed_precision",
        "residuals",
        "handout",
    }
    # beside the tools: benchmark's --config alone and its peak cache, the cs336-bench dispatcher, and
    # storage serve (an internal tool, run by name)
    also = {"benchmark_config": "benchmark", "benchmark_peak": "benchmark", "cs336-bench": None, "storage": None}
    assert tools <= commands and set(table) == tools | set(also)
    assert all(module is None or module in tools for module in also.values())
    few_flags = ("mixed_precision", "residuals", "handout", "benchmark_config")  # a handful each
    fewer = ("benchmark_peak", "cs336-bench", "storage")
    assert all(len(cases) >= 10 for name, cases in table.items() if name not in few_flags + fewer)
    assert all(len(table[name]) >= 5 for name in few_flags) and all(len(table[name]) >= 2 for name in fewer)


# -- the reaper and exit_with: what the user's code leaves behind ends with us ---------------------

LEAVES_A_HELPER = """
import subprocess, sys, time
from cs336_systems import reaper
assert reaper.start()
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
print(helper.pid, flush=True)
{then}
"""


def _run_until_pid(script: str) -> tuple[subprocess.Popen, int]:
    process = subprocess.Popen([PYTHON, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return process, int(process.stdout.readline())


def _ends_soon(pid: int, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("end", ["return", "sigkill"])
def test_a_helper_the_code_left_ends_with_the_process_however_it_ends(end):
    then = (
        "time.sleep(0.7)" if end == "sigkill" else "from cs336_systems import lifetime; lifetime.exit_with(lambda: 0)"
    )
    process, helper = _run_until_pid(LEAVES_A_HELPER.format(then=then))
    if end == "sigkill":
        time.sleep(0.7)  # the reaper has seen the helper
        process.kill()
    process.wait(10)
    assert _ends_soon(helper)


def test_ending_the_descendants_reaps_them_and_the_reaper_so_no_zombie_keeps_a_pid():
    """A sleeper the user's code forked was ended but left a zombie: a container's init reaps late, and
    the pid looked alive after the tool exited (one run in two)."""
    script = textwrap.dedent(
        """
        import os, time
        from cs336_systems import reaper
        assert reaper.start()
        sleeper = os.fork()
        if sleeper == 0:
            time.sleep(3600)
            os._exit(0)
        exited = os.fork()
        if exited == 0:
            os._exit(0)  # ended on its own, never waited for
        reaper.end_descendants()
        for pid in (sleeper, exited, reaper._pid):
            try:
                os.waitpid(pid, os.WNOHANG)
                print("not reaped", pid)
            except ChildProcessError:
                print("reaped")
        """
    )
    result = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert result.stdout.split("\n")[:3] == ["reaped"] * 3, result.stdout + result.stderr


def test_under_an_address_space_cap_the_reaper_ends_a_hang_python_cannot_interrupt():
    then = (
        "reaper.arm(time.monotonic() + 0.5, 'error: my step did not return; ending the process')\n"
        "import re; re.match(r'(a+)+$', 'a' * 40 + 'b')  # a hang; nothing of ours in this process ends it"
    )
    process, helper = _run_until_pid(LEAVES_A_HELPER.format(then=then))
    _, stderr = process.communicate(timeout=20)
    assert process.returncode == -signal.SIGKILL and "my step did not return" in stderr
    assert _ends_soon(helper)


def test_exit_with_ends_the_process_whatever_threads_and_exit_hooks_the_code_left(tmp_path):
    script = textwrap.dedent(
        f"""
        import atexit, threading, time
        from cs336_systems import lifetime
        lifetime.EXIT_HOOKS_GRACE_S = 0.3
        lifetime.at_exit(lambda: open({str(tmp_path / "ours")!r}, "w").close())  # our cleanup runs first
        threading.Thread(target=time.sleep, args=(3600,)).start()  # non-daemon
        atexit.register(time.sleep, 3600)
        lifetime.exit_with(lambda: 3)
        """
    )
    # a wait for the thread or the exit hook would be an hour
    result = subprocess.run(
        [PYTHON, "-c", script], capture_output=True, text=True, timeout=HANG_GUARD_S, env=child_env()
    )
    assert result.returncode == 3, result.stderr
    assert (tmp_path / "ours").exists()
