"""attention_bench, NVTX and mixed precision on a real CUDA device. Skipped without one (CI)."""

import math

import pytest
import torch

from cs336_systems import nvtx
from cs336_systems.attention_bench import AttentionConfig, run_attention
from cs336_systems.mixed_precision import autocast_dtypes
from cs336_systems.timing import HostTimer, device_synchronizer, time_steps

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
MiB = 2**20


def cuda_config(implementation, **changes):
    base = dict(
        implementation=implementation,
        head_dim=64,
        context_length=1024,
        batch_size=8,
        device="cuda",
        warmup_steps=2,
        measure_steps=5,
    )
    base.update(changes)
    return AttentionConfig(**base)


def test_naive_memory_before_backward_is_what_it_holds():
    """Inputs q, k, v, the output gradient and the output (5 x 2 MiB), the saved softmax
    probabilities (8 x 1024^2 x 4 B = 32 MiB) and the boolean mask (1 MiB)."""
    record = run_attention(cuda_config("naive"))
    assert record.status == "ok", record.error
    assert record.memory_source == "cuda_allocator"
    expected = 5 * 8 * 1024 * 64 * 4 + 8 * 1024 * 1024 * 4 + 1024 * 1024
    assert record.memory_before_backward_bytes == pytest.approx(expected, rel=0.05)
    assert record.saved_for_backward_bytes == 3 * 8 * 1024 * 64 * 4 + 8 * 1024 * 1024 * 4 + 1024 * 1024
    assert record.backward_peak_bytes > record.memory_before_backward_bytes


def test_sdpa_holds_no_score_matrix_on_gpu():
    record = run_attention(cuda_config("sdpa"))
    assert record.status == "ok", record.error
    assert record.sdpa_backend in ("efficient_attention", "flash_attention", "cudnn_attention")
    assert record.memory_before_backward_bytes < 16 * MiB  # inputs, output, log-sum-exp: O(T)


def test_compiled_on_gpu():
    record = run_attention(cuda_config("compiled"))
    assert record.status == "ok", record.error
    assert record.compile_s > 0 and record.forward_mean_ms > 0


def test_real_cuda_oom_is_a_row_and_the_next_configuration_runs():
    # (B, 65536, 65536) fp32 scores are 16 GiB a sequence: B = 8 on an H100 80GB (128 GiB), more on
    # a larger card (an H200 holds 128 GiB), always over what is free
    free = torch.cuda.mem_get_info()[0]
    batch = max(8, math.ceil(1.5 * free / (65536**2 * 4)))
    record = run_attention(
        cuda_config("naive", context_length=65536, head_dim=16, batch_size=batch, warmup_steps=0, measure_steps=1)
    )
    assert record.status == "oom", record.error
    assert record.error.startswith("forward: CUDA out of memory")
    assert torch.cuda.memory_allocated() < 64 * MiB  # released
    assert run_attention(cuda_config("naive")).status == "ok"


def test_nvtx_with_real_cuda_runs_outside_a_profiler():
    assert nvtx.enable() is True
    try:
        device = torch.device("cuda")
        a = torch.randn(512, 512, device=device)
        times = time_steps(
            lambda: a @ a, warmup_steps=1, measure_steps=3, timer=HostTimer(synchronize=device_synchronizer(device))
        )
        assert len(times.measured_ms) == 3
    finally:
        nvtx.disable()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_autocast_dtypes_on_cuda(dtype):
    low = {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
    seen = autocast_dtypes(dtype, "cuda")
    assert seen["fc1 output"] == low and seen["logits (fc2 output)"] == low
    assert seen["LayerNorm output"] == "fp32"  # layer_norm is on CUDA autocast's fp32 list
    assert seen["loss"] == seen["gradients"] == seen["parameters"] == "fp32"


def test_the_students_flash_attention_on_do_bench():
    from tests.helpers import FIXTURES

    config = cuda_config(
        "flash-pytorch",
        context_length=256,
        batch_size=1,
        timer="do-bench",
        precision="bf16",
        adapters=str(FIXTURES / "adapters_student.py"),
    )
    record = run_attention(config)
    assert record.status == "ok", record.error
    assert record.timer_used in ("triton.do_bench", "cuda-event") and record.end_to_end_mean_ms > 0
    assert record.max_abs_err_out < record.check_tolerance
