"""ddp_bench's strategies (flat, zero1, fsdp2, a student's adapters): each checked against one
process, memory per rank, wrong and skipped rows, two torchrun nodes. gloo, 2 processes, tiny model."""

import os
import socket
import subprocess

import numpy as np
import pandas as pd
import pytest
import torch
import torch.distributed as dist

from cs336_systems import ddp_bench
from cs336_systems.config import BenchmarkConfig
from cs336_systems.distributed import run_spawned
from cs336_systems.results import read_results
from tests.helpers import PYTHON, REPO, SPEC, child_env, run_main, single_process_step, tiny_model_config
from tests.tiny import TINY_DDP

pytestmark = pytest.mark.skipif(not dist.is_gloo_available(), reason="needs torch.distributed with gloo")

STUDENT = str(REPO / "tests" / "fixtures" / "adapters_student.py")
WRONG = str(REPO / "tests" / "fixtures" / "adapters_ddp_wrong.py")
SKELETON = str(REPO / "tests" / "fixtures" / "adapters_skeleton.py")
EVERY = [
    "ddp",
    "naive",
    "flat",
    "zero1",
    "fsdp2",
    "adapter-ddp",
    "adapter-ddp-bucketed",
    "adapter-sharded-optimizer",
    "adapter-fsdp",
]


def full_parameters_after_one_step(ctx, unit):
    trainer = ddp_bench.Trainer(ctx, unit)
    trainer.step()
    return {name: value.cpu().numpy() for name, value in trainer.full_parameters().items()}


def test_every_strategy_steps_as_one_process_on_the_global_batch():
    # The reference here is the test's own (one forward on the concatenated batch), not the
    # benchmark's reference_step: both the strategies and the benchmark's check are under test.
    config = BenchmarkConfig(model=tiny_model_config(), context_length=16, batch_size=2, device="cpu", seed=3)
    units = [ddp_bench.DdpUnit(s, config, ranks=2, optimizer="sgd", lr=0.5, adapters=STUDENT) for s in EVERY]
    initial, expected = single_process_step(config, world_size=2, lr=0.5)
    results = list(run_spawned(full_parameters_after_one_step, units, SPEC, unit_timeout_s=120))
    assert [unit.strategy for unit, _ in results] == EVERY
    for unit, result in results:
        assert result.status == "ok", result.error
        for rank, params in enumerate(result.messages):
            assert set(params) == set(expected), unit.strategy
            for name, value in params.items():
                torch.testing.assert_close(
                    torch.from_numpy(value), expected[name], msg=f"{unit.strategy} rank {rank} {name}"
                )
    assert max((expected[name] - initial[name]).abs().max().item() for name in expected) > 1e-3


def test_every_strategy_row_is_checked_timed_and_measured(tmp_path, capsys):
    csv = tmp_path / "ddp.csv"
    code, out, err = run_main(
        ddp_bench.main,
        capsys,
        "--world-size",
        "2",
        "--strategies",
        *EVERY,
        "--adapters",
        STUDENT,
        *TINY_DDP,
        "--warmup-steps",
        "0",
        "--measure-steps",
        "2",
        "--output",
        csv,
        "--output",
        tmp_path / "ddp.jsonl",
    )
    assert code == 0, err
    rows = read_results(csv).set_index("strategy")
    assert list(rows.index) == ["single", *EVERY] and set(rows["status"]) == {"ok"}
    breakdown = read_results(tmp_path / "ddp.jsonl").set_index("strategy")["memory_breakdown"]
    strategies = rows.loc[EVERY]
    assert (strategies["check_max_diff"] <= strategies["check_tolerance"]).all()
    assert (strategies["mean_ms"] > 0).all() and strategies["comm_ms"].notna().all()
    # ddp and zero1 expose comm as step minus a no_sync step: a difference of two noisy means can dip below 0
    timed_directly = strategies.drop(index=[s for s in ("ddp", "zero1") if s in strategies.index])
    assert (timed_directly["comm_ms"] >= 0).all()
    assert strategies["comm_method"].notna().all()
    # fsdp2's collectives come from one profiled step: all-gathers in forward, reduce-scatters in backward
    assert rows.loc["fsdp2", "fsdp_all_gather_ms"] > 0 and rows.loc["fsdp2", "fsdp_reduce_scatter_ms"] > 0
    # the student's FSDP is profiled too, and every row carries the forward its all-gathers are compared with
    assert rows.loc["adapter-fsdp", "fsdp_all_gather_ms"] > 0
    assert (rows["forward_mean_ms"] > 0).all() and (rows["backward_mean_ms"] > 0).all()
    assert (rows["forward_mean_ms"] < rows["mean_ms"]).all() and set(rows["size_table"].astype(str)) == {"2026"}
    # each unit's row says how busy other processes kept the machine (its own ranks are not others)
    assert rows["other_load_cores"].notna().all() and (rows["other_load_cores"] <= 2 * (os.cpu_count() or 1)).all()
    ddp, zero1, fsdp2 = rows.loc["ddp"], rows.loc["zero1"], rows.loc["fsdp2"]
    params = 4 * ddp["num_params"]  # fp32
    assert ddp["param_bytes_per_rank"] == params and ddp["grad_bytes_per_rank"] == params
    assert ddp["optimizer_state_bytes_per_rank"] == 2 * params  # AdamW: exp_avg, exp_avg_sq
    # ZeRO-1 keeps about half of the AdamW state per rank (whole tensors go to one rank: not exactly half)
    assert zero1["optimizer_state_bytes_per_rank"] == pytest.approx(params, rel=0.25)
    assert zero1["param_bytes_per_rank"] == params
    # FSDP2 shards parameters, gradients and state: the max over ranks is about half (dim-0 padding)
    for column, whole in (("param_bytes_per_rank", params), ("optimizer_state_bytes_per_rank", 2 * params)):
        assert fsdp2[column] == pytest.approx(whole / 2, rel=0.1)
    assert fsdp2["predicted_peak_bytes"] < zero1["predicted_peak_bytes"] < ddp["predicted_peak_bytes"]
    # the tiny model by hand: embedding and head 97 x 32 each, per block 4 x 32^2 + 3 x 32 x 64 + 2 x 32, a norm
    assert params == 4 * (2 * 97 * 32 + 2 * (4 * 32 * 32 + 3 * 32 * 64 + 2 * 32) + 32)
    # every phase's peak holds what the rank holds then, counted from zero (tensors, not the process's RSS)
    for strategy, row in strategies.iterrows():
        held = row["param_bytes_per_rank"], row["grad_bytes_per_rank"], row["optimizer_state_bytes_per_rank"]
        assert row["peak_model_bytes"] >= held[0] and row["peak_before_optimizer_bytes"] >= sum(held[:2]), strategy
        assert row["peak_optimizer_bytes"] >= sum(held), strategy
        assert row["memory_source"] == "rss_high_water_mark" and pd.notna(row["process_peak_bytes"])  # secondary
    assert rows.loc["single", "peak_optimizer_bytes"] >= 4 * params  # parameters, gradients, AdamW's two
    assert ddp["peak_model_bytes"] < 10 * params  # not a process's few hundred MB of torch
    for sharded in ("fsdp2", "adapter-fsdp"):  # a rank holds about half: shown, and never below it
        assert params / 2 <= rows.loc[sharded, "peak_model_bytes"]
    # the handout's breakdown per rank: the three moments, each by category, adding up to the peak
    phases = {entry["phase"]: entry for entry in breakdown["zero1"]}
    assert list(phases) == ["after building", "before optimizer step", "after optimizer step"]
    for entry in phases.values():
        assert entry["total"] == sum(v for k, v in entry.items() if k not in ("phase", "total"))
    assert phases["after building"]["parameters"] == params and phases["after building"]["optimizer_state"] == 0
    assert phases["after optimizer step"]["gradients"] == params
    assert phases["after optimizer step"]["optimizer_state"] == pytest.approx(params, rel=0.25)  # ZeRO: half
    assert {e["phase"]: e for e in breakdown["ddp"]}["after optimizer step"]["optimizer_state"] >= 2 * params
    fsdp_built = breakdown["fsdp2"][0]
    assert fsdp_built["parameters"] == pytest.approx(params / 2, rel=0.1)  # each rank's DTensor shards


def test_a_strategy_that_diverges_is_wrong_and_not_timed(tmp_path, capsys):
    csv = tmp_path / "wrong.csv"
    code, _, err = run_main(
        ddp_bench.main,
        capsys,
        "--world-size",
        "2",
        "--strategies",
        "adapter-ddp",
        "--adapters",
        WRONG,
        *TINY_DDP,
        "--output",
        csv,
    )
    assert code == 1
    row = read_results(csv).set_index("strategy").loc["adapter-ddp"]
    assert row["status"] == "wrong" and "not timed" in row["error"]
    assert row["check_max_diff"] > row["check_tolerance"] and np.isnan(row["mean_ms"])


def test_an_unimplemented_adapter_is_skipped(tmp_path, capsys):
    csv = tmp_path / "skipped.csv"
    code, _, err = run_main(
        ddp_bench.main,
        capsys,
        "--world-size",
        "2",
        "--strategies",
        "adapter-ddp",
        "adapter-fsdp",
        "adapter-sharded-optimizer",
        "--adapters",
        SKELETON,
        *TINY_DDP,
        "--output",
        csv,
    )
    assert code == 0, err
    rows = read_results(csv).set_index("strategy")
    for strategy in ("adapter-ddp", "adapter-fsdp", "adapter-sharded-optimizer"):
        assert rows.loc[strategy, "status"] == "skipped"
        assert "not implemented" in rows.loc[strategy, "error"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--strategies", "adapter-ddp"], "need --adapters"),
        (["--strategies", "adapter-ddp", "--adapters", "no/such/file.py"], "no such file"),
        (["--fsdp-compute-dtype", "fp8"], "invalid choice"),
    ],
)
def test_strategy_usage_errors_are_one_line(args, message, capsys):
    code, _, err = run_main(ddp_bench.main, capsys, *args, *TINY_DDP)
    assert code == 2 and message in err and "Traceback" not in err


def test_one_process_is_measured_once_and_read_by_the_runs_that_compare_with_it(tmp_path, capsys):
    single, flat = tmp_path / "single.csv", tmp_path / "flat.csv"
    run = ["--world-size", "2", *TINY_DDP]
    assert run_main(ddp_bench.main, capsys, *run, "--strategies", "single", "--output", single)[0] == 0
    code, _, err = run_main(
        ddp_bench.main, capsys, *run, "--strategies", "flat", "--baseline", single, "--output", flat
    )
    assert code == 0, err
    baseline, rows = read_results(single), read_results(flat)
    assert list(baseline["strategy"]) == ["single"] and list(rows["strategy"]) == ["flat"]  # not measured again
    row = rows.iloc[0]
    assert row["baseline_samples_per_s"] == baseline.iloc[0]["samples_per_s"]
    assert row["scaling_efficiency"] == pytest.approx(row["samples_per_s"] / (2 * row["baseline_samples_per_s"]))
    # a one-process row measured otherwise stands for nothing here; one with --strategies single is a contradiction
    for args, words in (
        (["--measure-steps", "3", "--strategies", "flat", "--baseline", single], "measured otherwise (measure_steps)"),
        (["--strategies", "single", "--baseline", single], "does not go with --strategies single"),
        (["--strategies", "flat", "--baseline", flat], "no one-process row"),
    ):
        code, _, err = run_main(ddp_bench.main, capsys, *run, *args)
        assert code == 2 and words in err and err.count("\n") <= 2 and "Traceback" not in err, err


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_torchrun_nodes_on_one_machine(tmp_path):
    """Two torchrun launches, one process each, joined over 127.0.0.1 as two nodes would be:
    rank 0 of node 0 writes the rows, node 1 writes nothing."""
    port = free_port()
    outputs = [tmp_path / f"node{node}.csv" for node in (0, 1)]
    processes = [
        subprocess.Popen(
            [
                PYTHON,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--nproc-per-node",
                "1",
                "--node-rank",
                str(node),
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(port),
                "-m",
                "cs336_systems.ddp_bench",
                "--strategies",
                "ddp",
                "fsdp2",
                *TINY_DDP,
                "--output",
                str(outputs[node]),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        for node in (0, 1)
    ]
    try:
        results = [process.communicate(timeout=240) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    for process, (_, stderr) in zip(processes, results, strict=True):
        assert process.returncode == 0, stderr[-2000:]
    rows = read_results(outputs[0]).set_index("strategy")
    assert list(rows.index) == ["single", "ddp", "fsdp2"] and set(rows["status"]) == {"ok"}
    assert set(rows["launcher"]) == {"torchrun"} and rows.loc["fsdp2", "world_size"] == 2
    assert not outputs[1].exists()


NO_INIT = str(REPO / "tests" / "fixtures" / "adapters_sharded_no_init.py")


def test_a_sharded_optimizer_without_state_is_counted_and_a_failing_strategy_costs_only_its_rows(tmp_path, capsys):
    """A real student's ShardedOptimizer never calls Optimizer.__init__ (no `.state`, an inner optimizer);
    the same module's get_ddp raises: that row is an error, every other row stands."""
    csv = tmp_path / "rows.csv"
    strategies = ["adapter-ddp", "adapter-sharded-optimizer", "ddp"]
    code, _, err = run_main(
        ddp_bench.main,
        capsys,
        "--world-size",
        "2",
        "--strategies",
        *strategies,
        "--adapters",
        NO_INIT,
        *TINY_DDP,
        "--output",
        csv,
    )
    rows = read_results(csv).set_index("strategy")
    assert code == 1 and list(rows.index) == ["single", *strategies], err
    assert rows.loc["adapter-ddp", "status"] == "error" and "my DDP is broken" in rows.loc["adapter-ddp", "error"]
    for strategy in ("single", "adapter-sharded-optimizer", "ddp"):
        assert rows.loc[strategy, "status"] == "ok", rows.loc[strategy, "error"]
    sharded, single = rows.loc["adapter-sharded-optimizer"], rows.loc["single"]
    assert 0 < sharded["optimizer_state_bytes_per_rank"] < single["optimizer_state_bytes_per_rank"]


def test_a_model_returning_logits_and_aux_is_one_line_before_any_rank(capsys):
    code, _, err = run_main(
        ddp_bench.main,
        capsys,
        "--world-size",
        "2",
        *TINY_DDP,
        "--model-factory",
        "tests.fixtures.hostile.models:logits_and_aux",
    )
    assert code == 2 and err.count("\n") == 1 and "returned a tuple of 2, expected a logits tensor" in err


@pytest.mark.parametrize(
    ("defined", "named"),
    [
        ("class BasicsTransformerLM: pass\nclass TransformerLM: pass\n", "cs336_basics.model:BasicsTransformerLM"),
        ("class TransformerLM: pass\n", "cs336_basics.model:TransformerLM"),
        ("class GPT: pass\n", None),
    ],
)
def test_the_not_sharded_hint_names_only_a_model_the_repository_has(tmp_path, monkeypatch, defined, named):
    from cs336_systems.ddp_bench.record import handout_model_spec

    (tmp_path / "cs336_basics").mkdir()
    (tmp_path / "cs336_basics" / "__init__.py").write_text("raise RuntimeError('never imported by a hint')\n")
    (tmp_path / "cs336_basics" / "model.py").write_text(defined)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert handout_model_spec() == named
