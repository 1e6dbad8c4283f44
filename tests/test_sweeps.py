"""benchmark_direct, run_benchmarks and find_max on tiny models (CPU)."""

import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from cs336_systems import benchmark_direct, run_benchmarks
from cs336_systems.argtypes import ArgumentParser
from cs336_systems.results import BenchmarkRecord
from cs336_systems.sweep import Abort, StopRequest, add_grid_arguments, grid_from_args
from tests.helpers import PYTHON, child_env, scaled_timeout
from tests.tiny import TINY_SWEEP

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memory caps need RLIMIT_AS")

# naive attention at context 2048, batch 16: the scores alone are 16*2*2048^2*4 B = 512 MiB
OOM_GRID = [
    *TINY_SWEEP,
    "--attention",
    "naive",
    "--attentions",
    "naive",
    "--context-lengths",
    "16",
    "2048",
    "32",
    "--batch-sizes",
    "16",
]


def cli(module, *args, timeout=240, **kwargs):
    return subprocess.run(
        [PYTHON, "-m", module, *args], capture_output=True, text=True, env=child_env(), timeout=timeout, **kwargs
    )


def test_grid_order_and_each_configuration_once():
    parser = ArgumentParser(prog="test")
    add_grid_arguments(parser)
    args = parser.parse_args(
        [
            *TINY_SWEEP,
            "--model-sizes",
            "small",
            "--precisions",
            "fp32",
            "bf16",
            "--context-lengths",
            "32",
            "16",
            "32",
            "--pass-types",
            "forward",
            "forward-backward",
        ]
    )
    configs = grid_from_args(args, torch.device("cpu"))
    assert [(c.precision, c.context_length, c.pass_type) for c in configs] == [
        (precision, context, pass_type)
        for precision in ("fp32", "bf16")
        for context in (32, 16)
        for pass_type in ("forward", "forward-backward")
    ]
    assert {c.model.context_length for c in configs} == {32}  # one model for every context


def test_benchmark_direct_goes_on_after_a_real_oom(tmp_path):
    out = tmp_path / "direct.csv"
    result = cli(
        "cs336_systems.memory_cap", str(300 * 2**20), "cs336_systems.benchmark_direct", *OOM_GRID, "--output", str(out)
    )
    assert result.returncode == 0, result.stderr
    rows = pd.read_csv(out)
    assert list(rows["context_length"]) == [16, 2048, 32]  # grid order
    assert list(rows["status"]) == ["ok", "oom", "ok"]
    assert "can't allocate memory" in rows["error"][1]


def test_run_benchmarks_goes_on_after_a_real_oom(tmp_path):
    out = tmp_path / "children.csv"
    result = cli("cs336_systems.run_benchmarks", *OOM_GRID, "--memory-limit", "300MB", "--output", str(out))
    assert result.returncode == 0, result.stderr
    rows = pd.read_csv(out)
    assert list(rows["status"]) == ["ok", "oom", "ok"]
    assert rows["notes"].str.contains("ran under --memory-limit 286.10 MiB").all()  # the OOM is the cap's


def _gone(pid: int) -> bool:
    """Not running: no such process, or a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _wait_for_pids(path: Path, process: subprocess.Popen | None = None, seconds: float = 60) -> list[int]:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline and (process is None or process.poll() is None)
        time.sleep(0.05)
    return [int(pid) for pid in path.read_text().split()]


def test_a_hanging_configuration_hits_the_timeout_and_its_processes_die(tmp_path, fixtures_on_path, monkeypatch):
    out, pids = tmp_path / "hang.jsonl", tmp_path / "pids"
    monkeypatch.setenv("CS336_TEST_PIDS", str(pids))
    code = run_benchmarks.main(
        [
            *TINY_SWEEP,
            "--model-factory",
            "user_models:hangs_with_a_child",
            "--context-lengths",
            "8",
            "--timeout",
            limit := scaled_timeout(6),  # the child starts, builds and writes its pids first
            "--output",
            str(out),
        ]
    )
    assert code == 1  # a timeout row exits 1 (argtypes.exit_status)
    row = json.loads(out.read_text())
    assert row["status"] == "timeout" and f"--timeout {limit}" in row["error"]
    assert row["model_factory"] == "user_models:hangs_with_a_child" and row["torch_version"]
    child, grandchild = _wait_for_pids(pids, seconds=1)  # written before the hang, so before the timeout
    assert _gone(child) and _gone(grandchild)  # the whole process group was killed


def test_sigterm_kills_the_running_child_and_says_how_to_resume(tmp_path):
    out, pids = tmp_path / "term.csv", tmp_path / "pids"
    process = subprocess.Popen(
        [
            PYTHON,
            "-m",
            "cs336_systems.run_benchmarks",
            *TINY_SWEEP,
            "--model-factory",
            "user_models:hangs_with_a_child",
            "--context-lengths",
            "8",
            "--output",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**child_env(), "CS336_TEST_PIDS": str(pids)},
    )
    child, grandchild = _wait_for_pids(pids, process)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert "Resume with:" in stderr and "Traceback" not in stderr
    deadline = time.monotonic() + 10
    while not (_gone(child) and _gone(grandchild)):  # no orphan left holding memory
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_second_interrupt_while_a_row_is_written_waits_for_the_row():
    stop = StopRequest()
    with pytest.raises(Abort), stop.writing():
        stop._handle(signal.SIGINT, None)
        assert stop.requested  # the first: stop after this configuration
        stop._handle(signal.SIGINT, None)  # the second: abort, but not mid-row
        finished = True
    assert finished and stop.exit_status == 130
    with pytest.raises(Abort):
        stop._handle(signal.SIGINT, None)  # outside a write: at once


def test_a_crashing_child_is_an_error_row_with_its_stderr(tmp_path, fixtures_on_path):
    out = tmp_path / "crash.csv"
    code = run_benchmarks.main(
        [*TINY_SWEEP, "--model-factory", "user_models:segfaults", "--context-lengths", "8", "16", "--output", str(out)]
    )
    rows = pd.read_csv(out)
    # the sweep went on after the crash; error rows make the exit status 1 (argtypes.exit_status)
    assert code == 1 and list(rows["status"]) == ["error", "error"]
    error = rows["error"][0]
    assert "child killed by signal SIGSEGV" in error and "about to dereference a null pointer" in error
    assert rows["torch_version"][0] and rows["model_factory"][0] == "user_models:segfaults"


def test_a_child_that_fails_cleanly_keeps_its_own_error_row(tmp_path, fixtures_on_path, capsys):
    out = tmp_path / "wrong.csv"
    code = run_benchmarks.main(
        [*TINY_SWEEP, "--model-factory", "user_models:fails_in_step", "--context-lengths", "8", "--output", str(out)]
    )
    row = pd.read_csv(out).iloc[0]
    assert code == 1 and row["status"] == "error" and "my step is broken" in row["error"]
    # the log says how to run the failed configuration alone; pasted, it fails the same way
    err = capsys.readouterr().err
    command = shlex.split(err.split("run it alone with\n", 1)[1].splitlines()[0])
    assert command[:4] == ["python", "-m", "cs336_systems.benchmark", "--config"]
    alone = subprocess.run([PYTHON, *command[1:]], capture_output=True, text=True, env=child_env(), timeout=120)
    assert alone.returncode == 1 and "my step is broken" in alone.stderr


def _lines(path) -> int:
    """Lines in `path` now; 0 while it is absent (the output check creates and removes it once
    before the run starts, so it may vanish between two looks)."""
    try:
        return len(path.read_text().splitlines())
    except FileNotFoundError:
        return 0


@pytest.mark.parametrize("module", ["cs336_systems.benchmark_direct", "cs336_systems.run_benchmarks"])
def test_interrupted_then_resumed_has_every_row_once_in_grid_order(tmp_path, module):
    out, md = tmp_path / "sweep.csv", tmp_path / "sweep.md"
    grid = [
        *TINY_SWEEP,
        "--model-factory",
        "user_models:slow",
        "--context-lengths",
        "8",
        "16",
        "24",
        "--output",
        str(out),
        "--output",
        str(md),
    ]
    process = subprocess.Popen(
        [PYTHON, "-m", module, *grid], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env()
    )
    deadline = time.monotonic() + 120
    while _lines(out) < 2:  # header + first row
        assert time.monotonic() < deadline and process.poll() is None, process.communicate()
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "Resume with:" in stderr and "--resume" in stderr
    done = pd.read_csv(out)
    assert 1 <= len(done) < 3

    again = cli(module, *grid)
    assert again.returncode == 2 and "pass --resume" in again.stderr  # never twice by accident
    resumed = cli(module, *grid, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    rows = pd.read_csv(out)
    assert list(rows["context_length"]) == [8, 16, 24]
    assert len({BenchmarkRecord.row_key(row) for row in rows.to_dict("records")}) == 3
    assert (
        rows[list(BenchmarkRecord.identity_fields())]
        .iloc[: len(done)]
        .equals(done[list(BenchmarkRecord.identity_fields())])
    )
    assert md.read_text().count("| custom ") == 3  # the Markdown rendering has all rows too


def test_find_max_finds_the_boundary_under_a_memory_cap(tmp_path):
    summary = tmp_path / "max.json"
    result = cli(
        "cs336_systems.find_max",
        *TINY_SWEEP,
        "--dimension",
        "batch-size",
        "--context-length",
        "512",
        "--attention",
        "naive",
        "--memory-limit",
        "150MB",  # the boundary near --start: about four probes
        "--start",
        "4",
        "--summary",
        str(summary),
        "--output",
        str(tmp_path / "probes.csv"),
    )
    assert result.returncode == 0, result.stderr
    answer = json.loads(summary.read_text())
    assert answer["smallest_oom"] == answer["largest_ok"] + 1
    probes = pd.read_csv(tmp_path / "probes.csv")
    assert set(probes["status"]) == {"ok", "oom"}
    assert (probes[probes["status"] == "ok"]["batch_size"] <= answer["largest_ok"]).all()
    assert f"largest batch-size that runs: {answer['largest_ok']}" in result.stdout


def test_direct_sweep_of_error_rows_exits_1_and_aliases_work(tmp_path, fixtures_on_path):
    out = tmp_path / "wrong.csv"
    code = benchmark_direct.main(
        [
            *TINY_SWEEP,
            "--model-factory",
            "user_models:fails_in_step",
            "--context-length",
            "8",
            "--batch-size",
            "2",
            "3",
            "--output",
            str(out),
        ]
    )
    rows = pd.read_csv(out)
    assert code == 1 and list(rows["status"]) == ["error", "error"] and list(rows["batch_size"]) == [2, 3]


@pytest.mark.parametrize(
    ("module", "args", "message"),
    [
        (benchmark_direct, ["--model-sizes", "huge"], "unknown model size 'huge'"),
        (benchmark_direct, ["--context-lengths", "0"], "must be a positive integer"),
        (benchmark_direct, ["--compile", "sometimes"], "invalid choice"),
        (run_benchmarks, ["--memory-limit", "lots"], "not a size"),
        (run_benchmarks, ["--timeout", "-1"], "--timeout: must be more than 0"),
        (run_benchmarks, ["--timeout", "1e20"], "at most 604800 seconds"),
        (
            benchmark_direct,
            ["--context-lengths", "64", "--max-context-length", "32"],
            "longer than --max-context-length",
        ),
    ],
)
def test_sweep_cli_errors(capsys, module, args, message):
    try:
        code = module.main([*TINY_SWEEP, *args])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err
