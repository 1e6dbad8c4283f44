"""cs336-bench warmup_study on a tiny model: every step kept, the table and the plot written."""

import subprocess

import pandas as pd

from tests.helpers import PYTHON, child_env
from tests.tiny import TINY_BATCH, TINY_CPU, TINY_SHAPE


def test_warmup_study_keeps_every_step_and_writes_table_and_plot(tmp_path):
    result = subprocess.run(
        [
            PYTHON,
            "-m",
            "cs336_bench.warmup_study",
            *TINY_SHAPE,
            *TINY_BATCH,
            *TINY_CPU,
            "--warmups",
            "0",
            "2",
            "--measure-steps",
            "3",
            "--output-dir",
            str(tmp_path),
            "--output",
            str(tmp_path / "runs.jsonl"),
        ],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    steps = pd.read_csv(tmp_path / "warmup_study_cpu.csv")
    assert steps.groupby("warmup_steps").size().to_dict() == {0: 3, 2: 5}  # warmup + measured, every one
    assert list(steps[steps["warmup_steps"] == 2]["measured"]) == [False, False, True, True, True]
    # each row says where it ran and which size table named its model, as every tool's rows do
    assert steps["device_name"].notna().all() and steps["torch_version"].notna().all()
    assert set(steps["size_table"]) == {2026} and "git_commit" in steps.columns
    assert result.stderr.startswith("size table 2026 (")
    table = (tmp_path / "warmup_study_cpu.md").read_text()
    assert (
        "warmup_steps" in table
        and "cv_pct" in table
        and "first_over_median" in table
        and "](warmup_study_cpu.png)" in table
    )
    assert (tmp_path / "warmup_study_cpu.png").stat().st_size > 1000
    assert len((tmp_path / "runs.jsonl").read_text().splitlines()) == 2  # each run's full record


def test_warmup_study_refuses_warmup_steps():
    result = subprocess.run(
        [PYTHON, "-m", "cs336_bench.warmup_study", "--warmup-steps", "3"],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )
    assert result.returncode == 2 and "use --warmups" in result.stderr and "Traceback" not in result.stderr
