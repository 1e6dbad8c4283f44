"""The fast-path flags and the TF32 flags on a real CUDA device. Skipped without CUDA."""

import pytest
import torch

from cs336_systems.precision import precision_mode
from cs336_systems.runner import run_benchmark
from tests.helpers import tiny_benchmark_config

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_fast_path_row_on_a_gpu():
    config = tiny_benchmark_config(
        device="cuda", pass_type="train-step", precision="bf16", grad_accum_steps=2, param_dtype="bf16", peak_tflops=1.0
    )
    record = run_benchmark(config.replace(model=config.model.replace(fused_projections=True)))
    assert record.status == "ok", record.error
    assert record.optimizer.endswith("over fp32 master weights")
    assert record.forward_mean_ms > 0 and record.optimizer_mean_ms > 0 and record.peak_memory_bytes > 0


def test_tf32_on_a_gpu_after_the_new_api_was_used():
    saved = torch.backends.cuda.matmul.fp32_precision
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    try:
        with precision_mode("fp32", torch.device("cuda")) as state:
            assert not state.cuda_matmul_allow_tf32
            a = torch.randn(512, 512, device="cuda")
            exact = (a.double() @ a.double()).float()
            assert torch.allclose(a @ a, exact, rtol=1e-4, atol=1e-3)  # IEEE fp32, not TF32's 10-bit mantissa
    finally:
        torch.set_float32_matmul_precision("highest")
        torch.backends.cuda.matmul.fp32_precision = saved
