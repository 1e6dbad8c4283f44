"""The executor under faults, without a cluster: job directories that are not to be trusted (a file, planted
links, another user's), control characters in paths, --workers past the cores, a local submitter whose pid a
later process got, a second local submitter killed, the job directory removed mid-run, and how a Slurm job
that left no trace reads. The real Slurm's faults are in test_executor_slurm_faults.py."""

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import threading
import time

import psutil
import pytest

from cs336_systems import benchmark_direct
from cs336_systems.executor import Attempt, ExecutorSettings, Job, JobDir
from cs336_systems.executor.evidence import ended_outcome, queue_state
from cs336_systems.executor.local import LocalRunner
from cs336_systems.results import read_results
from tests.helpers import PYTHON, child_env, run_main
from tests.tiny import TINY_SWEEP

ONE = [*TINY_SWEEP, "--batch-sizes", "2", "--context-lengths", "16", "--pass-types", "forward-backward"]
HANGING = [*ONE, "--model-factory", "user_models:hangs_while_asked", "--executor", "local"]


def _plant(tmp_path, what: str):
    """(the job directory, the file a planted link points at) for one hostile layout."""
    jobs, victim = tmp_path / "out.jobs", tmp_path / "victim"
    victim.mkdir()
    (victim / "theirs").write_text("kept\n")
    if what == "a file":
        jobs.write_text("not a directory\n")
    elif what == "a linked ledger":
        jobs.mkdir()
        (jobs / "ledger.jsonl").symlink_to(victim / "theirs")
    elif what == "a linked jobs/":
        jobs.mkdir()
        (jobs / "jobs").symlink_to(victim)
    elif what == "world-writable":
        jobs.mkdir()
        jobs.chmod(0o777)
    return jobs, victim


@pytest.mark.parametrize(
    "what, message",
    [
        ("a file", "is not a directory"),
        ("a linked ledger", "ledger.jsonl: is a symbolic link"),
        ("a linked jobs/", "jobs: is a symbolic link"),
        ("world-writable", "is writable by every user"),
        ("another user's", "belongs to another user"),
    ],
)
def test_a_job_directory_not_ours_alone_is_refused_in_one_line(tmp_path, capsys, monkeypatch, what, message):
    jobs, victim = _plant(tmp_path, what)
    if what == "another user's":
        jobs.mkdir()
        real = os.getuid()
        monkeypatch.setattr(os, "getuid", lambda: real + 1)
    args = [*ONE, "--executor", "local", "--output", tmp_path / "out.csv"]
    code, _, err = run_main(benchmark_direct.main, capsys, *args)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert (victim / "theirs").read_text() == "kept\n" and [p.name for p in victim.iterdir()] == ["theirs"]
    assert not (tmp_path / "out.csv").exists()


@pytest.mark.parametrize("flag", ["--output", "--job-dir"])
def test_a_control_character_in_a_path_is_refused_before_any_script_is_written(tmp_path, capsys, flag):
    pytest.importorskip("submitit")
    planted = f"{tmp_path}/x\ntouch {tmp_path}/pwned #"
    paths = ["--output", f"{planted}.csv"] if flag == "--output" else ["--output", tmp_path / "o.csv", flag, planted]
    code, out, err = run_main(benchmark_direct.main, capsys, *ONE, "--executor", "slurm", "--dry-run", *paths)
    assert code == 2 and "control character" in err and len(err.strip().splitlines()) == 1, err
    assert out == "" and sorted(p.name for p in tmp_path.iterdir()) == []


def test_the_dry_run_script_quotes_what_it_names(tmp_path, capsys):
    pytest.importorskip("submitit")
    job_dir = tmp_path / "a b;$(touch pwned)'"
    args = [*ONE, "--executor", "slurm", "--dry-run", "--job-dir", job_dir, "--output", tmp_path / "o.csv"]
    code, script, err = run_main(benchmark_direct.main, capsys, *args)
    assert code == 0, err
    (line,) = [line for line in script.splitlines() if line.strip().startswith("dir=")]
    shown = subprocess.run(["bash", "-c", f'{line.strip()}; printf %s "$dir"'], capture_output=True, text=True)
    assert shown.stdout == f"{job_dir}/jobs/{line.split('/jobs/')[1].split('/')[0]}/hand-"
    assert not (tmp_path / "pwned").exists()


def test_workers_past_the_cores_are_capped_and_said(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    args = [*ONE, "--executor", "local", "--workers", "10000", "--dry-run", "--output", tmp_path / "o.csv"]
    code, out, err = run_main(benchmark_direct.main, capsys, *args)
    assert code == 0 and "--workers 10000: 2, one per core" in err, err
    assert out.startswith("# local: 2 workers at once, 1 CPU thread each")


def test_a_local_submitter_whose_pid_a_later_process_got_is_gone(tmp_path):
    """A crashed submitter's pid, now another process's (here: this test's parent): its attempt is abandoned."""
    job_dir, host, pid = JobDir(tmp_path / "jobs"), socket.gethostname(), os.getppid()
    started = psutil.Process(pid).create_time()
    submitters = {
        "reused": (host, pid, started - 100),
        "alive": (host, pid, started),
        "older-ledger": (host, pid),  # written before the start time was recorded: the pid alone
    }
    for name, submitter in submitters.items():
        directory = job_dir.attempt_directory(name, "1")
        directory.mkdir(parents=True)
        job_dir.record_submitted([Attempt(name, "1", directory, "local", submitter=submitter)])
    poll = LocalRunner(ExecutorSettings(kind="local"), JobDir(tmp_path / "jobs")).poll()
    assert [(o.attempt.name, o.kind) for o in poll.outcomes] == [("reused", "abandoned")]
    assert sorted(a.name for a in poll.running) == ["alive", "older-ledger"]


def test_a_slurm_job_that_never_started_and_left_no_trace_runs_again():
    """Without accounting, scontrol forgets a job MinJobAge after it ends: a job cancelled while it pended
    leaves nothing. One that started and vanished is an error (its own failure, for all anyone knows)."""
    assert ended_outcome(None, "", None, 5, started=False)[0] == "cancelled"
    assert "left the queue before it started" in ended_outcome(None, "", None, 5, started=False)[1]
    assert ended_outcome(None, "", None, 5, started=True)[0] == "error"
    assert ended_outcome("FAILED", "", None, 5, started=False)[0] == "error"
    assert queue_state("PENDING", "PartitionConfig") == queue_state("PENDING", "QOSMaxCpuPerJobLimit") == "never"
    assert (
        queue_state("PENDING", "Resources")
        == queue_state("PENDING", "ReqNodeNotAvail, UnavailableNodes:vm")
        == "queued"
    )
    assert (queue_state("RUNNING", "None"), queue_state("COMPLETED")) == ("running", None)


def test_a_pending_job_scontrol_forgot_runs_again_and_one_it_cannot_answer_for_is_waited_for(tmp_path, monkeypatch):
    """The --no-wait flow on a cluster without accounting: a job cancelled while it pended, collected after
    MinJobAge, is known to nothing (squeue, scontrol, sacct, its log). A scontrol that cannot reach the
    controller says nothing either way: that job is polled again, not settled."""
    pytest.importorskip("submitit")
    from cs336_systems.executor.slurm import SlurmRunner

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")

    def fake(name: str, said: str, code: int) -> None:
        (bin_dir / name).write_text(f"#!/bin/sh\necho '{said}' >&2\nexit {code}\n")
        (bin_dir / name).chmod(0o755)

    job_dir = JobDir(tmp_path / "jobs")
    (attempt,) = job_dir.new_attempts([Job("a", ("true",))], "slurm")
    job_dir.record_submitted([dataclasses.replace(attempt, job_id="77_3")])
    fake("squeue", "", 0)  # answers, without the job
    fake("sacct", "Slurm accounting storage is disabled", 1)
    fake("scontrol", "slurm_load_jobs error: Unable to contact slurm controller (connect failure)", 1)
    poll = SlurmRunner(ExecutorSettings(kind="slurm"), job_dir).poll()
    assert not poll.outcomes and [a.key for a in poll.running] == [("a", "1")]
    fake("scontrol", "slurm_load_jobs error: Invalid job id specified", 1)
    (outcome,) = SlurmRunner(ExecutorSettings(kind="slurm"), job_dir).poll().outcomes
    assert outcome.kind == "cancelled" and "left the queue before it started" in outcome.error


def test_checking_a_new_output_never_makes_a_file_at_its_name(tmp_path, monkeypatch):
    """A second command's check, made while the first creates the output, must not remove the first's rows."""
    from cs336_systems.results.paths import check_output_path

    made, real_open = [], os.open
    monkeypatch.setattr(
        os, "open", lambda path, flags, *more: made.append((str(path), flags)) or real_open(path, flags, *more)
    )
    check_output_path(tmp_path / "out.csv")
    assert not [path for path, flags in made if flags & os.O_CREAT and path == str(tmp_path / "out.csv")], made
    assert list(tmp_path.iterdir()) == []


def _wait_for(condition, what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.1)


def test_a_second_local_submitter_killed_loses_no_row(tmp_path):
    """B waits on A's worker; A is killed (its worker with it): B runs that configuration itself."""
    hang, output = tmp_path / "hang", tmp_path / "out.csv"
    hang.touch()
    env = {**child_env(), "CS336_TEST_HANG": str(hang)}
    command = [PYTHON, "-m", "cs336_systems.benchmark_direct", *map(str, HANGING), "--output", str(output)]
    first = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for(lambda: hang.read_text(), "A's worker reaching its measured steps")
    with open(tmp_path / "b.err", "w") as said:
        second = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=said)
        _wait_for(lambda: "1 in flight, 0 submitted" in (tmp_path / "b.err").read_text(), "B waiting on A's job")
        hang.unlink()  # A's worker would finish now: A is killed first
        first.kill()
        first.wait()
        assert second.wait(timeout=300) == 0, (tmp_path / "b.err").read_text()
    assert list(read_results(output)["status"]) == ["ok"]
    assert "submitted again" in (tmp_path / "b.err").read_text()
    ledger = [json.loads(line) for line in (tmp_path / "out.jobs" / "ledger.jsonl").read_text().splitlines()]
    assert [(e["event"], e["attempt"], e.get("outcome")) for e in ledger] == [
        ("submitted", "1", None),
        ("settled", "1", "abandoned"),
        ("submitted", "2", None),
        ("settled", "2", "exited"),
    ]


def test_the_job_directory_removed_mid_run_leaves_a_row_that_says_so(tmp_path, capsys, monkeypatch, fixtures_on_path):
    hang, output = tmp_path / "hang", tmp_path / "out.csv"
    hang.touch()
    monkeypatch.setenv("CS336_TEST_HANG", str(hang))

    def remove() -> None:
        _wait_for(lambda: hang.read_text(), "the worker reaching its measured steps")
        shutil.rmtree(tmp_path / "out.jobs")
        hang.unlink()

    remover = threading.Thread(target=remove)
    remover.start()
    code, _, err = run_main(benchmark_direct.main, capsys, *HANGING, "--output", output)
    remover.join()
    assert code == 1 and "configurations to redo (cancelled)" in err, err
    (row,) = read_results(output).to_dict("records")
    assert row["status"] == "cancelled" and "its files were removed while it ran" in row["error"], row
    code, _, err = run_main(benchmark_direct.main, capsys, *HANGING, "--output", output)
    assert code == 0 and "0 already done, 0 in flight, 1 submitted" in err, err
    assert list(read_results(output)["status"]) == ["cancelled", "ok"]
