"""`handout --executor local|slurm`: each step one job; the submitting process moves a finished attempt's files
into OUTPUT_DIR and writes its done marker; a step that reads an earlier step's output waits for the next
round; local workers give the steps and files inline gives. The real Slurm run is in test_executor_slurm.py."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from cs336_systems.executor import JobDir, Outcome
from cs336_systems.executor.jobs import EXITED, STARTED, STEP_LOG
from cs336_systems.executor.local import LocalRunner
from cs336_systems.executor.settings import ExecutorSettings
from cs336_systems.handout import cli, jobs, nodes, outputs, run
from cs336_systems.handout.plan import Step
from cs336_systems.handout.target import Target
from tests.helpers import run_main

CPU = Target("AMD EPYC", "cpu", 24 * 2**30, 0, False, False, False, {"fp32": 0.5, "bf16": 0.1})
LOCAL = ExecutorSettings(kind="local", device="cpu", workers=2, threads_per_worker=1)
# makes OUTPUT; fails with status 3 while the file CRASH exists
MAKE = """
import os, sys
out = sys.argv[sys.argv.index("--output") + 1]
if os.path.exists(os.environ["CRASH"]):
    print("no snapshot today", file=sys.stderr)
    sys.exit(3)
open(out, "w").write("snapshot\\n")
"""
# reads --snapshot (an earlier step's output), writes OUTPUT
DRAW = """
import sys
snapshot = open(sys.argv[sys.argv.index("--snapshot") + 1]).read()
open(sys.argv[sys.argv.index("--output") + 1], "w").write(snapshot + "drawn\\n")
"""


def _two_steps(tmp_path) -> list[Step]:
    (tmp_path / "make.py").write_text(MAKE)
    (tmp_path / "draw.py").write_text(DRAW)
    make = Step("make", "memory_profiling", "snapshot", str(tmp_path / "make.py"), {"--output": ["snap.txt"]})
    draw = Step(
        "draw", "memory_profiling", "timeline", str(tmp_path / "draw.py"),
        {"--snapshot": "snap.txt", "--output": ["drawn.txt"]},
    )  # fmt: skip
    return [make, draw]


def _run(steps, out, capsys, budget_s=None) -> tuple[jobs.JobsRun, str]:
    outputs.check_output_dir(out, [])
    plan = jobs.PlanJobs(steps, CPU, out, "2026", "small", jobs.job_dir_of(out, None))
    runner = LocalRunner(LOCAL, plan.job_dir)
    try:
        ran = jobs.run_jobs(plan, runner, wait=True, budget_s=budget_s)
    finally:
        runner.close()
    return ran, capsys.readouterr().err


def _ledger(out) -> list[tuple[str, str]]:
    lines = (out / jobs.JOBS / "ledger.jsonl").read_text().splitlines()
    return [(entry["event"], entry["job"].split("-")[0]) for entry in map(json.loads, lines)]


def test_a_step_that_reads_an_earlier_steps_output_is_submitted_in_the_next_round(tmp_path, capsys, monkeypatch):
    out, crash = tmp_path / "out", tmp_path / "crash"
    monkeypatch.setenv("CRASH", str(crash))
    crash.touch()
    steps = _two_steps(tmp_path)
    ran, err = _run(steps, out, capsys)
    # the snapshot's step crashed: nothing to draw; neither is done, so the same command runs both again
    assert ran.outcomes["make"]["outcome"] == "crashed (exit 3)"
    assert ran.outcomes["draw"]["outcome"] == "not run: snap.txt was not made"
    assert "1 step(s) wait for an earlier step's output (draw reads snap.txt)" in err
    assert not (out / "snap.txt").exists() and not run.marker_path(out, steps[0]).exists()
    assert "no snapshot today" in (out / "logs" / "make.log").read_text()  # its log, as an inline step's

    crash.unlink()
    ran, err = _run(_two_steps(tmp_path), out, capsys)
    assert "round 1: 1 step(s) submitted" in err and "round 2: 1 step(s) submitted" in err, err
    assert ran.outcomes["make"]["outcome"] == ran.outcomes["draw"]["outcome"] == "ok"
    assert (out / "drawn.txt").read_text() == "snapshot\ndrawn\n"  # read from OUTPUT_DIR, after the move
    events = _ledger(out)
    assert events.index(("settled", "make"), 2) < events.index(("submitted", "draw"))  # after, not beside
    plan = pd.read_csv(out / run.PLAN_FILE).set_index("step")
    assert plan.loc["make", "outcome"] == "ok" and plan.loc["make", "executor"] == "local"

    before = _ledger(out)
    ran, err = _run(_two_steps(tmp_path), out, capsys)  # the same again: nothing runs
    assert _ledger(out) == before and "2 of 2 steps already done" in err and "round" not in err


def test_with_a_budget_a_step_predicted_to_end_past_it_is_not_submitted_and_runs_next_time(
    tmp_path, capsys, monkeypatch
):
    out = tmp_path / "out"
    monkeypatch.setenv("CRASH", str(tmp_path / "no-crash"))
    make, draw = _two_steps(tmp_path)
    make.predicted_s, draw.predicted_s = 1.0, 3600.0
    ran, err = _run([make, draw], out, capsys, budget_s=60.0)
    assert ran.outcomes["make"]["outcome"] == "ok" and ran.outcomes["draw"]["outcome"] == "over budget"
    assert draw.reason.startswith("not started: predicted 3600 s,") and not (out / "drawn.txt").exists()
    assert "draw" not in {job for _, job in _ledger(out)}  # never submitted
    ran, _ = _run(_two_steps(tmp_path), out, capsys)  # no budget: the step left over runs, the done one does not
    assert ran.outcomes["draw"]["outcome"] == "ok" and _ledger(out).count(("submitted", "make")) == 1


def test_a_job_still_running_when_the_budget_ends_is_stopped_and_runs_next_time(tmp_path, capsys):
    out = tmp_path / "out"
    (tmp_path / "long.py").write_text("import sys, time\nopen(sys.argv[-1], 'w').write('partial')\ntime.sleep(120)\n")
    long = Step("long", "benchmarking_script", "sleeps", str(tmp_path / "long.py"), {"--output": ["long.txt"]})
    long.predicted_s = 1.0
    ran, err = _run([long], out, capsys, budget_s=3.0)
    assert ran.outcomes["long"]["outcome"] == run.BUDGET_STOPPED and ran.wall_s < 60, ran.outcomes
    assert "--budget is spent: 1 job(s) stopped" in err
    assert not run.marker_path(out, long).exists() and not (out / "long.txt").exists()  # not done: runs again
    plan = pd.read_csv(out / run.PLAN_FILE).set_index("step")
    assert plan.loc["long", "outcome"] == run.BUDGET_STOPPED
    assert "stopped at --budget" in (out / "logs" / "long.log").read_text()


@pytest.mark.parametrize(
    "kind, code, done, said",
    [
        ("exited", 0, True, "ok"),
        ("exited", 1, True, "failed rows"),
        ("exited", 2, False, "refused"),
        ("exited", 139, False, "crashed (exit 139)"),
        ("cancelled", None, False, "cancelled"),
        ("preempted", None, False, "preempted"),
        ("timeout", None, False, "timeout (Slurm's time limit)"),
        ("abandoned", None, False, "interrupted"),
    ],
)
def test_only_an_attempt_that_exited_0_or_1_moves_its_files_and_marks_the_step_done(tmp_path, kind, code, done, said):
    out = tmp_path / "out"
    outputs.check_output_dir(out, [])
    step = Step("s", "p", "x", "cs336_systems.attention_bench", {"--output": ["rows.csv"], "--plot": "rows.png"})
    job_dir = JobDir(out / jobs.JOBS)
    (attempt,) = job_dir.new_attempts([jobs.step_job(step, out)], "slurm")
    (attempt.directory / "rows.csv").write_text("a\n1\n")  # the tool wrote no plot
    (attempt.directory / STEP_LOG).write_text("measuring\n")
    (attempt.directory / STARTED).write_text("{}")
    (attempt.directory / EXITED).write_text("{}")
    outputs.claim(out, ["rows.png"])
    (out / "rows.png").write_text("an earlier run's plot")
    placement = {"executor": "slurm", "slurm_job_id": "12_0", "hostname": "node3"}
    entry = jobs.settle(Outcome(attempt, kind, code, "why", placement), step, out)
    assert entry["outcome"] == said and entry["hostname"] == "node3" and entry["slurm_job_id"] == "12_0"
    assert (run.read_marker(out, step) is not None) == done
    assert (out / "rows.csv").exists() == done and (attempt.directory / "rows.csv").exists() != done
    assert (out / "rows.png").exists() != done  # a done step's outputs are its attempt's, no stale one
    log = (out / "logs" / "s.log").read_text()
    assert log.startswith(f"$ {step.shell(out)}\nmeasuring\n") and said in log and "node3" in log


def _same_results(a, b) -> None:
    """The same files, and in each result file the same rows: measured values aside, what each row is."""
    names = lambda d: sorted(p.relative_to(d).as_posix() for p in d.rglob("*") if jobs.JOBS not in p.as_posix())  # noqa: E731
    assert names(a) == names(b)
    identity = ["tool", "status", "implementation", "head_dim", "context_length", "model_size", "pass_type"]
    identity += ["precision", "batch_size", "warmup_steps", "step_index", "measured"]
    for path in sorted(a.glob("*.csv")):
        if path.name.startswith("handout_"):
            continue
        x, y = pd.read_csv(path), pd.read_csv(b / path.name)
        keep = [c for c in identity if c in x.columns]
        assert list(x.columns) == list(y.columns) and len(x) == len(y) > 0, path.name
        assert x[keep].equals(y[keep]), path.name


@pytest.mark.slow
def test_local_workers_give_the_steps_and_result_files_inline_gives(tmp_path, capsys):
    argv = ["--edition", "2026", "--scale", "small", "--device", "cpu"]
    argv += ["--problems", "benchmarking_script", "pytorch_attention"]
    inline, local = tmp_path / "inline", tmp_path / "local"
    assert run_main(cli.main, capsys, *argv, "--output-dir", inline)[0] == 0
    code, _, err = run_main(cli.main, capsys, *argv, "--output-dir", local, "--executor", "local", "--workers", "2")
    assert code == 0, err
    assert "local: 2 workers at once" in err and "round 1: 3 step(s) submitted" in err
    plans = [pd.read_csv(d / run.PLAN_FILE).set_index("step") for d in (inline, local)]
    assert plans[0]["outcome"].to_dict() == plans[1]["outcome"].to_dict() == dict.fromkeys(plans[0].index, "ok")
    assert set(plans[1]["executor"]) == {"local"} and set(plans[0]["executor"]) == {"inline"}
    _same_results(inline, local)
    assert "executor=local" in (local / "logs" / "pytorch_attention.log").read_text()

    ledger = (local / jobs.JOBS / "ledger.jsonl").read_text()
    code, _, err = run_main(cli.main, capsys, *argv, "--output-dir", local, "--executor", "local", "--workers", "2")
    assert code == 0 and "3 of 3 steps already done" in err and "round" not in err, err
    assert (local / jobs.JOBS / "ledger.jsonl").read_text() == ledger  # nothing submitted


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--slurm-same-node"], "--slurm-same-node is for --executor slurm"),
        (["--executor", "local", "--no-wait"], "--no-wait is for --executor slurm"),
        (["--workers", "2"], "--workers is for --executor local"),
        (["--executor", "local", "--slurm-partition", "gpu"], "--slurm-partition is for --executor slurm"),
        (["--write-up", "--executor", "local"], "--write-up runs nothing: it takes no --executor"),
        (["--executor", "slurm", "--device", "cuda:1"], "give --device cuda"),
        (["--executor", "slurm", "--dry-run", "--device", "cuda"], "name it with --assume-device"),
        (["--executor", "local", "--assume-device", "H100 80GB"], "--executor local runs on this machine's"),
        (["--executor", "slurm", "--device", "cpu", "--assume-device", "H100 80GB"], "--assume-device names a GPU"),
    ],
)
def test_bad_executor_flags_are_one_line_and_exit_2(argv, message, capsys, tmp_path):
    assert cli.main(["--scale", "small", "--output-dir", str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_the_slurm_dry_run_prints_the_sbatch_script_of_the_steps_pinned_to_the_first_jobs_node(tmp_path, capsys):
    """A first job found the nodes' device (target.json): the plan is for it, and --slurm-same-node pins
    every job to its node; a step that reads another's output is left to a later round."""
    pytest.importorskip("submitit")
    out = tmp_path / "out"
    (out / ".handout").mkdir(parents=True)
    record = {**CPU.__dict__, "hostname": "node7.cluster", "slurm_node": "node7"}
    (out / nodes.TARGET_RECORD).write_text(json.dumps(record))
    argv = ["--scale", "small", "--device", "cpu", "--problems", "pytorch_attention", "--output-dir", str(out)]
    code, text, err = run_main(cli.main, capsys, *argv, "--executor", "slurm", "--slurm-same-node", "--dry-run")
    assert code == 0, err
    assert "on AMD EPYC" in text and "every job on node node7 (--slurm-same-node)" in text
    assert "#SBATCH --nodelist=node7" in text and "# pytorch_attention" in text
    script = text[text.index("#!/bin/bash") :]
    assert f"{out}/.handout/executor/jobs/pytorch_attention-" in script
    assert '--output "$dir"/pytorch_attention.csv' in script  # the job writes into its attempt directory
    assert not (out / jobs.JOBS).exists()  # a dry run writes nothing


def test_a_step_job_writes_into_its_attempt_and_reads_earlier_outputs_from_the_output_dir(tmp_path):
    step = Step("t", "memory_profiling", "timeline", "cs336_systems.memory.timeline", {})
    step.flags = {"--snapshot": "s.pickle", "--plot": "t.png"}
    job = jobs.step_job(step, tmp_path)
    assert job.name == jobs.job_name(step, tmp_path) and job.name.startswith("t-")
    assert "{attempt_dir}/t.png" in job.command and str(tmp_path / "s.pickle") in job.command
    printed = Step("m", "p", "x", "cs336_systems.mixed_precision", {"--output": ["m.csv"]}, capture="m.txt")
    command = jobs.step_job(printed, tmp_path).command
    assert command[:4] == ("sh", "-c", 'exec "$@" > "$0"', "{attempt_dir}/m.txt")  # stdout kept, as inline
    step.flags["--plot"] = "other.png"  # another command: another job
    assert jobs.job_name(step, tmp_path) != job.name


def test_the_handout_help_lists_the_executor_flags():
    text = cli.build_parser().format_help()
    for flag in ("--executor", "--workers", "--gpus", "--slurm-partition", "--slurm-same-node", "--no-wait"):
        assert flag in text
    assert "OUTPUT_DIR/.handout/executor" in " ".join(text.split())
