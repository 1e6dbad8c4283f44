"""scripts/checks/bad_inputs.py judges each case by its own reason: a refusal must name the case's flag,
variable or file (not a BASE flag every case of the command shares), a hostile-code case must
leave its documented row status."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "checks" / "bad_inputs.py"
spec = importlib.util.spec_from_file_location("bad_inputs", SCRIPT)
bad_inputs = importlib.util.module_from_spec(spec)
sys.modules["bad_inputs"] = bad_inputs  # its dataclasses look their module up
spec.loader.exec_module(bad_inputs)


def outcome(case, stderr, returncode=2, statuses=()):
    return bad_inputs.Outcome("loader_bench", case, returncode, stderr, 1.0, list(statuses))


def test_a_refusal_of_another_flag_does_not_pass_the_case():
    other = "prog: error: argument --compute-ms: must be a positive number, got 0\n"
    assert not outcome(["--num-items", "0"], other).passed
    assert outcome(["--num-items", "0"], "prog: error: argument --num-items: must be positive\n").passed
    assert outcome(["--d-model", "9"], "prog: error: d_model must be at most 8\n").passed  # - and _ alike
    assert outcome(["{tmp}/x.csv"], "prog: error: /tmp/bad-inputs-1/x.csv:2: damaged\n").passed
    assert not outcome(["--num-items", "0"], "one\ntwo\n").passed
    assert not outcome(["--num-items", "0"], "Traceback (most recent call last):\n", returncode=1).passed


def test_a_stale_environment_must_be_named():
    case = bad_inputs.Env([], {"RANK": "5", "WORLD_SIZE": "2"}, "RANK")
    assert outcome(case, "prog: error: RANK 5 is not below WORLD_SIZE 2\n").passed
    assert not outcome(case, "prog: error: --backend gloo\n").passed


def test_only_the_openmp_runtimes_own_warning_is_left_out_and_only_for_a_bad_omp_num_threads():
    case = bad_inputs.Env([], {"OMP_NUM_THREADS": "lots"}, "OMP_NUM_THREADS")
    ours = "prog: error: environment variable OMP_NUM_THREADS='lots' is not an integer\n"
    warning = "\nlibgomp: Invalid value for environment variable OMP_NUM_THREADS\n"
    assert outcome(case, warning + ours).passed
    assert not outcome(case, warning + "prog: progress\n" + ours).passed  # a second line of ours still fails
    stale = bad_inputs.Env([], {"RANK": "5", "WORLD_SIZE": "2"}, "RANK")
    assert not outcome(stale, warning + "prog: error: RANK 5 is not below WORLD_SIZE 2\n").passed


def test_a_hostile_code_case_passes_on_its_documented_row_or_a_refusal():
    case = bad_inputs.Row(["--model-factory", "hostile.models:exits"], ("error",))
    assert outcome(case, "1 error row\n", returncode=1, statuses=["error"]).passed
    assert not outcome(case, "", returncode=0, statuses=[]).passed  # exit 0 without its row
    assert not outcome(case, "", returncode=1, statuses=["ok"]).passed
    assert outcome(case, "prog: error: --model-factory hostile.models:exits called sys.exit\n").passed


def test_update_replaces_only_the_rerun_commands_rows_and_recounts():
    head = "# t\n\n**2 of 3** bad (9 s on this machine).\n\n| command | x |\n|---|---|\n"
    old = head + "| report | a |\n| compare **FAIL** | b |\n| monitor | c |\n"
    new = "# t\n\n**1 of 1** bad (4 s on this machine).\n\n| command | x |\n|---|---|\n| compare | b2 |\n"
    text = bad_inputs.updated(old, new, ["compare"])
    assert "**3 of 3**" in text
    assert [line for line in text.splitlines() if line.startswith("| ") and "command" not in line] == [
        "| report | a |",
        "| compare | b2 |",
        "| monitor | c |",
    ]
