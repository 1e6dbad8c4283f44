"""all-reduce and DDP on torch.distributed: gloo on CPU, 2 processes, tiny shapes."""

import argparse
import json
import math
import statistics
import subprocess

import numpy as np
import pandas as pd
import psutil
import pytest
import torch
import torch.distributed as dist

from cs336_systems import allreduce_bench, ddp_bench
from cs336_systems.config import BenchmarkConfig
from cs336_systems.distributed import (
    INJECT_FAILURE_ENV,
    LaunchError,
    LaunchSpec,
    all_reduce_mean,
    device_for,
    max_over_ranks,
    mean_over_ranks,
    run_spawned,
)
from cs336_systems.results import read_results
from tests.helpers import (
    HANG_GUARD_S,
    PYTHON,
    SPEC,
    child_env,
    lines_by_label,
    run_main,
    single_process_step,
    tiny_model_config,
)
from tests.tiny import STEPS, TINY_DDP

pytestmark = pytest.mark.skipif(not dist.is_gloo_available(), reason="needs torch.distributed with gloo")


# -- pure functions ------------------------------------------------------------------------


def test_bus_bandwidth_factor_and_sizes():
    assert [allreduce_bench.bus_factor(n) for n in (1, 2, 4, 8)] == [0.0, 1.0, 1.5, 1.75]
    assert allreduce_bench.bandwidths_gbps(10**9, 500.0, 4) == (2.0, 3.0)
    assert allreduce_bench.parse_size("1MB") == ("1MB", 10**6)
    assert allreduce_bench.parse_size("1MiB") == ("1MiB", 2**20)
    with pytest.raises(argparse.ArgumentTypeError):
        allreduce_bench.parse_size("10XB")
    with pytest.raises(argparse.ArgumentTypeError):
        allreduce_bench.parse_size("2")  # less than one float32


def test_rank_aggregation_and_learning_rates():
    assert max_over_ranks([[1.0, 5.0], [2.0, 3.0]]) == [2.0, 5.0]
    assert mean_over_ranks([[1.0, 5.0], [2.0, 3.0]]) == [1.5, 4.0]
    linear, sqrt = ddp_bench.scaled_learning_rates(1e-3, 4, 16)
    assert linear == pytest.approx(4e-3) and sqrt == pytest.approx(2e-3)
    assert ddp_bench.scaling_efficiency(30.0, 2, 20.0) == pytest.approx(0.75)


# -- correctness across processes --------------------------------------------------------------


def mean_worker(ctx, unit):
    tensor = torch.arange(6, dtype=torch.float32) + 10.0 * ctx.rank
    all_reduce_mean(tensor)
    listening = {c.laddr.ip for c in psutil.Process().net_connections(kind="inet") if c.status == "LISTEN"}
    return tensor.numpy(), listening


def test_all_reduce_sums_then_divides_by_world_size_and_listens_on_this_machine_only():
    [(_, result)] = list(run_spawned(mean_worker, [None], SPEC, unit_timeout_s=60))
    assert result.status == "ok", result.error
    expected = np.arange(6) + 10.0 * (0 + 1) / 2  # mean over ranks 0 and 1
    for message, listening in result.messages:
        np.testing.assert_array_equal(message, expected)
        assert listening and listening <= {"127.0.0.1", "::1"}  # the store and gloo: no other interface


def one_step_worker(ctx, unit):
    trainer = ddp_bench.Trainer(ctx, unit)
    trainer.step()
    return {name: p.detach().cpu().numpy() for name, p in trainer.module.named_parameters()}


def test_one_ddp_step_equals_a_single_process_step_on_the_global_batch():
    # SGD, not AdamW: Adam's first step is ~lr * sign(grad), blind to a gradient off by a
    # factor (e.g. a sum not divided by the world size).
    config = BenchmarkConfig(model=tiny_model_config(), context_length=16, batch_size=2, device="cpu", seed=3)
    units = [ddp_bench.DdpUnit(strategy, config, ranks=2, optimizer="sgd", lr=0.5) for strategy in ("ddp", "naive")]
    initial, expected = single_process_step(config, world_size=2, lr=0.5)
    results = list(run_spawned(one_step_worker, units, SPEC, unit_timeout_s=60))
    assert [unit.strategy for unit, _ in results] == ["ddp", "naive"]
    for unit, result in results:
        assert result.status == "ok", result.error
        for rank, params in enumerate(result.messages):
            for name, value in params.items():
                torch.testing.assert_close(
                    torch.from_numpy(value), expected[name], msg=f"{unit.strategy} rank {rank} {name}"
                )
    moved = max((expected[name] - initial[name]).abs().max().item() for name in expected)
    assert moved > 1e-3  # the step really changed the parameters


# -- the commands ------------------------------------------------------------------------


def test_allreduce_bench_rows_files_and_plot(tmp_path, capsys, saved_figures):
    outputs = [tmp_path / "ar.csv", tmp_path / "ar.md", tmp_path / "ar.jsonl"]
    code, out, _ = run_main(
        allreduce_bench.main,
        capsys,
        "--backend",
        "gloo",
        "--world-sizes",
        "1",
        "2",
        "--sizes",
        "1MB",
        "64KiB",
        *STEPS,
        *(x for p in outputs for x in ("--output", p)),
        "--plot",
        tmp_path / "ar.png",
    )
    assert code == 0, out
    rows = read_results(outputs[0])
    assert list(rows["status"]) == ["ok"] * 4
    assert list(rows["world_size"]) == [1, 1, 2, 2] and list(rows["size_bytes"]) == [10**6, 2**16] * 2
    for row in rows.to_dict("records"):
        algbw = row["size_bytes"] / (row["median_ms"] / 1e3) / 1e9  # on the median, as every rate
        assert row["algbw_gbps"] == pytest.approx(algbw)
        assert row["busbw_gbps"] == pytest.approx(algbw * 2 * (row["world_size"] - 1) / row["world_size"])
        assert row["torch_version"] == torch.__version__ and row["threads_per_rank"] >= 1
    assert "busbw is 0 by definition" in rows["notes"][0]
    line = json.loads(outputs[2].read_text().splitlines()[2])  # world size 2, 1MB
    assert len(line["rank_step_ms"]) == 2 and line["step_ms"] == max_over_ranks(line["rank_step_ms"])
    assert len(line["step_ms"]) == 2 and len(line["warmup_step_ms"]) == 1
    assert "| gloo" in outputs[1].read_text() and (tmp_path / "ar.png").exists()
    # the plot: bus and algorithm bandwidth against size, a line each per world size, from the rows
    (figure,) = saved_figures
    lines = lines_by_label(figure)
    assert set(lines) == {"n=1 busbw", "n=1 algbw", "n=2 busbw", "n=2 algbw"}
    two = rows[rows["world_size"] == 2].sort_values("size_bytes")
    assert lines["n=2 busbw"] == [list(zip(two["size_bytes"], two["busbw_gbps"]))]
    assert lines["n=2 algbw"] == [list(zip(two["size_bytes"], two["algbw_gbps"]))]


def test_allreduce_bench_out_of_memory_is_a_row(tmp_path, capsys):
    csv = tmp_path / "oom.csv"
    code, _, _ = run_main(
        allreduce_bench.main,
        capsys,
        "--world-sizes",
        "2",
        "--sizes",
        "4GB",
        "1MB",
        "--memory-limit",
        "512MiB",
        *STEPS,
        "--output",
        csv,
    )
    rows = read_results(csv)
    assert code == 0 and list(rows["status"]) == ["oom", "ok"]
    assert "can't allocate memory" in rows["error"][0]


def test_ddp_bench_rows(tmp_path, capsys):
    csv, md = tmp_path / "ddp.csv", tmp_path / "ddp.md"
    code, out, _ = run_main(
        ddp_bench.main,
        capsys,
        "--world-size",
        "2",
        "--strategy",
        "ddp",
        "naive",
        "--bucket-cap-mb",
        "1",
        *TINY_DDP,
        "--base-lr",
        "1e-4",
        "--output",
        csv,
        "--output",
        md,
        "--output",
        tmp_path / "ddp.jsonl",
    )
    assert code == 0, out
    rows = read_results(csv).set_index("strategy")
    samples = read_results(tmp_path / "ddp.jsonl").set_index("strategy")
    assert list(rows.index) == ["single", "ddp", "naive"] and set(rows["status"]) == {"ok"}
    single, ddp, naive = rows.loc["single"], rows.loc["ddp"], rows.loc["naive"]
    assert (single["world_size"], single["global_batch"], single["scaling_efficiency"]) == (1, 2, 1.0)
    assert (ddp["world_size"], ddp["batch_size"], ddp["global_batch"], ddp["bucket_cap_mb"]) == (2, 2, 4, 1.0)
    for row in (ddp, naive):
        assert row["samples_per_s"] == pytest.approx(4 / (row["median_ms"] / 1e3))  # every rate on the median
        assert row["scaling_efficiency"] == pytest.approx(row["samples_per_s"] / (2 * single["samples_per_s"]))
        assert row["lr_linear"] == pytest.approx(2e-4) and row["lr_sqrt"] == pytest.approx(math.sqrt(2) * 1e-4)
        assert row["no_sync_median_ms"] > 0 and not pd.isna(row["comm_ms"])
    # ddp's exposed communication: the median over steps of step minus the same step under no_sync
    exposed = [a - b for a, b in zip(samples.loc["ddp", "step_ms"], samples.loc["ddp", "no_sync_step_ms"], strict=True)]
    assert ddp["comm_ms"] == pytest.approx(statistics.median(exposed))
    assert naive["comm_ms"] > 0 and naive["comm_method"].startswith("all-reduce loop")
    assert "| 0.0002" in md.read_text()


# -- failures: a row and a prompt exit, never a hang ---------------------------------------


def test_failing_rank_gives_an_error_row_and_a_prompt_exit(tmp_path):
    csv = tmp_path / "fail.csv"
    env = {**child_env(), INJECT_FAILURE_ENV: "1:raise"}
    process = subprocess.run(
        [
            PYTHON,
            "-m",
            "cs336_systems.allreduce_bench",
            "--world-sizes",
            "2",
            "--sizes",
            "1MB",
            *STEPS,
            "--output",
            str(csv),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=HANG_GUARD_S,
    )
    assert process.returncode == 1, process.stderr
    [row] = read_results(csv).to_dict("records")
    # an error row, not a timeout: the failure ended the unit, nothing waited out --timeout (300 s)
    assert row["status"] == "error" and row["error"].startswith("rank 1: RuntimeError: injected failure")
    assert "Traceback" not in process.stderr


@pytest.mark.parametrize(
    ("module", "mode", "status", "message"),
    [
        (ddp_bench, "exit", "error", "rank 1 exited with status 3 without reporting"),
        (allreduce_bench, "hang", "timeout", "no result from rank(s) 0, 1 within 3 s"),
    ],
)
def test_dead_or_hung_rank_ends_the_run(module, mode, status, message, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(INJECT_FAILURE_ENV, f"1:{mode}")  # the spawned ranks inherit it
    csv = tmp_path / "rows.csv"
    shape = TINY_DDP if module is ddp_bench else ["--sizes", "1MB", *STEPS]
    code, _, _ = run_main(module.main, capsys, "--world-size", "2", *shape, "--timeout", "3", "--output", csv)
    rows = read_results(csv).to_dict("records")
    assert code == 1 and rows and all(row["status"] == status for row in rows)
    # ddp_bench: the group breaks during the baseline (rank 1 sits it out, and dies), then again for ddp
    assert all(message in row["error"] for row in rows)


# -- torchrun and usage errors ------------------------------------------------------------------


def test_allreduce_bench_under_torchrun(tmp_path):
    csv = tmp_path / "torchrun.csv"
    command = [
        PYTHON,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "cs336_systems.allreduce_bench",
        "--backend",
        "gloo",
        "--sizes",
        "1MB",
        *STEPS,
        "--probe-links",
        "--output",
        str(csv),
    ]
    process = subprocess.run(command, capture_output=True, text=True, env=child_env(), timeout=120)
    assert process.returncode == 0, process.stderr[-2000:]
    [row] = read_results(csv).to_dict("records")
    assert (row["status"], row["launcher"], row["world_size"]) == ("ok", "torchrun", 2)
    # the links probed first (one host: asked for), the size predicted from them by the ring model
    assert (row["nodes"], row["tasks_per_node"], row["rank_hosts"]) == (1, 2, f"{row['hostname']},{row['hostname']}")
    assert row["link_gbps"] > 0 and row["link_latency_ms"] > 0
    predicted = 2 * row["link_latency_ms"] + 10**6 / (row["link_gbps"] * 1e9) * 1e3
    assert row["predicted_ms"] == pytest.approx(predicted)


@pytest.mark.parametrize(
    ("module", "args", "message"),
    [
        (allreduce_bench, ["--sizes", "10XB"], "not a size"),
        (allreduce_bench, ["--world-sizes", "0"], "must be a positive integer"),
        (allreduce_bench, ["--backend", "nccl", "--memory-limit", "1GB"], "nccl"),
        (ddp_bench, ["--backend", "nccl"], "nccl"),
        (ddp_bench, ["--precision", "tf32"], "TF32"),
        (ddp_bench, ["--model-size", "huge"], "unknown model size"),
        (allreduce_bench, ["--memory-limit", "lots"], "argument --memory-limit: not a size"),
        (allreduce_bench, ["--device", "tpu"], "unknown device 'tpu'"),
        (ddp_bench, ["--device", "cuda:x"], "unknown device 'cuda:x'"),
        # nccl cannot all-reduce CPU tensors: refused before anything starts, CUDA or not
        (allreduce_bench, ["--backend", "nccl", "--device", "cpu"], "--device cpu does not fit"),
        (ddp_bench, ["--backend", "nccl", "--device", "cpu"], "--device cpu does not fit"),
        (
            allreduce_bench,
            ["--world-sizes", "2", "--device", "cpu", "--memory-limit", "1GB", "--output", "r.xlsx"],
            "unknown suffix",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(module, args, message, capsys):
    if "nccl" in args and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    code, _, err = run_main(module.main, capsys, *args)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


# -- one GPU: NCCL at world size 1 (skipped without CUDA) -------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available() or not dist.is_nccl_available(), reason="needs CUDA and NCCL")
def test_nccl_world_size_one_on_a_gpu(tmp_path, capsys):
    ar, ddp = tmp_path / "ar.csv", tmp_path / "ddp.csv"
    code, out, _ = run_main(
        allreduce_bench.main,
        capsys,
        "--backend",
        "nccl",
        "--world-sizes",
        "1",
        "--sizes",
        "1MB",
        "64MB",
        *STEPS,
        "--output",
        ar,
    )
    assert code == 0, out
    rows = read_results(ar)
    assert set(rows["status"]) == {"ok"} and set(rows["device"]) == {"cuda"} and set(rows["busbw_gbps"]) == {0.0}
    code, out, _ = run_main(
        ddp_bench.main,
        capsys,
        "--backend",
        "nccl",
        "--world-size",
        "1",
        "--strategy",
        "ddp",
        "naive",
        *TINY_DDP,
        "--output",
        ddp,
    )
    assert code == 0, out
    rows = read_results(ddp)
    assert list(rows["strategy"]) == ["single", "ddp", "naive"] and set(rows["status"]) == {"ok"}
    assert rows["device_name"][0] == torch.cuda.get_device_name(0)


@pytest.mark.skipif(not torch.cuda.is_available() or not dist.is_nccl_available(), reason="needs CUDA and NCCL")
def test_one_ddp_step_on_a_gpu_equals_the_single_process_step():
    config = BenchmarkConfig(model=tiny_model_config(), context_length=16, batch_size=2, device="cuda", seed=3)
    spec = LaunchSpec("nccl", world_size=1, threads_per_rank=1, init_timeout_s=60, collective_timeout_s=60)
    units = [ddp_bench.DdpUnit(strategy, config, ranks=1, optimizer="sgd", lr=0.5) for strategy in ("ddp", "naive")]
    _, expected = single_process_step(config, world_size=1, lr=0.5)
    for unit, result in run_spawned(one_step_worker, units, spec, unit_timeout_s=60):
        assert result.status == "ok", result.error
        for name, value in result.messages[0].items():
            # batch 2 per rank vs the global batch: other kernels, other rounding (TF32 is off)
            torch.testing.assert_close(
                torch.from_numpy(value), expected[name], rtol=1e-4, atol=1e-4, msg=f"{unit.strategy} {name}"
            )


def test_gloo_on_cuda_needs_a_gpu_and_says_so(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    for module in (allreduce_bench, ddp_bench):
        code, _, err = run_main(module.main, capsys, "--backend", "gloo", "--device", "cuda")
        assert code == 2 and "--device cuda needs CUDA GPUs" in err and len(err.strip().splitlines()) == 1, err


def test_old_and_singular_spellings_are_aliases():
    parse = allreduce_bench.build_parser().parse_args
    assert vars(parse(["--world-size", "2", "3", "--size", "1MB"])) == vars(
        parse(["--world-sizes", "2", "3", "--sizes", "1MB"])
    )
    assert parse(["--world-size", "2", "--size", "1MB"]).sizes == [("1MB", 10**6)]
    parse = ddp_bench.build_parser().parse_args
    old, new = (
        parse(["--world-size", "1", "2", "--strategy", "naive"]),
        parse(["--world-sizes", "1", "2", "--strategies", "naive"]),
    )
    assert vars(old) == vars(new) and (new.world_sizes, new.strategies) == ([1, 2], ["naive"])
    for module in (allreduce_bench, ddp_bench):
        help_text = module.build_parser().format_help()
        assert "--world-sizes" in help_text and "--world-size " not in help_text and "--device" in help_text


@pytest.mark.parametrize("module", [allreduce_bench, ddp_bench])
def test_ctrl_c_exits_130(module, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(module.cli, "run_rows", interrupted)
    code, _, err = run_main(module.main, capsys, "--world-sizes", "1", *(TINY_DDP if module is ddp_bench else STEPS))
    assert code == 130 and "interrupted" in err and "Traceback" not in err


def test_rank_devices_follow_backend_and_device():
    assert device_for("gloo", 1) == torch.device("cpu") and device_for("nccl", 1) == torch.device("cuda", 1)
    assert device_for("gloo", 1, "cuda") == torch.device("cuda", 1)  # gloo all-reduces CUDA tensors too
    assert device_for("nccl", 1, "cuda:2") == torch.device("cuda", 3)  # rank r on cuda:N+r
    for bad, message in [("cuda:x", "unknown device"), ("cpu:0", "unknown device"), ("tpu", "unknown device")]:
        with pytest.raises(LaunchError, match=message):
            device_for("gloo", 0, bad)
    with pytest.raises(LaunchError, match="--device cpu does not fit"):
        device_for("nccl", 0, "cpu")
