"""Hostile inputs beyond a bad flag: a cluster's stale environment, flags that do not apply, wrong
numbers from the user's distributed code. Real child processes where a process must end."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch.distributed as dist

from cs336_systems import ddp_bench
from cs336_systems.results.writing import FAULT_ENV
from tests.helpers import PYTHON, REPO, child_env
from tests.tiny import STEPS, TINY_DDP, TINY_GRID

HOSTILE = REPO / "tests" / "fixtures" / "hostile"
TORCHRUN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")


def run_tool(module: str, *args: str, env: dict[str, str] | None = None, timeout: float = 120):
    variables = {k: v for k, v in child_env().items() if k not in TORCHRUN}
    variables.update(env or {})
    return subprocess.run(
        [PYTHON, "-m", module, *args], capture_output=True, text=True, cwd=REPO, env=variables, timeout=timeout
    )


def one_line_exit_2(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode == 2, result.stderr
    # the OpenMP runtime warns of a bad OMP_NUM_THREADS itself, as torch loads it: not our line
    ours = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("libgomp:")]
    assert len(ours) == 1 and "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word in result.stderr, result.stderr


STALE = dict(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29917")
ALLREDUCE = ["--sizes", "1KB", *STEPS, "--init-timeout", "1"]


@pytest.mark.skipif(not dist.is_gloo_available(), reason="needs torch.distributed with gloo")
@pytest.mark.parametrize(
    "env, words",
    [
        ({**STALE, "RANK": "2"}, ["RANK=2 must be from 0 to 1 (below WORLD_SIZE=2)", "unset RANK"]),
        ({**STALE, "WORLD_SIZE": "two"}, ["WORLD_SIZE='two' is not an integer"]),
        ({**STALE, "MASTER_PORT": "70000"}, ["MASTER_PORT=70000 must be from 1 to 65535"]),
        ({**STALE, "WORLD_SIZE": "1", "OMP_NUM_THREADS": "lots"}, ["environment variable OMP_NUM_THREADS='lots'"]),
        (STALE, ["no rendezvous with the other 1 rank(s) at 127.0.0.1:29917 within --init-timeout 1 s"]),
        ({**STALE, "RANK": "1", "LOCAL_RANK": "1"}, ["no rendezvous", "--init-timeout 1 s"]),
    ],
)
def test_a_stale_or_inconsistent_torchrun_environment_is_one_line(env, words):
    port = 29917 + os.getpid() % 1000  # a port no test of another worker listens on
    env = {**env, "MASTER_PORT": env["MASTER_PORT"] if env["MASTER_PORT"] != "29917" else str(port)}
    words = [word.replace("29917", str(port)) for word in words]
    result = run_tool("cs336_systems.allreduce_bench", *ALLREDUCE, env=env, timeout=90)
    one_line_exit_2(result, *words)


@pytest.mark.parametrize("value", ["1e300", "0", "nan", "inf"])
def test_absurd_init_timeouts_are_refused(capsys, value):
    with pytest.raises(SystemExit) as exit_info:
        ddp_bench.main(["--init-timeout", value])
    assert exit_info.value.code == 2
    assert "argument --init-timeout: must be more than 0 and at most" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, flag",
    [
        (["--strategies", "naive", "--bucket-cap-mb", "25"], "--bucket-cap-mb"),
        (["--strategies", "ddp", "flat", "--fsdp-compute-dtype", "bf16"], "--fsdp-compute-dtype"),
    ],
)
def test_ddp_bench_refuses_a_flag_no_chosen_strategy_uses(capsys, flags, flag):
    assert ddp_bench.main(["--world-sizes", "2", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{flag} applies only to --strategies" in err, err


@pytest.mark.skipif(not dist.is_gloo_available(), reason="needs torch.distributed with gloo")
@pytest.mark.parametrize("check", [True, False])
def test_ddp_nan_gradients_are_wrong_not_ok(tmp_path, check):
    output = tmp_path / "ddp.jsonl"
    result = run_tool(
        "cs336_systems.ddp_bench",
        "--world-sizes",
        "2",
        "--strategies",
        "adapter-ddp",
        "--adapters",
        str(HOSTILE / "adapters_nan.py"),
        *TINY_DDP,
        "--output",
        str(output),
        *([] if check else ["--no-check"]),
        timeout=240,
    )
    rows = {row["strategy"]: row for row in map(json.loads, output.read_text().splitlines())}
    assert result.returncode == 1, result.stderr
    assert rows["single"]["status"] == "ok"
    assert rows["adapter-ddp"]["status"] == "wrong" and "NaN" in rows["adapter-ddp"]["error"]
    assert rows["adapter-ddp"]["mean_ms"] is None


RESIDUALS = [
    "--no-compile",
    "--no-model",
    "--d-model",
    "16",
    "--num-layers",
    "1",
    "--num-heads",
    "2",
    "--d-ff",
    "32",
    "--vocab-size",
    "50",
]


def test_residuals_context_past_the_models_maximum_is_one_line(capsys):
    from cs336_systems import residuals

    assert residuals.main([*RESIDUALS, "--context-length", "64", "--max-context-length", "32"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--context-length 64 is longer than the model supports" in err


def test_residuals_a_size_that_cannot_be_allocated_is_an_oom_result(capsys):
    from cs336_systems import residuals

    # 1e6 x 1e5 tokens x 64 fp32: 25.6 TB, refused by the allocator at once (nothing is touched)
    args = ["--batch-size", "1000000", "--context-length", "100000", "--max-context-length", "100000"]
    assert residuals.main([*RESIDUALS, *args, "--d-model", "64"]) == 0  # oom is a result, by the one exit rule
    out, err = capsys.readouterr()
    assert err.startswith("size table 2026 (")  # the run's first line, then the oom in one line
    assert err.count("\n") == 2 and "oom: batch 1000000 x context 100000" in err and "can't allocate" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("optimizer, noted", [("tests.fixtures.hostile.optimizers:does_nothing", True), (None, False)])
def test_an_optimizer_that_updates_nothing_gets_a_note(optimizer, noted):
    from cs336_systems.runner import OPTIMIZER_UNCHANGED_NOTE, run_benchmark
    from tests.helpers import tiny_benchmark_config

    config = tiny_benchmark_config(pass_type="train-step", optimizer_factory=optimizer, measure_steps=2)
    record = run_benchmark(config)
    assert record.status == "ok", record.error
    assert (OPTIMIZER_UNCHANGED_NOTE in (record.notes or "")) is noted


def test_monitor_plot_title_shows_a_command_with_dollars_as_text(tmp_path, capsys):
    from cs336_systems import monitor

    csv = tmp_path / "run.csv"
    status = monitor.main(["--monitor-interval", "0.05", "--output", str(csv), "--", "bash", "-c", "echo $$ # $\\foo$"])
    assert status == 0, capsys.readouterr().err
    assert csv.with_suffix(".png").stat().st_size > 0 and csv.with_suffix(".json").exists()


IGNORES_SIGTERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(120)"
)


def test_monitor_under_sigterm_kills_a_command_that_ignores_it(tmp_path):
    import signal
    import time

    from cs336_systems.monitor.cli import KILL_GRACE_S

    csv = tmp_path / "run.csv"
    monitor = subprocess.Popen(
        [
            PYTHON,
            "-m",
            "cs336_systems.monitor",
            "--monitor-interval",
            "0.1",
            "--kill-grace",
            "2",
            "--output",
            str(csv),
            "--",
            PYTHON,
            "-c",
            IGNORES_SIGTERM,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=child_env(),
    )
    try:
        assert monitor.stdout.readline().strip() == "ready"
        command_pid = int(subprocess.check_output(["pgrep", "-P", str(monitor.pid)], text=True).split()[0])
        started = time.monotonic()
        monitor.send_signal(signal.SIGTERM)
        assert monitor.wait(timeout=KILL_GRACE_S + 30) == 128 + signal.SIGKILL
        assert time.monotonic() - started > 2 - 0.5  # --kill-grace, not the default KILL_GRACE_S
    finally:
        monitor.kill()
        monitor.wait()
    with pytest.raises(ProcessLookupError):
        os.kill(command_pid, 0)
    assert csv.with_suffix(".json").exists()


def test_monitor_on_a_full_disk_keeps_its_summary_and_exits_143_on_sigterm(tmp_path):
    import signal

    csv = tmp_path / "run.csv"
    sleeper = "import time; print('ready', flush=True); time.sleep(60)"
    monitor = subprocess.Popen(
        [PYTHON, "-m", "cs336_systems.monitor", "--monitor-interval", "0.1", "--output", str(csv), "--"]
        + [PYTHON, "-c", sleeper],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**child_env(), FAULT_ENV: "full"},  # every write fails with ENOSPC
    )
    try:
        assert monitor.stdout.readline().strip() == "ready"
        monitor.send_signal(signal.SIGTERM)
        _, stderr = monitor.communicate(timeout=60)
    finally:
        monitor.kill()
    assert monitor.returncode == 143, stderr
    assert "Traceback" not in stderr and "samples every 0.1 s" in stderr  # the summary, on stderr
    errors = [line for line in stderr.splitlines() if line.startswith("python -m cs336_systems.monitor: error:")]
    assert errors and all("No space left on device" in line for line in errors)


def _gone(pid: int, within_s: float = 10.0) -> bool:
    """The process ended (a zombie waiting for init to reap it counts as ended)."""
    import time

    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                if handle.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.2)
    return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_run_benchmarks_ends_a_helper_process_the_users_model_started(tmp_path):
    pidfile, output = tmp_path / "helpers.txt", tmp_path / "rows.jsonl"
    result = run_tool(
        "cs336_systems.run_benchmarks",
        *TINY_GRID,
        "--pass-types",
        "forward",
        "--model-factory",
        "tests.fixtures.hostile.models:starts_helper",
        "--output",
        str(output),
        env={"HOSTILE_HELPER_PIDFILE": str(pidfile)},
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(output.read_text().splitlines()[-1])["status"] == "ok"
    helpers = [int(line) for line in pidfile.read_text().split()]
    assert helpers and all(_gone(pid) for pid in helpers)


# -- StepProbe never harms the loop it observes --------------------------------------------------


def _probe(tmp_path, lines, **kwargs):
    from cs336_systems.probe import StepProbe

    return StepProbe(
        "cpu",
        output=tmp_path / "probe.csv",
        outputs=[tmp_path / "probe.md"],
        window=2,
        print_fn=lines.append,
        environment=None,
        **kwargs,
    )


def _full_disk(*args, **kwargs):
    import errno

    raise OSError(errno.ENOSPC, "No space left on device")


def test_probe_write_failure_is_told_once_and_measuring_goes_on(tmp_path, monkeypatch):
    lines: list[str] = []
    probe = _probe(tmp_path, lines)
    monkeypatch.setattr(probe._sink, "write", _full_disk)
    monkeypatch.setattr("pathlib.Path.write_text", _full_disk)
    for _ in range(6):  # three windows, each a failed write
        with probe.phase("forward"):
            pass
        probe.step()
    probe.close()
    errors = [line for line in lines if line.startswith("probe: error")]
    assert len(errors) == 1 and "No space left on device" in errors[0]
    assert len(probe.records) == 3 and probe.records[-1].steps == 2  # three full windows, nothing lost


def test_probe_never_hides_the_users_exception_and_lets_go_of_its_lock(tmp_path, monkeypatch):
    from cs336_systems.results import ResultSink

    lines: list[str] = []
    probe = _probe(tmp_path, lines)
    monkeypatch.setattr(probe._sink, "write", _full_disk)
    with pytest.raises(ValueError, match="the user's own"), probe:
        probe.step()
        raise ValueError("the user's own")
    ResultSink([tmp_path / "probe.csv"]).close()  # the lock was let go on close()


def test_probe_ranks_share_an_output_each_in_its_own_file(tmp_path, monkeypatch):
    import torch.distributed

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 1)
    lines: list[str] = []
    probe = _probe(tmp_path, lines)
    probe.step()
    probe.close()
    assert (tmp_path / "probe.rank1.csv").exists() and not (tmp_path / "probe.csv").exists()
