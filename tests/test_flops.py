import pytest
import torch

from cs336_systems import flops
from cs336_systems.config import PASS_TYPES
from cs336_systems.flops import (
    Peak,
    analytic_flops_per_step,
    counted_flops_per_step,
    flops_per_step,
    forward_flops_per_token,
    mfu,
    resolve_peak,
    table_peak_tflops,
)
from cs336_systems.models import ModelConfig, build_model
from cs336_systems.runner import run_benchmark
from tests.conftest import tiny_benchmark_config, tiny_model_config


def test_forward_flops_by_hand():
    config = ModelConfig(d_model=4, d_ff=6, num_layers=2, num_heads=2, vocab_size=10)
    # dense: 2*(2*(4*16 + 3*4*6) + 4*10) = 2*(2*136 + 40) = 624; attention: 2*2*2*T*4 = 32*T
    assert forward_flops_per_token(config, seq_len=5) == 624 + 160
    assert forward_flops_per_token(config, seq_len=5, causal_discount=True) == 624 + 80
    assert analytic_flops_per_step(config, 3, 5, "forward") == 784 * 15
    assert analytic_flops_per_step(config, 3, 5, "train-step") == 3 * 784 * 15


@pytest.mark.parametrize("attention", ["naive", "sdpa"])
@pytest.mark.parametrize("pass_type", PASS_TYPES)
@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_analytic_matches_flop_counter(attention, pass_type, device):
    config = tiny_model_config(attention=attention, d_model=64, num_heads=4)
    counted = counted_flops_per_step(lambda: build_model(config, device), config.vocab_size, 2, 16, pass_type, device)
    analytic = analytic_flops_per_step(config, 2, 16, pass_type)
    assert counted == pytest.approx(analytic, rel=0.02)
    if device == "meta":  # SDPA decomposes into plain matmuls there: the counts agree exactly
        assert counted == analytic


def test_user_model_flops_are_counted(fixtures_on_path):
    config = tiny_model_config()
    step = flops_per_step(config, 2, 16, "forward-backward", "user_models:make_model", "cpu")
    # only the head is a matmul: 2 * d * V per token (+ bias add, not counted), x3 for backward
    assert step.source == "counted" and step.flops_per_step == 3 * 2 * 32 * 97 * 32


@pytest.mark.parametrize(
    ("name", "precision", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "fp32", 66.9),
        ("NVIDIA H100 80GB HBM3", "tf32", 494.7),
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
        ("NVIDIA H100 80GB HBM3", "fp16", 989.4),
        ("NVIDIA H100 PCIe", "tf32", 378.0),
        ("NVIDIA H200", "bf16", 989.4),
        ("NVIDIA A100-SXM4-80GB", "tf32", 156.0),
        ("NVIDIA A100 80GB PCIe", "fp32", 19.5),
        ("NVIDIA A10G", "bf16", 125.0),
        ("NVIDIA L4", "tf32", 60.0),
        ("NVIDIA GeForce RTX 4090", "bf16", 165.0),
        ("NVIDIA GeForce RTX 4090 Laptop GPU", "bf16", None),
        ("NVIDIA L40S", "bf16", None),
        ("NVIDIA H100 NVL", "bf16", None),
        ("Tesla T4", "fp16", None),
    ],
)
def test_peak_table_by_device_and_precision(name, precision, expected):
    assert table_peak_tflops(name, precision) == expected


def test_peak_resolution_order(monkeypatch):
    monkeypatch.setattr(flops, "measure_peak_tflops", lambda device, precision: 1.5)
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert resolve_peak(gpu, "NVIDIA H100 80GB HBM3", "tf32") == Peak(494.7, "table")
    assert resolve_peak(gpu, "NVIDIA H100 80GB HBM3", "tf32", peak="measure") == Peak(1.5, "measured")
    assert resolve_peak(gpu, "NVIDIA H100 80GB HBM3", "bf16", peak_tflops=700.0) == Peak(700.0, "user")
    assert resolve_peak(gpu, "Some Future GPU", "bf16") == Peak(1.5, "measured")
    assert resolve_peak(gpu, "Some Future GPU", "bf16", peak="table") == Peak(None, "unknown")
    assert resolve_peak(cpu, "AMD EPYC", "fp32") == Peak(1.5, "measured")


def test_mfu_arithmetic():
    achieved, util = mfu(3 * 10**12, 0.5, Peak(12.0, "table"))  # 3 TFLOP in 0.5 s = 6 TFLOP/s
    assert achieved == pytest.approx(6.0) and util == pytest.approx(0.5)
    assert mfu(3 * 10**12, 0.5, Peak(None, "unknown")) == (pytest.approx(6.0), None)
    assert mfu(None, 0.5, Peak(12.0, "table")) == (None, None)


def test_measured_probe_is_positive_and_cached():
    first = flops.measure_peak_tflops(torch.device("cpu"), "fp32")
    assert first > 0 and flops.measure_peak_tflops(torch.device("cpu"), "fp32") == first


def test_every_ok_row_has_mfu_and_its_peak_source():
    record = run_benchmark(tiny_benchmark_config(peak_tflops=0.5))
    config = tiny_benchmark_config()
    expected_flops = analytic_flops_per_step(config.model, 2, 16, "forward-backward")
    assert (record.flops_per_step, record.flops_source) == (expected_flops, "analytic")
    assert record.achieved_tflops == pytest.approx(expected_flops / (record.median_ms / 1e3) / 1e12)
    assert record.mfu == pytest.approx(record.achieved_tflops / 0.5)
    assert record.tokens_per_s == pytest.approx(config.tokens_per_step / (record.median_ms / 1e3))
    assert (record.peak_tflops, record.peak_source) == (0.5, "user")
    measured = run_benchmark(tiny_benchmark_config())
    assert measured.peak_source == "measured" and measured.mfu > 0
