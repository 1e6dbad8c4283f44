"""Size tables, activation checkpointing, residuals, a user's optimizer, attention n/a."""

import json
import math
import subprocess

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from cs336_systems import benchmark, residuals
from cs336_systems.config import BenchmarkConfig
from cs336_systems.factory import count_parameters_for
from cs336_systems.flops import analytic_flops_per_step, flops_per_step
from cs336_systems.memory import estimate_memory
from cs336_systems.memory.estimate import block_saved_bytes
from cs336_systems.models import (
    SIZE_TABLES,
    ConfigError,
    ModelConfig,
    TransformerLM,
    formula_num_params,
)
from cs336_systems.optimizer import OPTIMIZER_KWARGS
from cs336_systems.runner import run_benchmark
from tests.conftest import (
    CPU,
    PYTHON,
    TINY_BATCH,
    TINY_SHAPE,
    child_env,
    run_main,
    tiny_benchmark_config,
    tiny_model_config,
)

# -- size tables -----------------------------------------------------------------------


def test_2026_table_exact_parameter_counts():
    xl = ModelConfig.from_size("xl", "2026")
    ten_b = ModelConfig.from_size("10B", "2026")
    assert (xl.d_model, xl.d_ff, xl.num_layers, xl.num_heads) == (2560, 10240, 32, 32)
    assert (ten_b.d_model, ten_b.d_ff, ten_b.num_layers, ten_b.num_heads) == (4608, 12288, 50, 36)
    assert formula_num_params(xl) == 3_406_809_600
    assert formula_num_params(ten_b) == 12_832_823_808
    assert ModelConfig.from_size("xl").d_model == 2560  # no table named: the newest edition's
    assert ModelConfig.from_size("2.7B").size_table == "2025"  # a name only one table has picks it


@pytest.mark.parametrize("edition", list(SIZE_TABLES))
def test_every_size_built_has_the_formula_count(edition):
    for name in SIZE_TABLES[edition]:
        config = ModelConfig.from_size(name, edition)
        assert config.size_table == edition and config.size_name == name
        assert count_parameters_for(config) == formula_num_params(config)


def test_size_not_in_the_table_is_refused():
    with pytest.raises(
        ConfigError, match=r"unknown model size '10B'; .* \(10B is in the 2026 table: --size-table 2026\)"
    ):
        ModelConfig.from_size("10B", "2025")


def test_list_sizes_shows_the_table_in_use(capsys):
    code, out, _ = run_main(benchmark.main, capsys, "--list-sizes", "--size-table", "2026")
    assert code == 0 and "10B" in out and "3406809600" in out and "12832823808" in out and "2.7B" not in out
    code, out, _ = run_main(benchmark.main, capsys, "--list-sizes", "--size-table", "2025")
    assert code == 0 and "2.7B" in out and "10B" not in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--size-table", "2027"], "invalid choice: '2027'"),
        (["--checkpoint-blocks", "-1"], "expected 0, a number of blocks, sqrt or all"),
        (["--checkpoint-blocks", "half"], "expected 0, a number of blocks, sqrt or all"),
        (["--checkpoint-blocks", "3"], "--checkpoint-blocks 3 is more than the model's 2 layers"),
        (["--checkpoint-blocks", "1", "--model-factory", "tests.test_checkpointing:make_model"], "cannot wrap"),
        (["--size-table", "2025", "--model-size", "10B"], "(10B is in the 2026 table: --size-table 2026)"),
        (["--optimizer", "tests.test_checkpointing:missing"], "has no attribute 'missing'"),
    ],
)
def test_cli_errors(capsys, args, message):
    code, _, err = run_main(benchmark.main, capsys, *TINY_SHAPE, *CPU, *args)
    assert code == 2 and message in err and err.count("\n") == 1


# -- checkpointing ---------------------------------------------------------------------


@pytest.mark.parametrize(("blocks", "group"), [(None, 0), (1, 1), (2, 2), ("sqrt", 3), ("all", 9)])
def test_group_size(blocks, group):
    assert (
        ModelConfig(d_model=8, d_ff=8, num_layers=9, num_heads=2, checkpoint_blocks=blocks).checkpoint_group_size
        == group
    )


@pytest.mark.parametrize("blocks", [1, 2, "sqrt", "all"])
def test_checkpointed_model_computes_the_same_gradients(blocks):
    config = tiny_model_config(num_layers=3)
    grads = []
    for checkpointing in (None, blocks):
        torch.manual_seed(0)
        model = TransformerLM(config.replace(checkpoint_blocks=checkpointing))
        tokens = torch.randint(0, config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(1))
        F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten()).backward()
        grads.append([p.grad for p in model.parameters()])
    for plain, checkpointed in zip(*grads, strict=True):
        torch.testing.assert_close(plain, checkpointed)


def test_checkpointing_saves_only_group_inputs():
    """What autograd keeps after forward: one fp32 residual stream per group (+ the head's)."""
    config = ModelConfig(d_model=32, d_ff=64, num_layers=4, num_heads=2, vocab_size=97, context_length=16)
    batch, seq = 2, 16
    for blocks, groups in ((1, 4), (2, 2), ("all", 1)):
        e = estimate_memory(config.replace(checkpoint_blocks=blocks), batch, seq, "forward-backward", "fp32", "cpu")
        assert e.activations["checkpointed group inputs"] == groups * batch * seq * 32 * 4
    rows = residuals.block_residuals(config, batch, seq, "fp32", torch.device("cpu"), checkpointed=True)
    assert residuals.totals(rows) == {"checkpointed group inputs": batch * seq * 32 * 4}


def test_estimator_peak_falls_with_checkpointing_and_flops_count_the_recompute():
    m = ModelConfig.from_size("xl", "2026", context_length=512)
    peaks = {
        k: estimate_memory(m.replace(checkpoint_blocks=k), 4, 512, "train-step", "bf16").peak_bytes
        for k in (None, 1, "sqrt")
    }
    assert peaks[1] < peaks[None] and peaks["sqrt"] < peaks[None]
    step = flops_per_step(m.replace(checkpoint_blocks="sqrt"), 4, 512, "train-step")
    model_flops = analytic_flops_per_step(m, 4, 512, "train-step")
    assert step.model_flops == model_flops
    # one more forward of every block: 4/3 of the blocks' share, the LM head once
    head = 3 * 2 * m.d_model * m.vocab_size * 4 * 512
    assert step.flops_per_step - model_flops == (model_flops - head) // 3


CHILD = """
import json, sys
from cs336_systems.config import BenchmarkConfig
from cs336_systems.memory import pin_mmap_threshold
from cs336_systems.models import ModelConfig
from cs336_systems.runner import run_benchmark
pin_mmap_threshold()
blocks = json.loads(sys.argv[1])
model = ModelConfig(d_model=256, d_ff=704, num_layers=4, num_heads=4, vocab_size=512, context_length=256,
                    checkpoint_blocks=blocks)
config = BenchmarkConfig(model=model, context_length=256, batch_size=8, pass_type="forward-backward",
                         warmup_steps=1, measure_steps=1, peak_tflops=1.0, profile_step=False)
print(json.dumps(run_benchmark(config).to_row(), default=str))
"""


@pytest.mark.slow
def test_checkpointing_lowers_the_measured_peak_as_predicted():
    rows = {}
    for blocks in (None, 1):
        result = subprocess.run(
            [PYTHON, "-c", CHILD, json.dumps(blocks)], capture_output=True, text=True, env=child_env(), timeout=600
        )
        assert result.returncode == 0, result.stderr
        rows[blocks] = json.loads(result.stdout.strip().splitlines()[-1])
        assert rows[blocks]["status"] == "ok", rows[blocks]["error"]
        assert rows[blocks]["predicted_memory_bytes"] == pytest.approx(rows[blocks]["peak_memory_bytes"], rel=0.10)
    assert rows[1]["peak_memory_bytes"] < 0.6 * rows[None]["peak_memory_bytes"]
    assert rows[1]["checkpoint_blocks"] == 1 and rows[1]["checkpoint_group_size"] == 1


# -- residuals -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attention", "precision"), [("sdpa", "fp32"), ("naive", "fp32"), ("sdpa", "bf16"), ("naive", "bf16")]
)
def test_residual_totals_per_component_match_the_estimator(attention, precision):
    config = ModelConfig(
        d_model=32, d_ff=80, num_layers=2, num_heads=2, vocab_size=97, context_length=12, attention=attention
    )
    rows = residuals.block_residuals(config, 2, 12, precision, torch.device("cpu"))
    assert residuals.totals(rows) == block_saved_bytes(config, 2, 12, precision, "cpu")
    parameters = {r.shape for r in rows if r.kind == "parameter"}
    assert (32,) in parameters and not any(r.counted for r in rows if r.kind == "parameter")  # the norms' weights
    assert ((32, 32) in parameters) == (precision == "fp32")  # under autocast mm saves the weight's cast
    assert {"MmBackward0", "PowBackward0"} <= {r.op for r in rows}
    contributions = residuals.contributions(rows)  # per (submodule, op), largest first, shares adding to 100%
    assert [c["rank"] for c in contributions] == list(range(1, len(contributions) + 1))
    assert sum(c["bytes"] for c in contributions) == sum(residuals.totals(rows).values())
    assert contributions[0]["bytes"] == max(c["bytes"] for c in contributions)
    assert abs(sum(c["share_pct"] for c in contributions) - 100) < 1e-9


def test_residuals_command(capsys, tmp_path):
    output = tmp_path / "saved.csv"
    code, out, _ = run_main(
        residuals.main,
        capsys,
        *TINY_SHAPE,
        *TINY_BATCH,
        "--no-compile",
        "--output",
        str(output),
    )
    assert code == 0
    written = pd.read_csv(output)
    assert written["rank"].tolist()[:2] == [1, 2] and {"module", "op", "share_pct", "torch_version"} <= set(written)
    for part in ("saved by", "MmBackward0", "eager, checkpointed", "estimator", "Whole model (2 blocks"):
        assert part in out
    code, _, err = run_main(residuals.main, capsys, "--model-size", "giant")
    assert code == 2 and err.count("\n") == 1


# -- the user's optimizer, and attention n/a ------------------------------------------

CALLS = []


class CountingSGD(torch.optim.SGD):
    def step(self, closure=None):
        CALLS.append(1)
        return super().step(closure)


def make_optimizer(params, lr, weight_decay, betas, eps):
    CALLS.append((lr, weight_decay, betas, eps))
    return CountingSGD(params, lr=lr, weight_decay=weight_decay)


def make_model(**kwargs):
    return TransformerLM(ModelConfig(**kwargs))


def test_user_optimizer_runs_and_is_recorded():
    CALLS.clear()
    spec = "tests.test_checkpointing:make_optimizer"
    record = run_benchmark(tiny_benchmark_config(pass_type="train-step", optimizer_factory=spec))
    assert record.status == "ok", record.error
    assert CALLS[0] == tuple(OPTIMIZER_KWARGS.values())
    assert len(CALLS) - 1 == 1 + 3 + 1 + 1  # warmup, measured steps, the traced steady-state step, the profiled step
    assert record.optimizer == "tests.test_checkpointing.CountingSGD" and record.optimizer_factory == spec
    default = run_benchmark(tiny_benchmark_config(pass_type="train-step"))
    assert default.optimizer == "torch.optim.adamw.AdamW (fused)" and default.optimizer_factory is None
    assert record.key() != default.key()


def test_optimizer_that_fails_is_an_error_row():
    record = run_benchmark(
        tiny_benchmark_config(pass_type="train-step", optimizer_factory="tests.test_checkpointing:make_model")
    )
    assert record.status == "error" and "--optimizer" in record.error


def test_model_factory_row_records_attention_na():
    config = tiny_benchmark_config(model_factory="tests.test_checkpointing:make_model")
    record = run_benchmark(config)
    assert record.status == "ok", record.error
    assert record.attention == "n/a" and config.identity()["attention"] == "n/a"
    assert run_benchmark(tiny_benchmark_config()).attention == "sdpa"


def test_rows_record_size_table_and_checkpointing():
    m = tiny_model_config(num_layers=2).replace(checkpoint_blocks="all")
    record = run_benchmark(BenchmarkConfig(model=m, context_length=8, batch_size=2, warmup_steps=0, measure_steps=1))
    assert record.status == "ok" and record.size_table == "2026"  # a shape, not a name: the newest table
    assert (record.checkpoint_blocks, record.checkpoint_group_size) == ("all", 2)
    assert record.flops_per_step > analytic_flops_per_step(m, 2, 8, "forward-backward")
    # MFU's numerator is model FLOPs: the recomputed forward is not useful work
    model_flops = analytic_flops_per_step(m, 2, 8, "forward-backward")
    assert math.isclose(record.achieved_tflops, model_flops / (record.median_ms / 1e3) / 1e12)
