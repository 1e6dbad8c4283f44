"""Real out-of-memory, provoked in a child process under an address-space cap."""

import json
import subprocess
import sys

import pandas as pd
import pytest

from tests.helpers import FIXTURES, PYTHON, child_env

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs RLIMIT_AS and /proc")


def test_real_oom_while_stepping_is_recorded_and_the_process_goes_on():
    # naive attention scores alone: 16 x 2 heads x 4096^2 x 4 bytes = 2 GiB > 600 MiB headroom
    result = subprocess.run(
        [PYTHON, str(FIXTURES / "oom_then_ok.py"), "600"], capture_output=True, text=True, env=child_env(), timeout=300
    )
    assert result.returncode == 0, result.stderr
    (first_status, first_error), (second_status, second_error) = json.loads(result.stdout.strip().splitlines()[-1])
    assert first_status == "oom" and "can't allocate memory" in first_error
    assert second_status == "ok", second_error


def test_real_oom_while_building_via_the_cli(tmp_path):
    # d_model 1024, 8 layers, vocab 50,000: 236.6M parameters = 947 MB of fp32 > 400 MiB headroom
    out = tmp_path / "oom.csv"
    args = [
        "--d-model",
        "1024",
        "--d-ff",
        "4096",
        "--num-layers",
        "8",
        "--num-heads",
        "16",
        "--vocab-size",
        "50000",
        "--context-length",
        "32",
        "--device",
        "cpu",
        "--output",
        str(out),
    ]
    result = subprocess.run(
        [PYTHON, "-m", "cs336_systems.memory_cap", str(400 * 2**20), "cs336_systems.benchmark", *args],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    row = pd.read_csv(out).iloc[0]
    assert row["status"] == "oom" and "can't allocate memory" in row["error"]
    assert row["num_params"] == 236_635_136  # known even though the model never fit
    assert "| oom " in result.stdout
