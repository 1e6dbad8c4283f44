"""The user's code never decides our outcome: usercode.guarded turns sys.exit, os._exit, a
KeyboardInterrupt it raised itself and a hang into exceptions, and the tools into rows.

Unit tests run in this process; the CLI tests run `benchmark` in a real child process with the
hostile fixtures (tests/fixtures/hostile), so an os._exit that escaped would end only that child."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from cs336_systems import lifetime
from cs336_systems.usercode import StepLimits, UserCodeError, UserCodeTimeout, check_timeout, guarded
from tests.helpers import PYTHON, REPO, child_env
from tests.tiny import TINY, TINY_DDP, TINY_GRID


def test_sys_exit_becomes_an_error_naming_it():
    with pytest.raises(UserCodeError, match=r"my code called sys.exit\(0\)"), guarded("my code"):
        sys.exit(0)


def test_os_exit_becomes_an_error_and_os_exit_is_put_back():
    real = os._exit
    with pytest.raises(UserCodeError, match=r"called os._exit\(3\)"), guarded("my code"):
        os._exit(3)
    assert os._exit is real


def test_a_forked_child_still_exits_for_real():
    with guarded("my code"):
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 7


def test_keyboard_interrupt_raised_by_the_code_is_an_error_when_no_signal_arrived():
    with lifetime.signals_interrupt(), pytest.raises(UserCodeError, match="KeyboardInterrupt itself"):  # noqa: SIM117
        with guarded("my code"):
            raise KeyboardInterrupt


def test_a_real_ctrl_c_stays_an_interrupt():
    with lifetime.signals_interrupt(), pytest.raises(KeyboardInterrupt), guarded("my code"):
        signal.raise_signal(signal.SIGINT)
        time.sleep(1)


def test_without_our_handler_an_interrupt_is_never_swallowed():
    with pytest.raises(KeyboardInterrupt), guarded("my code"):
        raise KeyboardInterrupt


def test_a_hang_times_out_and_each_rearm_restarts_the_clock():
    with guarded("my step", timeout_s=0.3) as rearm:
        for _ in range(4):  # 0.8 s in all, each step well under the limit
            rearm()
            time.sleep(0.2)
    with (
        pytest.raises(UserCodeTimeout, match=r"my step did not return within --timeout 0.3 s"),
        guarded("my step", timeout_s=0.3),
    ):
        time.sleep(5)


def test_with_no_room_for_the_watchdog_thread_the_alarm_still_guards(monkeypatch):
    import threading

    def no_thread(self):  # what an address-space cap does to a new thread's stack
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    with pytest.raises(UserCodeTimeout), guarded("my step", timeout_s=0.2):
        time.sleep(5)


def test_a_swallowed_timeout_is_raised_again():
    with pytest.raises(UserCodeTimeout), guarded("my step", timeout_s=0.2):
        with contextlib.suppress(Exception):  # the user's code catches everything
            time.sleep(5)
        time.sleep(60)  # it returns, and the block with it, unless the timeout is raised again


@pytest.mark.parametrize(
    "cancel",
    [
        lambda: signal.alarm(0),
        lambda: signal.setitimer(signal.ITIMER_REAL, 0),
        lambda: signal.signal(signal.SIGALRM, signal.SIG_IGN),
        lambda: signal.signal(signal.SIGALRM, lambda *args: None),
    ],
    ids=["alarm-0", "setitimer-0", "sigalrm-ignored", "sigalrm-replaced"],
)
def test_code_that_cancels_our_alarm_is_still_held_to_the_limit(cancel):
    """The limit rested on SIGALRM alone: code that cancelled it hung until the watchdog ended the process."""
    with pytest.raises(UserCodeTimeout, match=r"my step did not return within --timeout 0.2 s"):  # noqa: SIM117
        with guarded("my step", timeout_s=0.2):
            cancel()
            time.sleep(30)
    assert signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, signal.default_int_handler, None)


def test_an_alarm_of_the_codes_own_is_no_timeout_before_the_limit():
    with guarded("my step", timeout_s=5):
        signal.signal(signal.SIGALRM, lambda *args: None)  # refused: ours stays
        signal.setitimer(signal.ITIMER_REAL, 0.1)  # its own alarm goes off long before our limit
        time.sleep(0.5)


def test_code_that_catches_every_exception_cannot_swallow_the_timeout():
    with pytest.raises(UserCodeTimeout), guarded("my step", timeout_s=0.2):
        while True:  # a retry loop of the user's: it swallowed the timeout until the watchdog ended the process
            with contextlib.suppress(Exception):
                time.sleep(1)


def test_an_outer_alarm_still_goes_off_and_is_set_again():
    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *args: fired.append(1))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with guarded("my step", timeout_s=60):
            pass
        assert signal.getitimer(signal.ITIMER_REAL)[0] > 0  # the outer alarm is armed again
        time.sleep(1)
        assert fired == [1]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class _Boom(BaseException):
    pass


class _MyInterrupt(KeyboardInterrupt):
    pass


@pytest.mark.parametrize(
    "raised, words",
    [
        (_Boom("mine"), "raised _Boom (a BaseException, not an Exception): mine"),
        (GeneratorExit(), "raised GeneratorExit (a BaseException"),
        (_MyInterrupt(), "raised _MyInterrupt (a KeyboardInterrupt) itself"),
    ],
)
def test_any_base_exception_the_code_raises_is_its_error(raised, words):
    with lifetime.signals_interrupt(), pytest.raises(UserCodeError, match=re.escape(words)), guarded("my code"):
        raise raised
    with pytest.raises(UserCodeError), guarded("my code"):  # under Python's own handler too
        raise raised


def test_the_code_cannot_replace_our_interrupt_handlers():
    with lifetime.signals_interrupt():
        ours = signal.getsignal(signal.SIGTERM)
        with guarded("my code") as rearm:
            assert signal.signal(signal.SIGTERM, signal.SIG_IGN) is ours  # refused: ours stays
            assert signal.getsignal(signal.SIGTERM) is ours
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            rearm()  # each step unblocks them
            assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, set())
        with pytest.raises(lifetime.Terminated):
            signal.raise_signal(signal.SIGTERM)
    assert signal.signal is not None and signal.getsignal(signal.SIGUSR1) is not None


def test_default_limits_follow_the_measured_step():
    limits = StepLimits(first_s=0.6, factor=2.0, floor_s=0.05)
    with (
        pytest.raises(UserCodeTimeout, match=r"my step did not return within 0.1\d* s \(the default limit 2x"),
        guarded("my step", limits) as rearm,
    ):
        rearm()
        time.sleep(0.3)  # the first step: under first_s
        rearm()
        time.sleep(0.05)  # 0.05 s: under 2 x 0.3 s
        rearm()
        time.sleep(2)  # over 2 x 0.05 s
    assert limits.limit_s(None) == 0.6 and limits.limit_s(10.0) == 20.0 and limits.limit_s(0.001) == 0.05


def test_a_forked_copy_never_comes_back_out_of_the_block(tmp_path):
    marks = tmp_path / "marks"
    with guarded("my code"):
        child = os.fork()  # the user's code forks; both processes return into the harness
    with open(marks, "a") as handle:
        handle.write(f"{os.getpid()}\n")
    if child:
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    assert marks.read_text().split() == [str(os.getpid())]  # only this process went on


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), 1e20])
def test_absurd_timeouts_are_refused(value):
    with pytest.raises(ValueError, match="--timeout must be more than 0 and at most"):
        check_timeout(value)


BENCH = [PYTHON, "-m", "cs336_systems.benchmark", *TINY]
# the hang's own budget (only the hang is given one: a busy machine may take seconds over an honest step)
TIMEOUT = ["--timeout", "6"]


def run_benchmark_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*BENCH, *args], capture_output=True, text=True, cwd=REPO, env=child_env(), timeout=timeout)


@pytest.mark.parametrize(
    "flags, status, message",
    [
        # a factory that ends the process while it is built is refused before any row, as a bad flag is
        (["--model-factory", "tests.fixtures.hostile.models:exits"], 2, r"models:exits called sys.exit\(0\)"),
        (
            ["--model-factory", "tests.fixtures.hostile.models:os_exits_in_forward"],
            1,
            r"called os._exit\(0\)",
        ),
        (["--model-factory", "tests.fixtures.hostile.models:interrupts"], 2, "KeyboardInterrupt itself"),
        (
            ["--model-factory", "tests.fixtures.hostile.models:interrupts_in_forward"],
            1,
            "KeyboardInterrupt itself",
        ),
        ([*TIMEOUT, "--model-factory", "tests.fixtures.hostile.models:hangs_in_forward"], 1, "within --timeout 6 s"),
        (["--model-factory", "tests.fixtures.hostile.exit3_at_import:make"], 2, r"called sys.exit\(3\)"),
    ],
)
def test_benchmark_rows_for_user_code_that_exits_or_hangs(tmp_path, flags, status, message):
    output = tmp_path / "row.jsonl"
    result = run_benchmark_cli(*flags, "--output", str(output))
    assert result.returncode == status, result.stderr
    assert "Traceback" not in result.stderr
    assert re.search(message, result.stderr.strip().splitlines()[-1]), result.stderr
    if status == 1:  # a row says what happened; an import that failed is bad input, refused before any row
        row = json.loads(output.read_text().splitlines()[-1])
        assert row["status"] == ("timeout" if "timeout" in message else "error")


def test_benchmark_refuses_an_absurd_timeout():
    result = run_benchmark_cli("--timeout", "1e20", timeout=60)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr


# -- attention_bench: the implementation runs guarded, its output must be attention's -------------


@pytest.mark.parametrize(
    "name, status, message",
    [
        ("returns_float64", "wrong", "output is torch.float64 on cpu, expected torch.float32"),
        ("returns_nan", "wrong", "NaN or infinite"),
        ("exits", "error", r"forward: tests.fixtures.hostile.attention:exits called sys.exit\(0\)"),
        ("os_exits", "error", r"called os._exit\(0\)"),
        ("hangs", "timeout", "did not return within --timeout 1 s"),
        ("correct", "ok", None),
    ],
)
def test_attention_rows_for_hostile_implementations(name, status, message):
    from cs336_systems.attention_bench import AttentionConfig, run_attention

    config = AttentionConfig(
        f"tests.fixtures.hostile.attention:{name}", head_dim=8, context_length=16, warmup_steps=1, measure_steps=2
    )
    record = run_attention(config, timeout_s=1 if name == "hangs" else 120)
    assert record.status == status, record.error
    if message:
        assert re.search(message, record.error)


def test_attention_flash_getter_that_exits_is_an_error_row():
    from cs336_systems.attention_bench import AttentionConfig, run_attention

    adapters = str(REPO / "tests/fixtures/hostile/adapters_exit.py")
    record = run_attention(
        AttentionConfig("flash-pytorch", head_dim=8, context_length=16, measure_steps=2, adapters=adapters)
    )
    assert (record.status, record.error) == (
        "error",
        "setup: get_flashattention_autograd_function_pytorch() called sys.exit(0)",
    )


def test_a_getter_or_an_import_that_hangs_ends_within_the_default_limit_not_the_steps(monkeypatch):
    from cs336_systems import loading, usercode
    from cs336_systems.attention_bench import AttentionConfig, run_attention
    from cs336_systems.usercode import DEFAULT_IMPORT_TIMEOUT_S, DefaultLimit

    assert DEFAULT_IMPORT_TIMEOUT_S <= 60  # "within a minute by default"
    monkeypatch.setattr(usercode, "DEFAULT_IMPORT_TIMEOUT_S", DefaultLimit(0.5))
    hanging = str(REPO / "tests/fixtures/hostile/adapters_hang.py")
    record = run_attention(AttentionConfig("flash-pytorch", head_dim=8, context_length=16, adapters=hanging))
    assert record.status == "timeout"  # its error names the 0.5 s limit, not the steps' 30 min
    assert "get_flashattention_autograd_function_pytorch() did not return within 0.5 s (the default limit" in (
        record.error
    )
    with pytest.raises(loading.LoadError, match=r"did not return within 0.5 s \(the default limit"):
        loading.load_callable(
            "tests.fixtures.hostile.hang_at_import:build", "--model-factory", timeout_s=DefaultLimit(0.5)
        )


HANG_AT_IMPORT = "tests/fixtures/hostile/hang_at_import.py"


@pytest.mark.parametrize(
    ("tool", "flags"),
    [
        ("attention_bench", ["--adapters", HANG_AT_IMPORT, "--context-lengths", "16", "--head-dims", "8"]),
        ("ddp_bench", ["--adapters", HANG_AT_IMPORT]),
        ("ddp_bench", ["--optimizer", "tests.fixtures.hostile.hang_at_import:make"]),
        ("handout.cli", ["--model-factory", "tests.fixtures.hostile.hang_at_import:build", "--dry-run"]),
    ],
)
def test_an_import_that_hangs_is_cut_at_the_tools_timeout(tool, flags, capsys):
    """--timeout limits importing --adapters and --optimizer in every tool (it was 60 s whatever it said)."""
    import importlib

    code = importlib.import_module(f"cs336_systems.{tool}").main([*flags, "--device", "cpu", "--timeout", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "did not return within --timeout 1 s" in err and err.count("\n") == 1


def test_an_import_that_hung_is_not_waited_for_again_in_the_run(monkeypatch):
    """Each use waited the whole limit again: a rank runs many units, each group of ranks imports anew."""
    from cs336_systems import loading

    monkeypatch.delenv(loading.HUNG_IMPORTS_ENV, raising=False)
    with loading.hung_imports_shared():
        with pytest.raises(loading.UserImportError, match="did not return within"):
            loading.import_user_module("tests.fixtures.hostile.hang_at_import", timeout_s=0.5)
        with pytest.raises(loading.UserImportError, match="not tried again"):
            loading.import_user_module("tests.fixtures.hostile.hang_at_import", timeout_s=60)
    assert loading.HUNG_IMPORTS_ENV not in os.environ
    with pytest.raises(
        loading.UserImportError, match=r"did not return within --timeout 0.5 s"
    ):  # outside a run: tried again
        loading.import_user_module("tests.fixtures.hostile.hang_at_import", timeout_s=0.5)


def test_a_getter_that_hung_is_not_waited_for_again_in_the_run(tmp_path):
    """attention_bench asks the getter once per row: each row waited the whole limit again."""
    from cs336_systems import attention_bench
    from cs336_systems.results import read_results

    output = tmp_path / "rows.csv"
    flags = ["--adapters", str(REPO / "tests/fixtures/hostile/adapters_hang.py"), "--implementations", "flash-pytorch"]
    grid = ["--context-lengths", "16", "32", "--head-dims", "8", "--measure-steps", "2", "--device", "cpu"]
    assert attention_bench.main([*flags, *grid, "--timeout", "0.5", "--output", str(output)]) == 1
    errors = list(read_results(output)["error"])
    assert "did not return within --timeout 0.5 s" in errors[0] and "not tried again" not in errors[0]
    assert "(earlier in this run: not tried again)" in errors[1]


def test_an_optimizer_import_that_hangs_in_the_ranks_is_cut_at_the_limit_and_waited_for_once(tmp_path, monkeypatch):
    """ddp_bench's ranks inherit the command's import limit (here 1 s) and share the note of what hung."""
    from cs336_systems import ddp_bench
    from cs336_systems.results import read_results
    from cs336_systems.usercode import IMPORT_TIMEOUT_ENV

    monkeypatch.setenv(IMPORT_TIMEOUT_ENV, "1")
    csv = tmp_path / "rows.csv"
    flags = ["--optimizer", "tests.fixtures.hostile.hang_in_ranks:make", "--strategies", "naive", "--world-size", "2"]
    assert ddp_bench.main([*flags, "--device", "cpu", *TINY_DDP, "--output", str(csv)]) == 1
    rows = read_results(csv).set_index("strategy")
    assert set(rows["status"]) == {"error"}
    assert "did not return within --timeout 1 s" in rows.loc["single", "error"]
    assert rows.loc["naive", "error"].count("not tried again") == 2  # both ranks of the next unit, at once


def test_the_import_limit_is_inherited_by_the_processes_a_command_starts(monkeypatch):
    from cs336_systems.usercode import IMPORT_TIMEOUT_ENV, StepLimits, import_limit, import_limit_s

    monkeypatch.delenv(IMPORT_TIMEOUT_ENV, raising=False)
    read = [PYTHON, "-c", "from cs336_systems.usercode import import_limit_s; print(import_limit_s())"]
    with import_limit(2.5):
        assert import_limit_s() == 2.5
        assert subprocess.run(read, capture_output=True, text=True, env=child_env()).stdout.strip() == "2.5"
        with import_limit(StepLimits()):  # a child's own default keeps its parent's limit
            assert import_limit_s() == 2.5
    assert import_limit_s() == 60.0 and IMPORT_TIMEOUT_ENV not in os.environ


@pytest.mark.parametrize(
    "factory, message",
    [("exits_in_forward", r"called sys.exit\(0\)"), ("interrupts_in_forward", "KeyboardInterrupt itself")],
)
def test_benchmark_direct_sweep_gets_an_error_row_not_our_exit(tmp_path, factory, message):
    from cs336_systems import benchmark_direct

    output = tmp_path / "rows.jsonl"
    code = benchmark_direct.main(
        [
            *TINY_GRID,
            "--pass-types",
            "forward",
            "--model-factory",
            f"tests.fixtures.hostile.models:{factory}",
            "--output",
            str(output),
        ]
    )
    row = json.loads(output.read_text().splitlines()[-1])
    assert code == 1 and row["status"] == "error" and re.search(message, row["error"])


def test_under_an_address_space_cap_a_hang_no_handler_can_reach_is_still_ended():
    """No watchdog thread fits under --memory-limit: the reaper process ends the step instead."""
    script = textwrap.dedent(
        """
        import resource, signal, time
        from cs336_systems import usercode
        usercode.WATCHDOG_GRACE_S = 0.5
        with open("/proc/self/status") as status:
            mapped = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (mapped + 2**30, resource.RLIM_INFINITY))
        with usercode.guarded("my step", timeout_s=0.5):
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})  # the code blocks our alarm
            time.sleep(3600)
        """
    )
    result = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, timeout=60, env=child_env())
    assert result.returncode == -signal.SIGKILL, result.stderr
    assert "my step did not return within 0.5 s and could not be interrupted" in result.stderr
