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
    assert "every cell of its" in err  # report --verify on the write-up
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
