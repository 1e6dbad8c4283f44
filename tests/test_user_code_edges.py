"""The user's model and optimizer at the edges: what they get wrong before any step is one line and exit
status 2 in every tool, before any measurement or rank starts; what they are is recorded on the row."""

from __future__ import annotations

import importlib
import json

import pytest

from cs336_systems.optimizer import OptimizerFactoryError, check_user_optimizer
from tests.tiny import TINY, TINY_DDP, TINY_GRID

MODELS = "tests.fixtures.hostile.models"
TOOLS = {  # each tool's tiny run on the CPU
    "benchmark": TINY,
    "benchmark_direct": TINY_GRID,
    "run_benchmarks": TINY_GRID,
    "find_max": [*TINY, "--dimension", "batch-size", "--max", "4"],
    "ddp_bench": [*TINY_DDP, "--world-sizes", "2", "--device", "cpu"],
}


@pytest.mark.parametrize(
    ("factory", "words"),
    [
        ("raises_in_init", "raised ValueError: d_model must be a multiple of 128"),
        ("returns_its_class", "returned the class Tiny itself, expected a torch.nn.Module"),
        ("builds_on_meta", "built its parameters on the meta device"),
        ("wrong_vocabulary", "expected floating (B, T, V)"),
        ("integer_logits", "torch.int64 logits"),
        ("logits_and_aux", "returned a tuple of 2, expected a logits tensor"),
        ("exits", "called sys.exit(0)"),
    ],
)
@pytest.mark.parametrize("tool", list(TOOLS))
def test_a_factory_wrong_before_any_step_is_refused_in_every_tool(tool, factory, words, tmp_path, capsys):
    output = tmp_path / "rows.csv"
    main = importlib.import_module(f"cs336_systems.{tool}").main
    code = main([*TOOLS[tool], "--model-factory", f"{MODELS}:{factory}", "--output", str(output)])
    err = capsys.readouterr().err
    assert code == 2 and words in err and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith(("python -m", "cs336-bench")) and not output.exists()


def test_a_user_model_built_in_fp16_says_so_on_its_row(tmp_path):
    from cs336_systems import benchmark

    output = tmp_path / "row.jsonl"
    code = benchmark.main(
        [*TINY, "--pass-type", "forward", "--model-factory", f"{MODELS}:half_precision", "--output", str(output)]
    )
    row = json.loads(output.read_text())
    assert code == 0 and row["param_dtype"] == "fp16", row["error"]


@pytest.mark.parametrize(
    ("factory", "status", "words"),
    [
        ("freezes_the_clock", "wrong", "replaced time.perf_counter for the whole process (put back after it ran)"),
        ("float64_by_default", "wrong", "called torch.set_default_dtype(torch.float64) for the whole process"),
        ("no_backward", "wrong", "backward reached no parameter of the model (every .grad stayed None"),
        ("medium_matmuls", "ok", "called torch.set_float32_matmul_precision('medium')"),
    ],
)
def test_a_factory_that_changes_the_process_or_skips_backward_says_so_on_its_row(factory, status, words):
    """These were ok rows: a frozen clock, a float64 default dtype, a backward that reaches nothing; and the
    row recorded the matmul precision set before the user's code changed it."""
    import time

    import torch

    from cs336_systems.runner import run_benchmark
    from tests.helpers import tiny_benchmark_config

    clock, dtype = time.perf_counter, torch.get_default_dtype()
    record = run_benchmark(tiny_benchmark_config(model_factory=f"{MODELS}:{factory}", pass_type="forward-backward"))
    assert record.status == status and words in (record.error or record.notes), (record.error, record.notes)
    assert record.step_ms and record.median_ms > 0  # the times are kept, measured with our clock
    assert record.matmul_precision == ("medium" if factory == "medium_matmuls" else "highest")
    assert (time.perf_counter, torch.get_default_dtype(), torch.get_float32_matmul_precision()) == (
        clock,
        dtype,
        "highest",
    )  # put back for what runs next


@pytest.mark.parametrize(
    ("changes", "status"),
    [
        ({"model_factory": f"{MODELS}:no_backward"}, "wrong"),  # and so its AdamW changed nothing
        ({"optimizer_factory": "tests.fixtures.hostile.optimizers:ClearsTheGradients"}, "ok"),
    ],
)
def test_a_training_step_without_gradients_is_wrong_only_when_nothing_was_trained(changes, status):
    from cs336_systems.runner import run_benchmark
    from tests.helpers import tiny_benchmark_config

    record = run_benchmark(tiny_benchmark_config(pass_type="train-step", **changes))
    assert record.status == status, record.error


def test_an_optimizer_that_does_not_hold_the_parameters_it_is_given_is_refused(capsys):
    from cs336_systems import benchmark

    with pytest.raises(OptimizerFactoryError, match="its param_groups hold 1 others and not that one"):
        check_user_optimizer("tests.fixtures.hostile.optimizers:its_own_parameters")
    code = benchmark.main(
        [*TINY, "--pass-type", "train-step", "--optimizer", "tests.fixtures.hostile.optimizers:its_own_parameters"]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "must optimize the parameters it is called with" in err
    check_user_optimizer("tests.fixtures.hostile.optimizers:does_nothing")  # holds them: its note is the runner's
