"""`handout --executor slurm` against a real Slurm (the one-node cluster of scripts/dev/slurm_cluster.sh, which
.ci/run starts): the device found by a first job, each step one job, the write-up verifying, the same command
again running nothing. Skipped, with the reason, where there is no Slurm; with CS336_REQUIRE_SLURM=1 (CI) it
fails instead. A module of its own: test_executor_slurm.py's time-limit job expects its module to be short."""

import json
import socket

import pytest

from cs336_systems.handout import cli as handout_cli
from cs336_systems.results import read_results
from tests.helpers import run_main
from tests.test_executor_slurm import REASON, REQUIRED

pytestmark = pytest.mark.skipif(REASON is not None and not REQUIRED, reason=str(REASON))


@pytest.fixture(autouse=True)
def _required():
    if REASON is not None and REQUIRED:
        pytest.fail(f"CS336_REQUIRE_SLURM is set, but: {REASON}")


@pytest.mark.slow
def test_the_handout_as_slurm_jobs_runs_every_step_once_and_the_same_command_again_runs_nothing(tmp_path, capsys):
    """--no-wait first: a first job finds the nodes' device and the command returns; the same command without
    it plans for that device, runs each step as one job and writes a write-up that verifies; again: nothing."""
    out = tmp_path / "handout"
    argv = ["--edition", "2026", "--scale", "small", "--device", "cpu", "--problems", "benchmarking_script"]
    argv += ["pytorch_attention", "--executor", "slurm", "--slurm-time", "10", "--output-dir", str(out)]
    code, _, err = run_main(handout_cli.main, capsys, *argv, "--no-wait")
    assert code == 0 and "to find the nodes' device" in err and "once it ran, the same command plans" in err, err

    code, _, err = run_main(handout_cli.main, capsys, *argv)
    assert code == 0, err
    assert "its device as a first Slurm job found it on node" in err and "round 1: 3 step(s) submitted" in err
    assert "each cell of its" in err  # report --verify on the write-up
    plan = read_results(out / "handout_plan.csv")
    assert set(plan["outcome"]) == {"ok"} and set(plan["executor"]) == {"slurm"}
    assert plan["slurm_job_id"].nunique() == 3 and set(plan["hostname"]) == {socket.gethostname()}
    rows = read_results(out / "pytorch_attention.csv")
    assert len(rows) == 4 and set(rows["executor"]) == {"slurm"} and set(rows["status"]) == {"ok"}
    ledger = (out / ".handout" / "executor" / "ledger.jsonl").read_text()
    submitted = [json.loads(line)["job"] for line in ledger.splitlines() if '"submitted"' in line]
    assert len(submitted) == len(set(submitted)) == 4  # the device's job, then each step once

    code, _, err = run_main(handout_cli.main, capsys, *argv, "--slurm-same-node")
    assert code == 0 and "3 of 3 steps already done" in err and "round" not in err, err
    node = json.loads((out / ".handout" / "target.json").read_text())["slurm_node"]
    assert f"every job on node {node} (--slurm-same-node)" in err
    assert (out / ".handout" / "executor" / "ledger.jsonl").read_text() == ledger


def test_a_slurm_job_still_running_when_the_budget_ends_is_cancelled_and_not_done(tmp_path, capsys):
    from cs336_systems.executor.settings import ExecutorSettings, SlurmRequest
    from cs336_systems.executor.slurm import SlurmRunner
    from cs336_systems.handout import jobs, outputs, run
    from cs336_systems.handout.plan import Step
    from tests.test_handout_jobs import CPU

    out = tmp_path / "out"
    (tmp_path / "long.py").write_text("import sys, time\nopen(sys.argv[-1], 'w').write('partial')\ntime.sleep(300)\n")
    long = Step("long", "benchmarking_script", "sleeps", str(tmp_path / "long.py"), {"--output": ["long.txt"]})
    long.predicted_s = 1.0
    outputs.check_output_dir(out, [])
    plan = jobs.PlanJobs([long], CPU, out, "2026", "small", jobs.job_dir_of(out, None))
    runner = SlurmRunner(ExecutorSettings(kind="slurm", device="cpu", slurm=SlurmRequest(time_min=10)), plan.job_dir)
    ran = jobs.run_jobs(plan, runner, wait=True, budget_s=5.0)
    err = capsys.readouterr().err
    assert ran.outcomes["long"]["outcome"] == run.BUDGET_STOPPED and ran.wall_s < 120, (ran.outcomes, err)
    assert "--budget is spent: 1 job(s) stopped" in err and not run.marker_path(out, long).exists()
    job_id = ran.outcomes["long"]["slurm_job_id"]
    assert job_id and not _in_queue(job_id)


def _in_queue(job_id: str) -> bool:
    import subprocess

    shown = subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True)
    return bool(shown.stdout.strip())
