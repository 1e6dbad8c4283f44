"""--executor slurm against a real Slurm (the one-node cluster of scripts/dev/slurm_cluster.sh, which
.ci/run starts): jobs, job ids, resume, scancel, the time limit, two submitters on one output, the
--dry-run script submitted by hand. Skipped, with the reason, where there is no Slurm; with
CS336_REQUIRE_SLURM=1 (CI) they fail instead."""

import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest

from cs336_systems import benchmark_direct, find_max, run_benchmarks
from cs336_systems.executor.evidence import SLURM_TIME_LIMIT
from cs336_systems.results import read_results
from tests.helpers import FIXTURES, PYTHON, child_env, run_main
from tests.tiny import TINY_SWEEP


def _no_slurm() -> str | None:
    if shutil.which("sbatch") is None:
        return "Slurm's sbatch is not on PATH (bash scripts/dev/slurm_cluster.sh start)"
    if importlib.util.find_spec("submitit") is None:
        return 'submitit is not installed (pip install -e ".[slurm]")'
    try:
        done = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "sinfo did not answer within 30 s"
    if done.returncode != 0 or not done.stdout.strip():
        return f"no Slurm controller answers (sinfo: {(done.stderr.strip().splitlines() or ['nothing'])[-1]})"
    return None


REASON = _no_slurm()
REQUIRED = bool(os.environ.get("CS336_REQUIRE_SLURM"))
pytestmark = pytest.mark.skipif(REASON is not None and not REQUIRED, reason=str(REASON))

CELL = [*TINY_SWEEP, "--batch-sizes", "2", "--slurm-time", "5"]
HANGS = ["--model-factory", "user_models:hangs_while_asked", "--pass-types", "forward-backward"]


@pytest.fixture(autouse=True)
def _required():
    if REASON is not None and REQUIRED:
        pytest.fail(f"CS336_REQUIRE_SLURM is set, but: {REASON}")


def _ledger(output) -> list[dict]:
    path = output.with_name(output.stem + ".jobs") / "ledger.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def _wait_until(condition, timeout_s: float = 120, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.3)


def _queued(job_id: str) -> bool:
    done = subprocess.run(["squeue", "-h", "-r", "-o", "%i"], capture_output=True, text=True, timeout=30)
    return job_id in done.stdout.split()


@pytest.fixture(scope="module")
def time_limit_sweep(tmp_path_factory):
    """A job that hangs until its 1-minute limit (Slurm ends it 60-90 s after it starts): submitted with
    --no-wait before the other tests, checked by the last one, so its minute passes beside theirs."""
    if REASON is not None:
        yield None
        return
    directory = tmp_path_factory.mktemp("time_limit")
    hang, output = directory / "hang", directory / "out.csv"
    hang.touch()
    args = [*CELL, *HANGS, "--context-lengths", "16", "--executor", "slurm", "--slurm-time", "1", "--output", output]
    saved = os.environ.get("CS336_TEST_HANG")
    os.environ["CS336_TEST_HANG"] = str(hang)  # sbatch hands the job this process's environment
    sys.path.insert(0, str(FIXTURES))
    try:
        assert benchmark_direct.main([str(a) for a in [*args, "--no-wait"]]) == 0
    finally:
        sys.path.remove(str(FIXTURES))
        os.environ.pop("CS336_TEST_HANG") if saved is None else os.environ.update(CS336_TEST_HANG=saved)
    yield args, hang, output
    for entry in _ledger(output):  # a run of one test alone: the job need not reach its limit
        if entry.get("job_id") and _queued(entry["job_id"]):
            subprocess.run(["scancel", entry["job_id"]], timeout=30)


@pytest.fixture(autouse=True)
def _time_limit_first(time_limit_sweep):
    """Every test of this module starts after the time-limit job was submitted."""


def test_four_configurations_are_four_jobs_and_the_same_command_again_runs_nothing(tmp_path, capsys):
    csv, jsonl = tmp_path / "sweep.csv", tmp_path / "sweep.jsonl"
    grid = ["--context-lengths", "8", "16", "--pass-types", "forward", "forward-backward"]
    args = [*CELL, *grid, "--executor", "slurm", "--output", csv, "--output", jsonl]
    code, _, err = run_main(benchmark_direct.main, capsys, *args)
    assert code == 0, err
    assert "4 configurations: 0 already done, 0 in flight, 4 submitted" in err
    rows = read_results(csv)
    assert len(rows) == 4 and len(read_results(jsonl)) == 4 and set(rows["status"]) == {"ok"}
    assert set(rows["executor"]) == {"slurm"} and set(rows["hostname"]) == {socket.gethostname()}
    ids = [str(job) for job in rows["slurm_job_id"]]
    assert len(set(ids)) == 4 and len({job.split("_")[0] for job in ids}) == 1  # one array, four tasks
    assert sorted(int(task) for task in rows["slurm_array_task_id"]) == [0, 1, 2, 3]
    ledger = _ledger(csv)
    assert [e["event"] for e in ledger].count("submitted") == 4 and [e["event"] for e in ledger].count("settled") == 4

    code, _, err = run_main(benchmark_direct.main, capsys, *args)
    assert code == 0 and "4 configurations: 4 already done, 0 in flight, 0 submitted" in err, err
    assert _ledger(csv) == ledger and read_results(csv).equals(rows)


def test_a_job_cancelled_mid_measurement_leaves_a_cancelled_row_and_only_it_is_redone(
    tmp_path, capsys, fixtures_on_path, monkeypatch
):
    hang, output = tmp_path / "hang", tmp_path / "out.csv"
    hang.touch()
    monkeypatch.setenv("CS336_TEST_HANG", str(hang))
    args = [*CELL, *HANGS, "--context-lengths", "8", "16", "--executor", "slurm", "--output", output]
    assert run_main(benchmark_direct.main, capsys, *args, "--no-wait")[0] == 0
    _wait_until(lambda: hang.read_text(), what="the job at context 16 reaching its measured steps")
    cancelled = hang.read_text()
    subprocess.run(["scancel", cancelled], check=True, timeout=30)
    _wait_until(lambda: not _queued(cancelled), what=f"job {cancelled} leaving the queue")
    hang.unlink()

    code, _, err = run_main(benchmark_direct.main, capsys, *args)
    assert code == 0, err
    # context 8 is done, or still in flight on a busy machine; context 16 is submitted again
    assert re.search(r"2 configurations: (1 already done, 0|0 already done, 1) in flight, 1 submitted", err), err
    rows = read_results(output)
    assert sorted((r.context_length, r.status) for r in rows.itertuples()) == [(8, "ok"), (16, "cancelled"), (16, "ok")]
    assert list(rows[rows["context_length"] == 16]["status"]) == ["cancelled", "ok"]
    row = rows[rows["status"] == "cancelled"].iloc[0]
    assert str(row["slurm_job_id"]) == cancelled and "cancelled (scancel)" in row["error"]
    assert row["hostname"] == socket.gethostname() and row["executor"] == "slurm"
    submitted = [e["job"] for e in _ledger(output) if e["event"] == "submitted"]
    assert len(submitted) == 3 and len(set(submitted)) == 2  # context 16 twice, context 8 once


def test_two_arrays_into_one_output_lose_nothing(tmp_path, capsys):
    """Two submissions (two job arrays) into one output, then both collectors at once: every row once."""
    output = tmp_path / "out.csv"
    a = [*CELL, "--context-lengths", "8", "--pass-types", "forward", "forward-backward"]
    b = [*CELL, "--context-lengths", "16", "--pass-types", "forward", "forward-backward"]
    for grid in (a, b):
        assert (
            run_main(run_benchmarks.main, capsys, *grid, "--executor", "slurm", "--no-wait", "--output", output)[0] == 0
        )
    collectors = [
        subprocess.Popen(
            [PYTHON, "-m", "cs336_systems.run_benchmarks", *grid, "--executor", "slurm", "--output", str(output)],
            env=child_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for grid in (a, b)
    ]
    for collector in collectors:
        _, err = collector.communicate(timeout=300)
        assert collector.returncode == 0, err
    rows = read_results(output)
    assert sorted(zip(rows["context_length"], rows["pass_type"], strict=True)) == [
        (8, "forward"),
        (8, "forward-backward"),
        (16, "forward"),
        (16, "forward-backward"),
    ]
    ids = {str(job) for job in rows["slurm_job_id"]}
    assert len(ids) == 4 and len({job.split("_")[0] for job in ids}) == 2
    settled = [e for e in _ledger(output) if e["event"] == "settled"]
    assert len(settled) == 4 and len({(e["job"], e["attempt"]) for e in settled}) == 4


def test_the_dry_run_script_submitted_by_hand_is_collected_by_the_same_command(tmp_path, capsys):
    output = tmp_path / "out.csv"
    args = [*CELL, "--context-lengths", "8", "--pass-types", "forward", "forward-backward", "--executor", "slurm"]
    code, script, err = run_main(benchmark_direct.main, capsys, *args, "--output", output, "--dry-run")
    assert code == 0, err
    (tmp_path / "sweep.sbatch").write_text(script)
    (tmp_path / "out.jobs" / "slurm").mkdir(parents=True)  # as the script's first lines say
    assert f"mkdir -p {tmp_path / 'out.jobs' / 'slurm'} && sbatch THIS_FILE" in script
    submitted = subprocess.run(["sbatch", "--parsable", str(tmp_path / "sweep.sbatch")], capture_output=True, text=True)
    assert submitted.returncode == 0, submitted.stderr
    array = submitted.stdout.strip().split(";")[0]
    _wait_until(lambda: not any(job.startswith(array) for job in _queued_ids()), what=f"array {array} ending")
    code, _, err = run_main(benchmark_direct.main, capsys, *args, "--output", output)
    assert code == 0 and "2 configurations: 2 already done, 0 in flight, 0 submitted" in err, err
    rows = read_results(output)
    assert sorted(str(job) for job in rows["slurm_job_id"]) == [f"{array}_0", f"{array}_1"]
    assert set(rows["executor"]) == {"slurm"} and set(rows["status"]) == {"ok"}


def _queued_ids() -> list[str]:
    done = subprocess.run(["squeue", "-h", "-r", "-o", "%i"], capture_output=True, text=True, timeout=30)
    return done.stdout.split()


def test_sbatch_refusing_the_jobs_is_one_line(tmp_path, capsys):
    output = tmp_path / "out.csv"
    args = [*CELL, "--context-lengths", "8", "--pass-types", "forward", "--executor", "slurm"]
    code, _, err = run_main(benchmark_direct.main, capsys, *args, "--slurm-partition", "nosuch", "--output", output)
    assert code == 2 and "sbatch refused the jobs" in err and "nosuch" in err.splitlines()[-1], err
    assert "Traceback" not in err and not output.exists()


def test_find_max_runs_its_whole_search_as_one_job(tmp_path, capsys):
    output = tmp_path / "probes.csv"
    args = [*TINY_SWEEP, "--context-length", "16", "--dimension", "batch-size", "--start", "2", "--max", "4"]
    args += ["--executor", "slurm", "--slurm-time", "5", "--output", output]
    code, out, err = run_main(find_max.main, capsys, *args)
    assert code == 0 and "largest batch-size that runs: 4" in out, err
    rows = read_results(output)
    assert list(rows["batch_size"]) == [2, 4] and set(rows["executor"]) == {"slurm"}
    assert rows["slurm_job_id"].nunique() == 1  # every probe on the one job's node
    assert json.loads((tmp_path / "probes.json").read_text())["largest_ok"] == 4
    code, out, err = run_main(find_max.main, capsys, *args)
    assert code == 0 and "answered before" in err and "largest batch-size that runs: 4" in out
    assert len(read_results(output)) == 2


def test_a_job_at_its_time_limit_leaves_a_timeout_row_that_the_same_command_redoes(time_limit_sweep, capsys):
    args, hang, output = time_limit_sweep
    os.environ["CS336_TEST_HANG"] = str(hang)
    sys.path.insert(0, str(FIXTURES))
    try:
        (job,) = [entry["job_id"] for entry in _ledger(output) if entry["event"] == "submitted"]
        _wait_until(lambda: not _queued(job), timeout_s=300, what=f"job {job} reaching its 1-minute limit")
        hang.unlink()  # the same command merges its timeout row, then runs it again (and it does not hang)
        code, _, err = run_main(benchmark_direct.main, capsys, *args)
        assert code == 0 and "0 already done, 0 in flight, 1 submitted" in err, err
        timeout, ok = read_results(output).to_dict("records")
        assert timeout["status"] == "timeout" and timeout["error"].startswith(SLURM_TIME_LIMIT), timeout["error"]
        assert str(timeout["slurm_job_id"]) == job and ok["status"] == "ok"
    finally:
        sys.path.remove(str(FIXTURES))
        os.environ.pop("CS336_TEST_HANG")
