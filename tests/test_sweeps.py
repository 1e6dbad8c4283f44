"""benchmark_direct, run_benchmarks and find_max on tiny models (CPU)."""

import json
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from cs336_systems import benchmark_direct, run_benchmarks
from cs336_systems.benchmark import build_parser, config_from_args
from cs336_systems.cli import config_to_args
from cs336_systems.find_max import search
from cs336_systems.results import CONFIG_FIELDS
from cs336_systems.sweep import row_key
from tests.conftest import PYTHON, child_env, tiny_benchmark_config

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memory caps need RLIMIT_AS")

TINY = [
    "--d-model",
    "32",
    "--d-ff",
    "64",
    "--num-layers",
    "2",
    "--num-heads",
    "2",
    "--vocab-size",
    "97",
    "--device",
    "cpu",
    "--warmup-steps",
    "1",
    "--measure-steps",
    "2",
    "--peak-tflops",
    "1",
]
# naive attention at context 2048, batch 16: the scores alone are 16*2*2048^2*4 B = 512 MiB
OOM_GRID = [
    *TINY,
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


def test_config_round_trips_through_cli_flags():
    config = tiny_benchmark_config(
        pass_type="train-step", precision="bf16", compile=True, compile_scope="blocks", peak_tflops=2.5, seed=7
    )
    parsed = config_from_args(build_parser().parse_args(config_to_args(config)))
    assert parsed == config


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


def test_a_hanging_configuration_hits_the_timeout(tmp_path, fixtures_on_path):
    out = tmp_path / "hang.jsonl"
    start = time.monotonic()
    code = run_benchmarks.main(
        [
            *TINY,
            "--model-factory",
            "user_models:hangs",
            "--context-lengths",
            "8",
            "--timeout",
            "8",
            "--output",
            str(out),
        ]
    )
    assert code == 0 and time.monotonic() - start < 60
    row = json.loads(out.read_text())
    assert row["status"] == "timeout" and "--timeout 8" in row["error"]
    assert row["model_factory"] == "user_models:hangs" and row["torch_version"]


def test_a_crashing_child_is_an_error_row_with_its_stderr(tmp_path, fixtures_on_path):
    out = tmp_path / "crash.csv"
    code = run_benchmarks.main(
        [*TINY, "--model-factory", "user_models:wrong_shape", "--context-lengths", "8", "--output", str(out)]
    )
    row = pd.read_csv(out).iloc[0]
    assert code == 0 and row["status"] == "error" and "expected floating (B, T, V)" in row["error"]


@pytest.mark.parametrize("module", ["cs336_systems.benchmark_direct", "cs336_systems.run_benchmarks"])
def test_interrupted_then_resumed_has_every_row_once_in_grid_order(tmp_path, module):
    out, md = tmp_path / "sweep.csv", tmp_path / "sweep.md"
    grid = [
        *TINY,
        "--model-factory",
        "user_models:slow",
        "--context-lengths",
        "8",
        "16",
        "24",
        "32",
        "--output",
        str(out),
        "--output",
        str(md),
    ]
    process = subprocess.Popen(
        [PYTHON, "-m", module, *grid], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env()
    )
    deadline = time.monotonic() + 120
    while not (out.exists() and len(out.read_text().splitlines()) >= 2):  # header + first row
        assert time.monotonic() < deadline and process.poll() is None, process.communicate()
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "Resume with:" in stderr and "--resume" in stderr
    done = pd.read_csv(out)
    assert 1 <= len(done) < 4

    again = cli(module, *grid)
    assert again.returncode == 2 and "pass --resume" in again.stderr  # never twice by accident
    resumed = cli(module, *grid, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    rows = pd.read_csv(out)
    assert list(rows["context_length"]) == [8, 16, 24, 32]
    assert len({row_key(row) for row in rows.to_dict("records")}) == 4
    assert rows[list(CONFIG_FIELDS)].iloc[: len(done)].equals(done[list(CONFIG_FIELDS)])
    assert md.read_text().count("| custom ") == 4  # the Markdown rendering has all rows too


def test_find_max_finds_the_boundary_under_a_memory_cap(tmp_path):
    summary = tmp_path / "max.json"
    result = cli(
        "cs336_systems.find_max",
        *TINY,
        "--dimension",
        "batch-size",
        "--context-length",
        "512",
        "--attention",
        "naive",
        "--memory-limit",
        "300MB",
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


def test_search_logic_without_processes():
    statuses = []

    def probe(value):
        statuses.append(value)
        return "ok" if value <= 37 else "oom"

    result = search(probe, start=1, maximum=1000, resolution=1, dimension="batch-size")
    assert (result.largest_ok, result.smallest_oom) == (37, 38)
    assert statuses[:7] == [1, 2, 4, 8, 16, 32, 64]
    assert search(lambda v: "oom", 4, 100, 1, "b").stopped_because == "even --start 4 runs out of memory"
    assert "reached --max 8" in search(lambda v: "ok", 1, 8, 1, "b").stopped_because
    assert "'error'" in search(lambda v: "error", 1, 8, 1, "b").stopped_because


@pytest.mark.parametrize(
    ("module", "args", "message"),
    [
        (benchmark_direct, ["--model-sizes", "huge"], "unknown model size 'huge'"),
        (benchmark_direct, ["--context-lengths", "0"], "must be a positive integer"),
        (benchmark_direct, ["--compile", "sometimes"], "invalid choice"),
        (run_benchmarks, ["--memory-limit", "lots"], "not a size"),
        (run_benchmarks, ["--timeout", "-1"], "--timeout must be positive"),
        (
            benchmark_direct,
            ["--context-lengths", "64", "--max-context-length", "32"],
            "longer than --max-context-length",
        ),
    ],
)
def test_sweep_cli_errors(capsys, module, args, message):
    try:
        code = module.main([*TINY, *args])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err
