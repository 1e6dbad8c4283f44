import json
import math

import pandas as pd
import pytest
import torch

from cs336_systems.results import (
    BENCHMARK_FIELDS,
    MARKDOWN_COLUMNS,
    ResultFileError,
    ResultSink,
    checkout_state,
    collect_environment,
    read_results,
    render_markdown,
)
from cs336_systems.runner import run_benchmark
from tests.conftest import tiny_benchmark_config


@pytest.fixture(scope="module")
def records():
    ok = run_benchmark(tiny_benchmark_config(pass_type="forward"))
    unsupported = run_benchmark(tiny_benchmark_config(precision="tf32"))
    return [ok, unsupported]


def test_environment_is_recorded(records):
    row = records[0].to_row()
    for name in (
        "torch_version",
        "device_name",
        "hostname",
        "git_commit",
        "timestamp",
        "matmul_precision",
        "cuda_matmul_allow_tf32",
        "cudnn_allow_tf32",
        "num_threads",
        "python_version",
    ):
        assert name in row
    assert row["torch_version"] == torch.__version__
    assert collect_environment(torch.device("cpu")).num_threads == torch.get_num_threads()


def test_csv_round_trip_appends_header_once(tmp_path, records):
    path = tmp_path / "r.csv"
    sink = ResultSink([path])
    for record in records:
        sink.write(record)
    ResultSink([path]).write(records[0])  # a later run appends to the same file
    assert path.read_text().count("model_size,") == 1
    frame = read_results(path)
    assert list(frame.columns) == list(BENCHMARK_FIELDS)
    assert len(frame) == 3
    first = records[0].to_row()
    for name in ("model_size", "num_params", "context_length", "pass_type", "status", "torch_version"):
        assert frame.loc[0, name] == first[name]
    for name in ("mean_ms", "std_ms", "cv_pct", "p90_ms", "tokens_per_s"):
        assert frame.loc[0, name] == pytest.approx(first[name], rel=1e-12)
    assert frame.loc[1, "status"] == "unsupported" and math.isnan(frame.loc[1, "mean_ms"])


def test_csv_with_other_columns_is_refused(tmp_path, records):
    path = tmp_path / "r.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(ResultFileError, match="different columns"):
        ResultSink([path])


def test_jsonl_round_trip_keeps_raw_samples(tmp_path, records):
    path = tmp_path / "r.jsonl"
    sink = ResultSink([path])
    for record in records:
        sink.write(record)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["step_ms"] == records[0].step_ms
    assert lines[0]["warmup_step_ms"] == records[0].warmup_step_ms
    frame = read_results(path)
    assert frame.loc[0, "mean_ms"] == pytest.approx(records[0].mean_ms)
    assert frame.loc[1, "error"] == records[1].error


def test_markdown_round_trip(tmp_path, records):
    path = tmp_path / "r.md"
    sink = ResultSink([path])
    sink.write(records[0])
    sink.write(records[1])
    text = path.read_text()
    assert "Environment:" in text and "sample standard deviation (ddof=1)" in text
    assert "status unsupported" in text
    frame = read_results(path)
    assert list(frame.columns) == list(MARKDOWN_COLUMNS)
    row = records[0].to_row()
    assert frame.loc[0, "model_size"] == row["model_size"]
    assert frame.loc[0, "num_params"] == row["num_params"]
    assert frame.loc[0, "mean_ms"] == pytest.approx(row["mean_ms"], abs=5e-4)
    assert frame.loc[0, "cv_pct"] == pytest.approx(row["cv_pct"], abs=0.05)
    assert frame.loc[1, "status"] == "unsupported" and pd.isna(frame.loc[1, "mean_ms"])


def test_markdown_warns_about_noise():
    row = {
        "model_size": "small",
        "context_length": 128,
        "pass_type": "forward",
        "precision": "fp32",
        "status": "ok",
        "cv_pct": 12.5,
        "mean_ms": 1.0,
    }
    assert "high variance, CV 12.5% > 10%" in render_markdown([row])
    assert "high variance" not in render_markdown([{**row, "cv_pct": 9.0}])


def test_unknown_output_suffix(tmp_path):
    with pytest.raises(ResultFileError, match="unknown suffix"):
        ResultSink([tmp_path / "r.xlsx"])


def test_output_directories_are_created(tmp_path, records):
    path = tmp_path / "deep" / "er" / "r.csv"
    ResultSink([path]).write(records[0])
    assert path.exists()


def test_checkout_is_dirty_only_for_changes_outside_outputs(tmp_path):
    import shutil
    import subprocess

    if shutil.which("git") is None:
        pytest.skip("git not installed")

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "sweep.csv").write_text("a\n1\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    commit, dirty = checkout_state(tmp_path)
    assert len(commit) == 40 and dirty is False
    (tmp_path / "results" / "sweep.csv").write_text("a\n2\n")  # a regenerated result
    (tmp_path / "new_untracked.py").write_text("")
    assert checkout_state(tmp_path) == (commit, False)
    (tmp_path / "code.py").write_text("x = 2\n")
    assert checkout_state(tmp_path) == (commit, True)
    assert checkout_state(tmp_path / "results") == ("unknown", None)
