"""The fast path: gradient accumulation, bf16 parameters with fp32 master weights, fused
projections; what they compute, what the row records, and how they are named."""

import contextlib

import pytest
import torch

from cs336_systems import benchmark, runner, step
from cs336_systems.anomalies import flag_anomalies
from cs336_systems.benchmark import build_parser, config_from_args
from cs336_systems.config import IDENTITY_FIELDS, BenchmarkConfig
from cs336_systems.factory import build_model
from cs336_systems.flops import analytic_flops_per_step
from cs336_systems.identity import row_key
from cs336_systems.memory import estimate_memory
from cs336_systems.models import ConfigError, ModelConfig
from cs336_systems.optimizer import MasterWeights, make_optimizer
from cs336_systems.precision import parameters_in
from cs336_systems.results import BenchmarkRecord
from cs336_systems.results.markdown import row_label
from tests.helpers import run_main, tiny_benchmark_config, tiny_model_config
from tests.tiny import CPU as CPU_FLAGS
from tests.tiny import TINY_BATCH, TINY_SHAPE

CPU = torch.device("cpu")


def copy_into_fused(fused: torch.nn.Module, plain: torch.nn.Module) -> None:
    """The unfused model's weights, stacked into the fused model's projections."""
    state = dict(plain.state_dict())
    for index in range(len(plain.layers)):
        attn, ffn = f"layers.{index}.attn.", f"layers.{index}.ffn."
        q, k, v = (state.pop(f"{attn}{name}_proj.weight") for name in "qkv")
        state[f"{attn}qkv_proj.weight"] = torch.cat((q, k, v))
        w1, w3 = state.pop(f"{ffn}w1.weight"), state.pop(f"{ffn}w3.weight")
        state[f"{ffn}w13.weight"] = torch.cat((w1, w3))
    fused.load_state_dict(state)


@pytest.mark.parametrize("attention", ["sdpa", "naive"])
def test_fused_projections_compute_the_same_function(attention):
    torch.manual_seed(0)
    plain = build_model(tiny_model_config(attention=attention), CPU)
    fused = build_model(tiny_model_config(attention=attention, fused_projections=True), CPU)
    assert sum(p.numel() for p in fused.parameters()) == sum(p.numel() for p in plain.parameters())
    copy_into_fused(fused, plain)
    tokens = torch.randint(0, 97, (2, 16))
    plain_out, fused_out = plain(tokens), fused(tokens)
    torch.testing.assert_close(fused_out, plain_out, rtol=1e-5, atol=1e-5)
    plain_out.square().mean().backward()
    fused_out.square().mean().backward()
    grads = {name: p.grad for name, p in plain.named_parameters()}
    for index in range(2):
        attn, ffn = f"layers.{index}.attn.", f"layers.{index}.ffn."
        qkv = torch.cat([grads[f"{attn}{name}_proj.weight"] for name in "qkv"])
        torch.testing.assert_close(fused.layers[index].attn.qkv_proj.weight.grad, qkv, rtol=1e-4, atol=1e-6)
        w13 = torch.cat((grads[f"{ffn}w1.weight"], grads[f"{ffn}w3.weight"]))
        torch.testing.assert_close(fused.layers[index].ffn.w13.weight.grad, w13, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(fused.token_embeddings.weight.grad, grads["token_embeddings.weight"])


def test_fused_projections_are_initialised_as_the_separate_ones():
    torch.manual_seed(0)
    fused = build_model(ModelConfig(d_model=256, d_ff=512, num_layers=1, num_heads=4, fused_projections=True), CPU)
    plain = build_model(ModelConfig(d_model=256, d_ff=512, num_layers=1, num_heads=4), CPU)
    ratio = (fused.layers[0].attn.qkv_proj.weight.std() / plain.layers[0].attn.q_proj.weight.std()).item()
    assert ratio == pytest.approx(1.0, rel=0.05)
    ratio = (fused.layers[0].ffn.w13.weight.std() / plain.layers[0].ffn.w1.weight.std()).item()
    assert ratio == pytest.approx(1.0, rel=0.05)


def test_eager_default_is_the_handout_model():
    model = build_model(tiny_model_config(), CPU)
    assert hasattr(model.layers[0].attn, "q_proj") and hasattr(model.layers[0].ffn, "w3")


def test_k_micro_batches_give_the_gradient_of_the_whole_batch():
    """K micro-batches of B draw the same tokens as one batch of K * B: the mean loss's gradients agree."""
    accumulated = tiny_benchmark_config(batch_size=1, grad_accum_steps=2, pass_type="forward-backward")
    whole = tiny_benchmark_config(batch_size=2, pass_type="forward-backward")
    grads = []
    for config in (accumulated, whole):
        torch.manual_seed(0)
        model = build_model(config.model, CPU)
        step.make_step(config, model, CPU)()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_a_step_enters_each_phase_k_times_and_steps_the_optimizer_once():
    config = tiny_benchmark_config(grad_accum_steps=3, pass_type="train-step")
    model = build_model(config.model, CPU)
    optimizer = make_optimizer(model, CPU)
    entered = []

    @contextlib.contextmanager
    def phase(name):
        entered.append(name)
        yield

    step.make_step(config, model, CPU, optimizer, phase=phase)()
    assert entered == ["forward", "backward"] * 3 + ["optimizer"]


def test_the_row_counts_all_k_micro_batches():
    config = tiny_benchmark_config(grad_accum_steps=3, pass_type="train-step", peak_tflops=1.0)
    record = runner.run_benchmark(config)
    assert record.status == "ok", record.error
    assert record.grad_accum_steps == 3 and config.tokens_per_step == 3 * 2 * 16
    assert record.flops_per_step == analytic_flops_per_step(config.model, 3 * 2, 16, "train-step")
    assert record.tokens_per_s == pytest.approx(config.tokens_per_step / (record.median_ms / 1e3))
    # phases add up over the micro-batches: their sum stays within the step
    assert record.forward_mean_ms + record.backward_mean_ms + record.optimizer_mean_ms <= record.mean_ms * 1.05
    assert record.first_optimizer_peak_bytes is not None  # the first step is one step, not K


def test_bf16_parameters_are_stepped_through_fp32_master_weights():
    config = tiny_benchmark_config(param_dtype="bf16", precision="bf16", pass_type="train-step")
    model = build_model(config.model, CPU)
    before = [p.detach().clone() for p in model.parameters()]
    with parameters_in(model, torch.bfloat16):
        assert all(p.dtype == torch.bfloat16 for p in model.parameters())
        assert model.layers[0].attn.rope.cos.dtype == torch.float32  # buffers stay fp32
        optimizer = make_optimizer(model, CPU, master_weights=True)
        assert isinstance(optimizer, MasterWeights)
        step.make_step(config, model, CPU, optimizer)()
        assert all(p.grad is None or p.grad.dtype == torch.bfloat16 for p in model.parameters())
        assert all(m.dtype == torch.float32 for m in optimizer.masters)
        assert all(s["exp_avg"].dtype == torch.float32 for s in optimizer.state.values())
        # an lr-1e-4 update is below bf16's resolution for most weights: the fp32 masters hold it
        moved = sum(int((m - b).abs().max() > 0) for m, b in zip(optimizer.masters, before, strict=True))
        assert moved == len(before)
        torch.testing.assert_close(optimizer.masters[0].to(torch.bfloat16), next(model.parameters()))
    assert all(p.dtype == torch.float32 for p in model.parameters())  # as it came


def test_bf16_parameter_row_records_what_ran():
    record = runner.run_benchmark(tiny_benchmark_config(param_dtype="bf16", precision="bf16", pass_type="train-step"))
    assert record.status == "ok", record.error
    assert record.param_dtype == "bf16" and record.optimizer.endswith("over fp32 master weights")
    with pytest.raises(ConfigError, match="--param-dtype bf16 runs under --precision bf16"):  # refused as made
        tiny_benchmark_config(param_dtype="bf16", precision="fp32")


def test_fast_path_flags_are_part_of_the_identity_and_round_trip():
    config = tiny_benchmark_config(pass_type="train-step", precision="bf16", grad_accum_steps=4, param_dtype="bf16")
    config = config.replace(model=config.model.replace(fused_projections=True))
    assert BenchmarkConfig.from_dict(config.to_dict()) == config  # what a sweep's child gets
    flags = [
        "--pass-type",
        "train-step",
        "--precision",
        "bf16",
        "--grad-accum-steps",
        "4",
        "--param-dtype",
        "bf16",
        "--fused-projections",
        *TINY_SHAPE,
        *TINY_BATCH,
        *CPU_FLAGS,
    ]
    parsed = config_from_args(build_parser().parse_args(flags))
    assert (parsed.grad_accum_steps, parsed.param_dtype, parsed.model.fused_projections) == (4, "bf16", True)
    plain = tiny_benchmark_config(pass_type="train-step", precision="bf16")
    keys = {
        plain.key(),
        config.key(),
        config.replace(grad_accum_steps=2).key(),
        config.replace(param_dtype="fp32").key(),
    }
    assert len(keys) == 4
    # off is None: a row written before these columns existed keeps its key
    row = BenchmarkRecord.for_config(plain, CPU, None, 1).to_row()
    old = {
        name: value
        for name, value in row.items()
        if name not in ("grad_accum_steps", "param_dtype", "fused_projections")
    }
    assert row_key(old, IDENTITY_FIELDS) == plain.key()
    assert config.fast_path() == "--grad-accum-steps 4 --param-dtype bf16 --fused-projections"


def test_fused_projections_refuse_a_model_factory_in_one_line(capsys):
    code, _, err = run_main(
        benchmark.main,
        capsys,
        *TINY_SHAPE,
        "--context-length",
        "8",
        "--fused-projections",
        "--model-factory",
        "torch.nn:Linear",
    )
    assert code == 2 and err.count("\n") == 1 and "--fused-projections" in err


def test_anomaly_text_and_labels_name_the_fast_path():
    base = dict(
        status="ok",
        device_name="H100",
        precision="bf16",
        pass_type="train-step",
        model_size="xl",
        context_length=512,
        batch_size=4,
        num_layers=32,
        flops_per_step=1e12,
    )
    rows = [
        {**base, "achieved_tflops": 600.0, "grad_accum_steps": 4, "param_dtype": "bf16", "fused_projections": True},
        {**base, "achieved_tflops": 100.0, "grad_accum_steps": None, "param_dtype": float("nan")},
    ]
    flags = flag_anomalies(rows)
    assert "fast path: the best row --grad-accum-steps 4 --param-dtype bf16 --fused-projections" in flags[1]
    assert row_label(rows[0]).endswith("--grad-accum-steps 4 --param-dtype bf16 --fused-projections")
    assert "--" not in row_label(rows[1])


@pytest.mark.parametrize("pass_type", ["forward-backward", "train-step"])
def test_estimator_learns_the_fast_path(pass_type):
    m = ModelConfig.from_size("small", context_length=256)
    plain = estimate_memory(m, 4, 256, pass_type, "bf16", "cuda")
    accumulated = estimate_memory(m, 4, 256, pass_type, "bf16", "cuda", grad_accum_steps=4)
    assert accumulated.peak_bytes >= plain.peak_bytes  # the gradients are held through later micro-batches
    assert accumulated.peak_bytes < estimate_memory(m, 16, 256, pass_type, "bf16", "cuda").peak_bytes
    bf16 = estimate_memory(m, 4, 256, pass_type, "bf16", "cuda", param_dtype="bf16")
    assert bf16.parameters == plain.parameters // 2 and bf16.gradients == plain.gradients // 2
    assert bf16.autocast_weight_copies == 0
    if pass_type == "train-step":
        assert bf16.optimizer_state == plain.optimizer_state * 3 // 2  # moments + fp32 master weights


def test_the_memory_cli_takes_the_fast_path_flags(capsys):
    import json

    from cs336_systems.memory.cli import main

    args = ["--model-size", "small", "--pass-type", "train-step", "--precision", "bf16", "--json"]
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*args, "--param-dtype", "bf16", "--grad-accum-steps", "2"]) == 0
    fast = json.loads(capsys.readouterr().out)
    assert fast["parameters"] * 2 == plain["parameters"] and "--grad-accum-steps 2" in fast["config"]


def test_the_report_keeps_fast_path_rows_apart():
    import pandas as pd

    from cs336_systems.report.benchmark import context_table

    row = BenchmarkRecord.for_config(tiny_benchmark_config(pass_type="train-step"), CPU, None, 1).to_row()
    row.update(status="ok", median_ms=10.0, iqr_ms=0.1, iqr_pct=1.0, device_name="cpu", source="x.csv")
    fast = {**row, "grad_accum_steps": 4, "median_ms": 30.0}
    table = context_table(pd.DataFrame([row, fast]), "step")
    assert "gradient accumulation" in table.frame.columns or "grad accum steps" in table.frame.columns
    assert sorted(table.frame["ctx 16"]) == ["10.0 (0.100)", "30.0 (0.100)"]  # median (IQR): a row each, never one cell
