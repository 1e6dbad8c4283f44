"""--executor without a cluster: local workers against inline row for row, the flags' refusals, --config,
the --dry-run sbatch script, how an attempt's evidence reads, the ledger. The real Slurm runs are in
test_executor_slurm.py."""

import json
import os
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest

from cs336_systems import benchmark_direct, run_benchmarks
from cs336_systems.executor import Job, JobDir, Outcome
from cs336_systems.executor.evidence import ended_outcome, exit_outcome, from_log
from cs336_systems.placement import placement
from cs336_systems.results import BenchmarkRecord, read_results
from cs336_systems.results.environment import LOAD_FIELDS
from tests.helpers import PYTHON, child_env, run_main
from tests.tiny import TINY_SWEEP

GRID = [
    *TINY_SWEEP,
    "--batch-sizes",
    "2",
    "--context-lengths",
    "8",
    "16",
    "--pass-types",
    "forward",
    "forward-backward",
]
# what a row holds that depends on the run, not on the configuration: timings, when, where, how many threads
# what differs between two runs of one configuration: where and when it ran, how busy the machine was,
# and the notes about its noise (measured, not configured)
RUN_COLUMNS = (
    *("timestamp", "executor", "num_threads", "hostname", "slurm_job_id", "slurm_array_task_id", "gpu_id"),
    *LOAD_FIELDS,
    "notes",
    # the MFU peak: kept from a quiet moment, or measured for this run only when the machine was busy
    *("peak_source", "peak_measured_at"),
)


def _differences(row: dict, other: dict) -> dict:
    """The configuration columns where two rows of one configuration differ: {column: (row's, other's)}."""
    keep = [
        c for c in row if c not in RUN_COLUMNS and not c.endswith(("_ms", "_pct", "_per_s", "tflops", "mfu", "_bytes"))
    ]
    return {c: (row[c], other[c]) for c in keep if not (pd.isna(row[c]) and pd.isna(other[c]) or row[c] == other[c])}


def test_local_with_two_workers_writes_the_rows_inline_writes(tmp_path, capsys):
    inline, local = tmp_path / "inline.csv", tmp_path / "local.csv"
    assert run_main(benchmark_direct.main, capsys, *GRID, "--output", inline)[0] == 0
    code, _, err = run_main(
        benchmark_direct.main, capsys, *GRID, "--executor", "local", "--workers", "2", "--output", local
    )
    assert code == 0, err
    cores = len(os.sched_getaffinity(0))
    threads = max(1, cores // 2)
    assert f"local: 2 workers at once, {threads} CPU thread{'s' * (threads != 1)} each" in err
    a, b = read_results(inline).to_dict("records"), read_results(local).to_dict("records")
    assert len(a) == len(b) == 4
    by_key = {BenchmarkRecord.row_key(row): row for row in b}
    assert set(by_key) == {BenchmarkRecord.row_key(row) for row in a}
    for row in a:
        other = by_key[BenchmarkRecord.row_key(row)]
        assert not _differences(row, other), _differences(row, other)
        assert (row["executor"], other["executor"]) == ("inline", "local")
        assert other["num_threads"] == max(1, cores // 2)
    # the same command again: nothing runs, nothing is added
    code, _, err = run_main(
        benchmark_direct.main, capsys, *GRID, "--executor", "local", "--workers", "2", "--output", local
    )
    assert code == 0 and "4 already done, 0 in flight, 0 submitted" in err
    assert len(read_results(local)) == 4
    ledger = [json.loads(line) for line in (tmp_path / "local.jobs" / "ledger.jsonl").read_text().splitlines()]
    assert [e["event"] for e in ledger].count("submitted") == 4 and [e["event"] for e in ledger].count("settled") == 4


def test_a_local_job_whose_submitter_was_killed_runs_again(tmp_path, capsys, fixtures_on_path, monkeypatch):
    """The submitting process SIGKILLed mid-measurement: its worker dies with it, leaving no row and no exit
    marker; the same command finds that attempt abandoned and runs its configuration again, once."""
    hang, output = tmp_path / "hang", tmp_path / "out.csv"
    hang.touch()
    cell = [*TINY_SWEEP, "--batch-sizes", "2", "--context-lengths", "16", "--pass-types", "forward-backward"]
    args = [*cell, "--model-factory", "user_models:hangs_while_asked", "--executor", "local", "--output", str(output)]
    env = {**child_env(), "CS336_TEST_HANG": str(hang)}
    submitter = subprocess.Popen(
        [PYTHON, "-m", "cs336_systems.benchmark_direct", *args], env=env, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 120
    while not hang.read_text() and time.monotonic() < deadline:  # the job is inside its measured steps
        time.sleep(0.2)
    worker = int(hang.read_text())
    submitter.kill()
    submitter.wait()
    hang.unlink()
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(worker), "the worker outlived its submitting process"
    monkeypatch.setenv("CS336_TEST_HANG", str(hang))
    code, _, err = run_main(benchmark_direct.main, capsys, *args)
    assert code == 0 and "0 already done, 0 in flight, 1 submitted" in err, err
    assert list(read_results(output)["status"]) == ["ok"]
    ledger = [json.loads(line) for line in (tmp_path / "out.jobs" / "ledger.jsonl").read_text().splitlines()]
    assert [(e["event"], e["attempt"], e.get("outcome")) for e in ledger] == [
        ("submitted", "1", None),
        ("settled", "1", "abandoned"),
        ("submitted", "2", None),
        ("settled", "2", "exited"),
    ]


def _alive(pid: int) -> bool:
    """Running (a zombie, reparented to a subreaper that has not waited for it yet, is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize(
    "args, message",
    [
        (["--executor", "local", "--no-wait"], "--no-wait is for --executor slurm"),
        (["--slurm-partition", "gpu"], "--slurm-partition is for --executor slurm"),
        (["--slurm-time", "5"], "--slurm-time is for --executor slurm"),
        (["--workers", "2"], "--workers is for --executor local"),
        (["--executor", "local", "--gpus", "0"], "--gpus picks the workers' GPUs: not with --device cpu"),
        (["--dry-run"], "--dry-run shows what an executor would run"),
        (["--executor", "slurm"], "--executor slurm needs --output FILE.csv"),
        (["--executor", "slurm", "--device", "cuda:1", "--output", "x.csv"], "give --device cuda"),
        (["--executor", "slurm", "--slurm-mem", "12 GB"], "expected sbatch's --mem form"),
        (["--executor", "slurm", "--monitor", "m.csv", "--output", "x.csv"], "--monitor samples this machine"),
        (["--executor", "slurm", "--slurm-partition", "a b"], "expected one word without spaces"),
        (["--executor", "local", "--workers", "0"], "must be a positive integer"),
        (["--executor", "cluster"], "invalid choice"),
    ],
)
def test_executor_flags_refuse_in_one_line(tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(benchmark_direct.main, capsys, *TINY_SWEEP, *args)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and not list(tmp_path.iterdir())


def test_slurm_without_slurm_or_submitit_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch
    code, _, err = run_main(
        benchmark_direct.main, capsys, *TINY_SWEEP, "--executor", "slurm", "--output", tmp_path / "a.csv"
    )
    assert code == 2 and "needs Slurm's sbatch on PATH" in err.splitlines()[-1] and "Traceback" not in err
    monkeypatch.setitem(__import__("sys").modules, "submitit", None)
    code, _, err = run_main(
        benchmark_direct.main, capsys, *TINY_SWEEP, "--executor", "slurm", "--output", tmp_path / "a.csv"
    )
    assert code == 2 and 'pip install "cs336-bench[slurm]"' in err.splitlines()[-1]
    assert not (tmp_path / "a.csv").exists()


def test_dry_run_prints_the_sbatch_script_from_the_flags_and_the_config_file(tmp_path, capsys):
    pytest.importorskip("submitit")
    config = tmp_path / "cluster.json"
    config.write_text(
        json.dumps(
            {
                "executor": "slurm",
                "slurm_partition": "gpu",
                "slurm-time": 30,
                "slurm_setup": ["module load cuda/12.4", "source .venv/bin/activate"],
                "slurm_array_parallelism": 2,
                "slurm_mem": "16G",
                "device": "cuda",
            }
        )
    )
    output = tmp_path / "sweep.csv"
    args = [*GRID, "--device", "auto", "--config", config, "--slurm-time", "45", "--dry-run", "--output", output]
    code, out, err = run_main(benchmark_direct.main, capsys, *args)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "#!/bin/bash"
    for line in (
        "#SBATCH --array=0-3%2",
        "#SBATCH --partition=gpu",
        "#SBATCH --time=45",  # the command line wins over the file
        "#SBATCH --gpus-per-node=1",
        "#SBATCH --mem=16G",
        "#SBATCH --signal=URG",
        "module load cuda/12.4",
        "source .venv/bin/activate",
        'case "${SLURM_ARRAY_TASK_ID:-0}" in',
    ):
        assert line in lines, line
    assert sum(line.strip().endswith(";;") for line in lines) == 4
    assert '--output "$dir"/rows.jsonl' in out and '"device": "cuda:0"' in out  # each job's own first GPU
    assert not output.exists() and not (tmp_path / "sweep.jobs").exists()  # nothing submitted, nothing written


def test_a_config_file_naming_no_flag_or_a_bad_value_is_one_line(tmp_path, capsys):
    for content, message in (
        ({"slurm_partitions": "gpu"}, "no flag --slurm-partitions"),
        ({"slurm_time": "soon"}, "slurm_time (as --slurm-time): expected an integer"),
        (["executor"], "expected a JSON object of flags"),
    ):
        config = tmp_path / "c.json"
        config.write_text(json.dumps(content))
        code, _, err = run_main(benchmark_direct.main, capsys, *TINY_SWEEP, "--config", config)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_a_job_array_task_and_its_gpu_are_the_rows_placement():
    env = {"SLURM_ARRAY_JOB_ID": "41", "SLURM_ARRAY_TASK_ID": "3", "SLURM_JOB_ID": "45", "SLURM_JOB_GPUS": "6,7"}
    assert placement("cuda", 1, {**env, "CS336_BENCH_EXECUTOR": "slurm"}) == {
        "executor": "slurm",
        "slurm_job_id": "41_3",
        "slurm_array_task_id": 3,
        "gpu_id": "7",
    }
    assert placement("cpu", None, {"SLURM_JOB_ID": "45"})["slurm_job_id"] == "45"
    assert placement("cuda", 0, {"CUDA_VISIBLE_DEVICES": "2"})["gpu_id"] == "2"
    assert placement("cpu", None, {}) == dict(
        executor="inline", slurm_job_id=None, slurm_array_task_id=None, gpu_id=None
    )


def test_how_a_slurm_job_ended_reads_from_its_state_then_its_log_then_its_marker():
    cancelled = "slurmstepd-vm: error: *** JOB 1 ON vm CANCELLED AT 2026-11-27T08:53:42 ***\n"
    timed_out = "slurmstepd-node7: error: *** JOB 2 ON node7 CANCELLED AT 2026-11-27T08:55:07 DUE TO TIME LIMIT ***"
    preempted = "slurmstepd: error: *** STEP 3.0 ON n1 CANCELLED AT 2026-11-27T09:00:00 DUE TO PREEMPTION ***"
    assert from_log(cancelled) == ("cancelled", "vm")
    assert from_log(timed_out) == ("timeout", "node7")
    assert from_log(preempted) == ("preempted", "n1")
    assert from_log("Traceback ...\nValueError: x\n") == (None, None)
    marker = {"returncode": 143, "terminated_by": "SIGTERM", "last_line": "terminated"}
    assert ended_outcome("TIMEOUT", "", marker, 5)[0] == "timeout"  # the scheduler's state first
    assert ended_outcome("CANCELLED by 0", "", marker, 5)[0] == "cancelled"
    assert ended_outcome(None, timed_out, marker, 5)[0] == "timeout"  # then Slurm's line in the log
    assert ended_outcome(None, "", marker, 5)[0] == "cancelled"  # a SIGTERM with no other trace
    failed = {"returncode": 1, "last_line": "RuntimeError: boom"}
    assert ended_outcome("FAILED", "", failed, 5) == ("exited", "exited with status 1: RuntimeError: boom")
    assert ended_outcome("NODE_FAIL", "", None, 5)[0] == "error"
    assert exit_outcome({"returncode": 0}) == ("exited", None)
    assert exit_outcome({"timed_out": True, "timeout_s": 30.0})[1] == "no result within --timeout 30 s"
    assert exit_outcome(marker)[0] == "abandoned"  # a local worker stopped with its submitter


def test_attempts_are_numbered_per_job_and_settled_once(tmp_path):
    job_dir = JobDir(tmp_path / "jobs")
    jobs = [Job("a", ("true",)), Job("b", ("true",))]
    first = job_dir.new_attempts(jobs, "slurm")
    job_dir.record_submitted(first)
    (second,) = job_dir.new_attempts(jobs[:1], "slurm")
    assert [a.number for a in first] == ["1", "1"] and second.number == "2"
    assert second.directory == tmp_path / "jobs" / "jobs" / "a" / "2" and second.directory.is_dir()
    job_dir.record_settled(Outcome(first[0], "cancelled"), "cancelled")
    attempts, settled = job_dir.attempts()
    assert {a.key for a in attempts} == {("a", "1"), ("b", "1")} and settled == {("a", "1")}
    (second.directory / "exit.json").write_text('{"returncode": 0}')  # run by hand: an attempt too
    attempts, _ = job_dir.attempts()
    assert ("a", "2") in {a.key for a in attempts}


def test_find_max_runs_as_one_slurm_job_or_here_never_on_local_workers(tmp_path, capsys):
    pytest.importorskip("submitit")
    from cs336_systems import find_max

    base = [*TINY_SWEEP, "--context-length", "16", "--dimension", "batch-size", "--output", tmp_path / "p.csv"]
    code, _, err = run_main(find_max.main, capsys, *base, "--executor", "local")
    assert code == 2 and "invalid choice: 'local'" in err
    code, out, err = run_main(find_max.main, capsys, *base, "--executor", "slurm", "--dry-run", "--slurm-qos", "low")
    assert code == 0, err
    assert "#SBATCH --qos=low" in out and "#SBATCH --array" not in out  # one job, not an array
    assert "cs336_systems.find_max --d-model 32" in out and "--executor" not in out.split("case", 1)[1]
    assert '--output "$dir"/rows.jsonl --summary "$dir"/summary.json' in out


def test_run_benchmarks_timeout_ends_a_local_job_as_a_timeout_row_that_stays(
    tmp_path, capsys, fixtures_on_path, monkeypatch
):
    hang, output = tmp_path / "hang", tmp_path / "out.csv"
    hang.touch()
    monkeypatch.setenv("CS336_TEST_HANG", str(hang))
    args = [*TINY_SWEEP, "--batch-sizes", "2", "--context-lengths", "16", "--pass-types", "forward-backward"]
    args += [
        "--model-factory",
        "user_models:hangs_while_asked",
        "--executor",
        "local",
        "--timeout",
        "5",
        "--output",
        output,
    ]
    code, _, err = run_main(run_benchmarks.main, capsys, *args)
    assert code == 1, err
    (row,) = read_results(output).to_dict("records")
    assert (row["status"], row["error"], row["executor"]) == ("timeout", "no result within --timeout 5 s", "local")
    code, _, err = run_main(run_benchmarks.main, capsys, *args)  # the configuration's own answer: not run again
    assert code == 1 and "1 already done, 0 in flight, 0 submitted" in err
