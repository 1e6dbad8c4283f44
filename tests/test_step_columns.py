"""What a row says about its step, through the runner and the CLIs: per-phase times in every row,
the profiled step after the timed ones, --compile-mode recorded, --cuda-graphs refused without CUDA."""

import json

import pytest
import torch

from cs336_systems import benchmark, cuda_graphs, run_benchmarks, runner
from cs336_systems.models import ConfigError
from cs336_systems.results import BenchmarkRecord
from tests.helpers import run_main, tiny_benchmark_config
from tests.tiny import TINY


@pytest.mark.parametrize(
    ("pass_type", "phases"),
    [
        ("forward", ["forward"]),
        ("forward-backward", ["forward", "backward"]),
        ("train-step", ["forward", "backward", "optimizer"]),
    ],
)
def test_every_row_has_its_phases_from_the_measured_steps(pass_type, phases):
    record = runner.run_benchmark(tiny_benchmark_config(pass_type=pass_type, measure_steps=4, profile_step=False))
    assert record.status == "ok", record.error
    for name in ("forward", "backward", "optimizer"):
        samples, mean, median = (
            getattr(record, f"{name}{suffix}") for suffix in ("_samples_ms", "_mean_ms", "_median_ms")
        )
        if name in phases:
            assert len(samples) == 4 and mean == pytest.approx(sum(samples) / 4) and 0 < median <= max(samples)
        else:
            assert samples == [] and mean is None and median is None
    for index, step_ms in enumerate(record.step_ms):
        phase_sum = sum(getattr(record, f"{name}_samples_ms")[index] for name in phases)
        assert phase_sum <= step_ms
    assert record.kernels_per_step is None and record.device_busy_pct is None and record.top_kernels == []


def test_profiled_step_runs_after_the_timed_steps(monkeypatch):
    calls = []
    time_steps, profile_step = runner.time_steps, runner.profile_step

    def timed(*args, **kwargs):
        times = time_steps(*args, **kwargs)
        calls.append(("timed", len(times.measured_ms)))
        return times

    def profiled(*args, **kwargs):
        calls.append(("profiled", kwargs["step_ms"]))
        return profile_step(*args, **kwargs)

    monkeypatch.setattr(runner, "time_steps", timed)
    monkeypatch.setattr(runner, "profile_step", profiled)
    record = runner.run_benchmark(tiny_benchmark_config(pass_type="train-step", measure_steps=3))
    assert record.status == "ok", record.error
    assert calls == [("timed", 3), ("profiled", record.median_ms)]  # after, and over the measured median
    assert len(record.step_ms) == 3 and record.kernels_per_step > 100 and record.device_busy_pct is None
    assert record.top_kernels and {"name", "calls", "total_ms", "step_ms", "ahead_of_next"} <= set(
        record.top_kernels[0]
    )


def test_cli_writes_the_new_columns_and_no_profile_step_turns_the_step_off(capsys, tmp_path):
    on, off = tmp_path / "on.jsonl", tmp_path / "off.jsonl"
    profiled = [flag for flag in TINY if flag != "--no-profile-step"]
    assert run_main(benchmark.main, capsys, *profiled, "--pass-type", "train-step", "--output", str(on))[0] == 0
    assert run_main(benchmark.main, capsys, *TINY, "--pass-type", "train-step", "--output", str(off))[0] == 0
    assert "--no-profile-step" in TINY
    row_on, row_off = (json.loads(path.read_text()) for path in (on, off))
    assert row_on["kernels_per_step"] > 100 and row_on["top_kernels"] and row_on["device_busy_pct"] is None
    assert row_off["kernels_per_step"] is None and row_off["top_kernels"] == []
    for row in (row_on, row_off):
        assert len(row["optimizer_samples_ms"]) == 2 and row["forward_mean_ms"] > 0 and row["cuda_graphs"] is False


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune-no-cudagraphs"])
def test_compile_mode_reaches_torch_compile_and_is_recorded(capsys, tmp_path, monkeypatch, mode):
    modes = []

    def fake_compile(model, mode=None, **kwargs):
        modes.append(mode)
        return model  # eager: this test is about the plumbing, not the compiler

    monkeypatch.setattr(torch, "compile", fake_compile)
    out = tmp_path / "rows.jsonl"
    code, _, err = run_main(
        benchmark.main, capsys, *TINY, "--compile-mode", mode, "--compile-scope", "blocks", "--output", str(out)
    )
    assert code == 0, err
    row = json.loads(out.read_text())
    assert row["compile"] is True and row["compile_mode"] == mode and row["compile_scope"] == "blocks"
    assert modes == [mode, mode]  # one per block (TINY has 2)


def test_an_uncompiled_row_has_no_compile_mode():
    uncompiled = BenchmarkRecord.for_config(tiny_benchmark_config(), torch.device("cpu"), None, None)
    assert uncompiled.compile_mode is None and uncompiled.cuda_graphs is False


@pytest.mark.skipif(torch.cuda.is_available(), reason="refused only without CUDA")
def test_cuda_graphs_without_cuda_is_one_line_and_exit_2(capsys, tmp_path):
    code, out, err = run_main(benchmark.main, capsys, *TINY, "--cuda-graphs")
    assert code == 2 and out == "" and err.count("\n") == 1 and "--cuda-graphs needs a CUDA device" in err
    code = run_benchmarks.main([*TINY, "--cuda-graphs", "--output", str(tmp_path / "x.csv")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--cuda-graphs needs a CUDA device" in err
    assert not (tmp_path / "x.csv").exists()


def test_cuda_graphs_refusals_the_configuration_makes_and_the_one_the_runner_makes():
    record = runner.run_benchmark(tiny_benchmark_config(cuda_graphs=True))  # the device's: a row
    assert record.status == "unsupported" and "needs a CUDA device" in record.error
    assert cuda_graphs.unsupported_reason(torch.device("cuda", 0)) is None
    with pytest.raises(ConfigError, match="fp16"):  # whatever the device: the configuration refuses itself
        tiny_benchmark_config(cuda_graphs=True, precision="fp16")
    with pytest.raises(ConfigError, match="captures CUDA graphs itself"):
        tiny_benchmark_config(cuda_graphs=True, compile=True, compile_mode="reduce-overhead")
    with pytest.raises(ConfigError, match="one-batch step of fp32 parameters"):
        tiny_benchmark_config(cuda_graphs=True, grad_accum_steps=2)
    tiny_benchmark_config(cuda_graphs=True, compile=True, compile_mode="max-autotune-no-cudagraphs")


@pytest.mark.parametrize("compiled", [False, True])
def test_files_written_before_the_new_columns_still_match_their_configuration(tmp_path, compiled):
    import pandas as pd

    from cs336_systems.results import read_results

    config = tiny_benchmark_config(compile=compiled)
    row = BenchmarkRecord.for_config(config, torch.device("cpu"), None, 1).to_row()
    old = {name: value for name, value in row.items() if name not in ("compile_mode", "cuda_graphs")}
    pd.DataFrame([old]).to_csv(tmp_path / "old.csv", index=False)
    (read_back,) = read_results(tmp_path / "old.csv").to_dict("records")
    mode = read_back["compile_mode"]
    assert (mode == "default") if compiled else pd.isna(mode)
    assert read_back["cuda_graphs"] == False  # noqa: E712 (a numpy bool)
    assert BenchmarkRecord.row_key(read_back) == config.key()
    assert BenchmarkRecord.row_key(read_back) != config.replace(cuda_graphs=True).key()
