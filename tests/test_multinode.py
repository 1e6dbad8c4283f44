"""The distributed tools as one Slurm job of several nodes (--executor slurm --slurm-nodes 2) and the link model
they are checked against. The first tests need no Slurm: the model by hand, the job's flags and command line,
the ranks' variables taken from Slurm's. The others run on the emulated cluster of `bash
scripts/dev/slurm_cluster.sh start --nodes 2` (each node a network namespace with its own hostname and slurmd,
partition `multi`): rows from ranks on two hosts, a node killed mid-job, a rank that never joins, a link cut.
They skip, with the reason, where that cluster is not up; with CS336_REQUIRE_SLURM_NODES=2 (.ci/run) they fail
instead."""

import importlib.util
import json
import os
import shutil
import subprocess
import time

import psutil
import pytest

from cs336_systems import allreduce_bench
from cs336_systems.distributed.links import Links, name_peers, rank_columns
from cs336_systems.distributed.slurm_job import ROWS, multinode_job
from cs336_systems.executor import ATTEMPT_DIR
from cs336_systems.executor.step import rank_variables
from tests.helpers import HANG_GUARD_S, PYTHON, REPO, child_env, run_main
from tests.tiny import STEPS, TINY_DDP

PARTITION = "multi"
CLUSTER = ["bash", str(REPO / "scripts" / "dev" / "slurm_cluster.sh")]
JOB = ["--backend", "gloo", "--executor", "slurm", "--slurm-nodes", "2", "--slurm-partition", PARTITION]
LONG = ["--warmup-steps", "1", "--measure-steps", "500"]  # 500 all-reduces of 64 MB: many seconds on any link


# -- without Slurm --------------------------------------------------------------------------------


def test_the_ring_model_by_hand():
    links = Links(latency_ms=(0.5, 2.0), bytes_per_s=(1e8, 4e8))  # the slowest link sets the pace: 2 ms, 1e8 B/s
    # 2 ranks: 2 steps of latency, 2(n-1)/n = 1 of the bytes
    assert links.ring_allreduce_ms(64e6, 2) == pytest.approx(2 * 2.0 + 64e6 / 1e8 * 1e3)
    # 4 ranks, 3 all-reduces sharing the bytes: 6 steps of latency each, 1.5 of the bytes once
    assert links.ring_allreduce_ms(8e6, 4, calls=3) == pytest.approx(3 * 6 * 2.0 + 1.5 * 8e6 / 1e8 * 1e3)


def test_rank_columns_and_peers_named():
    peers = [("node1", "10.0.0.1"), ("node1", "10.0.0.1"), ("node2", "10.0.0.2")]
    columns = rank_columns(peers, Links((0.1, 0.2, 0.3), (3e9, 1e9, 2e9)))
    assert columns["nodes"] == 2 and columns["tasks_per_node"] == 2 and columns["rank_hosts"] == "node1,node1,node2"
    assert columns["link_latency_ms"] == 0.3 and columns["link_gbps"] == 1.0
    assert columns["link_probe"] == [[0.1, 3e9], [0.2, 1e9], [0.3, 2e9]]
    assert "link_gbps" not in rank_columns(peers, None)  # not probed: the columns stay empty
    said = name_peers("Read error [10.0.0.2]:4242: Connection reset by peer.", peers, 30)
    assert said == "Read error [10.0.0.2]:4242 (node2): Connection reset by peer."
    assert "--timeout + --init-timeout = 30 s" in name_peers("Timed out waiting 30000ms for recv", peers, 30)


def test_ranks_take_torchrun_variables_from_slurms(monkeypatch):
    job = dict(SLURM_JOB_ID="77", SLURM_NTASKS="4", SLURM_JOB_NUM_NODES="2", SLURM_JOB_NODELIST="node[1-2]")
    for name, value in {**job, "SLURM_PROCID": "3", "SLURM_LOCALID": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    ranks = rank_variables()
    assert {k: ranks[k] for k in ("MASTER_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")} == {
        "MASTER_ADDR": "node1",  # the first node of the job's list
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
    }
    monkeypatch.setenv("SLURM_PROCID", "0")
    assert rank_variables()["MASTER_PORT"] == ranks["MASTER_PORT"]  # every rank draws the same port
    monkeypatch.setenv("SLURM_NTASKS", "1")  # a sweep's one-task job: nothing to set
    assert rank_variables() == {}


def test_the_jobs_command_is_the_tools_own_less_the_executors_flags(tmp_path):
    args = [*JOB, "--slurm-tasks-per-node", "2", "--world-sizes", "4", "--sizes", "1MB"]
    args += ["--output", str(tmp_path / "r.csv"), "--slurm-time", "5", "--probe-links"]
    parsed = allreduce_bench.build_parser().parse_args(args)
    parsed.argv = tuple(args)
    job = multinode_job(parsed)
    assert job.world_size == 4 and (job.settings.slurm.nodes, job.settings.slurm.tasks_per_node) == (2, 2)
    assert job.settings.slurm.gpus_per_job == 0 and job.job_dir == tmp_path / "r.jobs"
    assert list(job.command[1:]) == [
        "-m",
        "cs336_systems.allreduce_bench",
        "--backend",
        "gloo",
        "--sizes",
        "1MB",
        "--probe-links",
        "--output",
        f"{ATTEMPT_DIR}/{ROWS}",
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--slurm-nodes", "2"], "--slurm-nodes is for --executor slurm"),
        (["--slurm-partition", "multi"], "--slurm-partition is for --executor slurm"),
        ([*JOB, "--world-sizes", "3"], "--slurm-nodes 2 x --slurm-tasks-per-node 1 = 2"),
        ([*JOB, "--no-wait"], "--no-wait is for the sweeps"),
        ([*JOB, "--slurm-array-parallelism", "2"], "a distributed tool's run is one job"),
        ([*JOB[2:], "--backend", "nccl", "--slurm-tasks-per-node", "4", "--slurm-gpus-per-node", "2"], "one GPU"),
    ],
)
def test_job_flags_refused_in_one_line(args, message, capsys):
    code, _, err = run_main(allreduce_bench.main, capsys, *args)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


# -- on the emulated cluster --------------------------------------------------------------------------


def _no_cluster() -> str | None:
    if shutil.which("sinfo") is None or importlib.util.find_spec("submitit") is None:
        return "no Slurm or no submitit here (bash scripts/dev/slurm_cluster.sh start --nodes 2)"
    done = subprocess.run(["sinfo", "-h", "-N", "-p", PARTITION, "-o", "%N"], capture_output=True, text=True)
    if len(done.stdout.split()) < 2:
        return f"no partition {PARTITION} of 2 nodes (bash scripts/dev/slurm_cluster.sh start --nodes 2)"
    if os.geteuid() != 0:
        return "the node and link faults need root (slurm_cluster.sh kill-node, cut-link)"
    return None


REASON = _no_cluster()
REQUIRED = os.environ.get("CS336_REQUIRE_SLURM_NODES") == "2"
cluster = pytest.mark.skipif(REASON is not None and not REQUIRED, reason=str(REASON))


@pytest.fixture
def nodes():
    """The emulated nodes, healed after the test (a killed node, a cut link)."""
    if REASON is not None:
        pytest.fail(f"CS336_REQUIRE_SLURM_NODES=2 is set, but: {REASON}")
    yield
    subprocess.run([*CLUSTER, "heal"], check=True, capture_output=True, timeout=HANG_GUARD_S)


def _start(tmp_path, tool: str, *args: str, env: dict | None = None) -> subprocess.Popen:
    command = [PYTHON, "-m", f"cs336_systems.{tool}", *JOB, "--slurm-time", "10", *args]
    command += ["--output", str(tmp_path / "rows.jsonl")]
    environment = {**child_env(), **(env or {})}
    return subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=environment, cwd=tmp_path)


def _rows(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]


def _nothing_left(tmp_path) -> None:
    """No process of the job (its command names tmp_path) on any node: Slurm kills what scancel reached within
    KillWait (5 s here); a rank behind a cut link ends at its own collective timeout."""
    deadline = time.monotonic() + 120
    while left := [p.info["cmdline"] for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in str(p.info)]:
        assert time.monotonic() < deadline, f"still running: {left}"
        time.sleep(0.5)


@cluster
def test_allreduce_as_one_job_across_two_hosts(tmp_path, nodes):
    process = _start(tmp_path, "allreduce_bench", "--sizes", "64KB", "1MB", *STEPS)
    _, err = process.communicate(timeout=HANG_GUARD_S)
    assert process.returncode == 0, err[-3000:]
    rows = _rows(tmp_path)
    assert [row["status"] for row in rows] == ["ok", "ok"]
    for row in rows:
        hosts = row["rank_hosts"].split(",")
        assert len(hosts) == 2 and len(set(hosts)) == 2 and row["nodes"] == 2 and row["tasks_per_node"] == 1
        assert (row["launcher"], row["executor"], row["backend"], row["world_size"]) == ("slurm", "slurm", "gloo", 2)
        assert row["hostname"] == hosts[0]  # rank 0's, where the rows were written
        # the prediction is the model on the links the probe measured before the sizes
        links = Links(*zip(*row["link_probe"], strict=True))
        assert row["link_gbps"] == pytest.approx(min(links.bytes_per_s) / 1e9)
        assert row["predicted_ms"] == pytest.approx(links.ring_allreduce_ms(row["size_bytes"], 2))
        assert row["predicted_busbw_gbps"] == pytest.approx(row["size_bytes"] / row["predicted_ms"] / 1e6)
    _nothing_left(tmp_path)


@cluster
def test_ddp_as_one_job_across_two_hosts(tmp_path, nodes):
    process = _start(tmp_path, "ddp_bench", "--strategies", "ddp", *TINY_DDP)
    _, err = process.communicate(timeout=HANG_GUARD_S)
    assert process.returncode == 0, err[-3000:]
    single, ddp = _rows(tmp_path)
    assert (single["strategy"], single["status"], single["nodes"]) == ("single", "ok", 1)  # rank 0 alone
    assert (ddp["strategy"], ddp["status"], ddp["nodes"], ddp["world_size"]) == ("ddp", "ok", 2, 2)
    assert len(set(ddp["rank_hosts"].split(","))) == 2 and ddp["predicted_comm_ms"] > 0


@cluster
def test_a_node_lost_mid_job_ends_it_with_a_row_that_says_so(tmp_path, nodes):
    # the second size runs for many seconds; the node goes once the first size's row is out
    process = _start(tmp_path, "allreduce_bench", "--sizes", "4B", "64MB", *LONG)
    lines = []
    for line in process.stderr:
        lines.append(line)
        if line.startswith("n=2 4B:"):
            hosts = _rows(tmp_path)[0]["rank_hosts"].split(",")
            subprocess.run([*CLUSTER, "kill-node", hosts[1]], check=True, timeout=60)
            break
    _, err = process.communicate(timeout=HANG_GUARD_S)
    assert process.returncode == 1, "".join(lines) + err[-3000:]
    first, second = _rows(tmp_path)
    assert first["status"] == "ok"  # kept
    assert second["status"] == "error" and "Connection" in second["error"] and f"({hosts[1]})" in second["error"]
    _nothing_left(tmp_path)


@cluster
def test_a_rank_that_never_joins_ends_the_job_at_the_init_timeout(tmp_path, nodes):
    env = {"CS336_SYSTEMS_INJECT_FAILURE": "1:join"}
    process = _start(tmp_path, "allreduce_bench", "--sizes", "4KB", *STEPS, "--init-timeout", "5", env=env)
    _, err = process.communicate(timeout=HANG_GUARD_S)
    assert process.returncode == 1, err[-3000:]
    rows = _rows(tmp_path)
    assert [row["status"] for row in rows] == ["error"]
    assert "no rendezvous with the other 1 rank(s)" in rows[0]["error"] and "did not start" in rows[0]["error"]
    _nothing_left(tmp_path)


@cluster
def test_a_cut_link_ends_the_job_at_the_collective_timeout(tmp_path, nodes):
    process = _start(
        tmp_path, "allreduce_bench", "--sizes", "4B", "64MB", *LONG, "--timeout", "5", "--init-timeout", "5"
    )
    for line in process.stderr:
        if line.startswith("n=2 4B:"):
            hosts = _rows(tmp_path)[0]["rank_hosts"].split(",")
            subprocess.run([*CLUSTER, "cut-link", hosts[1]], check=True, timeout=60)
            break
    _, err = process.communicate(timeout=HANG_GUARD_S)
    assert process.returncode == 1, err[-3000:]
    first, second = _rows(tmp_path)
    assert first["status"] == "ok" and second["status"] == "error"
    assert "a peer sent nothing within the collective timeout, --timeout + --init-timeout = 10 s" in second["error"]
    _nothing_left(tmp_path)


@cluster
def test_a_job_no_partition_can_start_is_one_line_and_cancelled(tmp_path, nodes):
    command = [PYTHON, "-m", "cs336_systems.allreduce_bench", *JOB[:-1], "debug", "--sizes", "4B"]  # one node there
    done = subprocess.run(command, capture_output=True, text=True, env=child_env(), cwd=tmp_path, timeout=HANG_GUARD_S)
    # the executor's rule for any job Slurm can never place: cancelled, a row that says why and what to change
    assert done.returncode == 1 and "Slurm can never start the job as asked" in done.stderr, done.stderr
    assert "change the --slurm-* request" in done.stderr
    job_id = done.stderr.split("Slurm job ")[1].split()[0].rstrip(":;")
    queued = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=60)
    assert queued.stdout.strip() in ("", "CANCELLED", "COMPLETING"), queued.stdout
