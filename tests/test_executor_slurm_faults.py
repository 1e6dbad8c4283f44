"""--executor slurm under faults, against the real one-node Slurm (as test_executor_slurm.py, skipped without it
unless CS336_REQUIRE_SLURM=1): a pending array task cancelled alone, a request Slurm can never place, a squeue
that does not list the jobs, a relative --job-dir with a `cd` in --slurm-setup, two identical find_max at once
and what a cut ledger line or a removed summary leaves them."""

import json
import os
import re
import shutil
import subprocess

import pytest

from cs336_systems import benchmark_direct, find_max
from cs336_systems.results import read_results
from tests.helpers import PYTHON, child_env, run_main
from tests.test_executor_slurm import CELL, HANGS, REASON, REQUIRED, _ledger, _queued, _wait_until
from tests.tiny import TINY_SWEEP

pytestmark = pytest.mark.skipif(REASON is not None and not REQUIRED, reason=str(REASON))
ONE = [*CELL, "--context-lengths", "8", "--pass-types", "forward", "--executor", "slurm"]


def _fake_bin(tmp_path, name: str, script: str):
    """A directory holding `name`, a shell script, to put first on PATH."""
    (tmp_path / "bin").mkdir(exist_ok=True)
    (tmp_path / "bin" / name).write_text(f"#!/bin/sh\n{script}\n")
    (tmp_path / "bin" / name).chmod(0o755)
    return tmp_path / "bin"


@pytest.fixture(autouse=True)
def _required():
    if REASON is not None and REQUIRED:
        pytest.fail(f"CS336_REQUIRE_SLURM is set, but: {REASON}")


def test_a_pending_array_task_cancelled_alone_is_a_cancelled_row_the_same_command_runs_again(
    tmp_path, capsys, fixtures_on_path, monkeypatch
):
    """Slurm keeps no record of an array task cancelled while it pends: no state, no log, no marker."""
    hang, output = tmp_path / "hang", tmp_path / "out.csv"
    hang.touch()
    monkeypatch.setenv("CS336_TEST_HANG", str(hang))
    args = [*CELL, *HANGS, "--context-lengths", "16", "--batch-sizes", "2", "3", "4", "--executor", "slurm"]
    args += ["--slurm-array-parallelism", "1", "--output", output]
    assert run_main(benchmark_direct.main, capsys, *args, "--no-wait")[0] == 0
    _wait_until(lambda: hang.read_text(), what="the array's first task reaching its measured steps")
    array = hang.read_text().split("_")[0]
    pending = f"{array}_1"  # between two tasks: the array's record keeps nothing of it (the last would be kept)
    subprocess.run(["scancel", pending], check=True, timeout=30)
    _wait_until(lambda: not _queued(pending), what=f"task {pending} leaving the queue")
    hang.unlink()

    code, _, err = run_main(benchmark_direct.main, capsys, *args)  # merges its row, then submits it again
    assert code == 0 and re.search(r"3 configurations: [01] already done, [12] in flight, 1 submitted", err), err
    rows = read_results(output)
    assert sorted(rows["status"]) == ["cancelled", "ok", "ok", "ok"]
    (cancelled,) = rows[rows["status"] == "cancelled"].to_dict("records")
    assert cancelled["slurm_job_id"] == pending and "left the queue before it started" in cancelled["error"]


def test_a_request_slurm_can_never_place_ends_with_a_row_that_says_so(tmp_path, capsys):
    output = tmp_path / "out.csv"
    code, _, err = run_main(benchmark_direct.main, capsys, *ONE, "--slurm-cpus-per-task", "100000", "--output", output)
    assert code == 1 and "configurations to redo (cancelled)" in err, err
    (row,) = read_results(output).to_dict("records")
    assert row["status"] == "cancelled" and "Slurm can never start the job as asked" in row["error"], row
    assert "PartitionConfig" in row["error"] and not _queued(str(row["slurm_job_id"]))  # cancelled, not left


def test_jobs_squeue_does_not_list_are_asked_of_scontrol_not_settled(tmp_path, capsys, monkeypatch):
    """A site's squeue that shows nothing of ours (another view, a wrapper): the job runs to its row."""
    monkeypatch.setenv("PATH", f"{_fake_bin(tmp_path, 'squeue', 'exit 0')}:{os.environ['PATH']}")
    output = tmp_path / "out.csv"
    code, _, err = run_main(benchmark_direct.main, capsys, *ONE, "--output", output)
    assert code == 0, err
    assert list(read_results(output)["status"]) == ["ok"]


def test_a_relative_job_dir_holds_when_the_setup_changes_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = [*ONE, "--job-dir", "rel.jobs", "--slurm-setup", "cd /", "--output", "out.csv"]
    code, _, err = run_main(benchmark_direct.main, capsys, *args)
    assert code == 0, err
    (row,) = read_results(tmp_path / "out.csv").to_dict("records")
    assert row["status"] == "ok" and (tmp_path / "rel.jobs" / "ledger.jsonl").is_file(), row


def test_two_identical_find_max_at_once_run_one_search_and_survive_a_cut_ledger_and_a_removed_summary(tmp_path, capsys):
    output = tmp_path / "probes.csv"
    args = [*TINY_SWEEP, "--context-length", "16", "--dimension", "batch-size", "--start", "2", "--max", "4"]
    args += ["--executor", "slurm", "--slurm-time", "5", "--output", output]
    slow = _fake_bin(
        tmp_path, "sbatch", f'sleep 3; exec {shutil.which("sbatch")} "$@"'
    )  # both poll before either submits
    both = [
        subprocess.Popen(
            [PYTHON, "-m", "cs336_systems.find_max", *map(str, args)],
            env={**child_env(), "PATH": f"{slow}:{os.environ['PATH']}"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    said = [search.communicate(timeout=300) for search in both]
    for search, (out, _) in zip(both, said, strict=True):
        assert search.returncode == 0 and "largest batch-size that runs: 4" in out, (said, _ledger(output))
    assert list(read_results(output)["batch_size"]) == [2, 4]  # one search's probes, once
    assert [e["event"] for e in _ledger(output)] == ["submitted", "settled"]

    with open(tmp_path / "probes.jobs" / "ledger.jsonl", "a") as ledger:
        ledger.write('{"event": "settled", "jo')  # a writer killed mid-line
    (tmp_path / "probes.json").unlink()
    code, out, err = run_main(find_max.main, capsys, *args)
    assert code == 0 and "answered before" in err and "largest batch-size that runs: 4" in out, err
    assert json.loads((tmp_path / "probes.json").read_text())["largest_ok"] == 4  # written again from the job's
    assert len(read_results(output)) == 2
