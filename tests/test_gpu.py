"""Checks that need a real CUDA device. They skip on machines without one (CI)."""

import pickle

import pytest
import torch

from cs336_systems.config import BenchmarkConfig
from cs336_systems.models import ModelConfig
from cs336_systems.runner import run_benchmark
from cs336_systems.timing import CudaEventTimer, HostTimer, device_synchronizer, time_steps
from tests.helpers import tiny_benchmark_config

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def cuda_config(**changes):
    return tiny_benchmark_config(device="cuda", peak_tflops=1.0, **changes)


def test_synchronised_host_clock_agrees_with_cuda_events():
    device = torch.device("cuda")
    a = torch.randn(4096, 4096, device=device)
    step = lambda: a @ a  # noqa: E731
    time_steps(step, warmup_steps=3, measure_steps=1, timer=HostTimer(synchronize=device_synchronizer(device)))
    host = time_steps(step, warmup_steps=0, measure_steps=20, timer=HostTimer(synchronize=device_synchronizer(device)))
    events = time_steps(step, warmup_steps=0, measure_steps=20, timer=CudaEventTimer())
    host_median, event_median = sorted(host.measured_ms)[10], sorted(events.measured_ms)[10]
    assert host_median == pytest.approx(event_median, rel=0.15)
    unsynced = time_steps(step, warmup_steps=0, measure_steps=5, timer=HostTimer())
    torch.cuda.synchronize()
    assert sorted(unsynced.measured_ms)[2] < 0.5 * event_median  # without synchronising, only launches are timed


@pytest.mark.parametrize(("precision", "tf32"), [("fp32", False), ("tf32", True), ("bf16", False)])
def test_numeric_mode_in_effect_on_gpu(precision, tf32):
    record = run_benchmark(cuda_config(precision=precision, pass_type="forward"))
    assert record.status == "ok", record.error
    assert record.cuda_matmul_allow_tf32 is tf32 and record.cudnn_allow_tf32 is tf32
    assert record.matmul_precision == ("high" if tf32 else "highest")


def test_cuda_event_timer_in_a_benchmark():
    record = run_benchmark(cuda_config(timer="cuda-event"))
    assert record.status == "ok" and record.timer == "cuda-event" and record.min_ms > 0


def test_memory_comes_from_the_allocator_per_phase():
    record = run_benchmark(cuda_config(pass_type="train-step"))
    assert record.memory_source == "cuda_allocator"
    assert record.peak_reserved_bytes >= record.peak_memory_bytes > 0
    assert record.optimizer_peak_bytes > 0 and record.first_optimizer_peak_bytes > 0


def test_real_cuda_oom_is_a_row_and_the_process_goes_on():
    free, _ = torch.cuda.mem_get_info()
    # naive attention scores: batch x heads x T^2 x 4 bytes, made larger than the free memory
    batch = int(free / (2 * 4096 * 4096 * 4)) + 8
    model = ModelConfig(
        d_model=32, d_ff=64, num_layers=1, num_heads=2, vocab_size=97, context_length=4096, attention="naive"
    )
    huge = BenchmarkConfig(
        model=model,
        context_length=4096,
        batch_size=batch,
        pass_type="forward",
        device="cuda",
        warmup_steps=0,
        measure_steps=1,
        peak_tflops=1.0,
    )
    record = run_benchmark(huge)
    assert record.status == "oom" and "out of memory" in record.error.lower()
    assert torch.cuda.memory_allocated() < 1 * 2**30  # released
    assert run_benchmark(cuda_config()).status == "ok"


def test_memory_snapshot_is_written(tmp_path):
    path = tmp_path / "snapshot.pickle"
    record = run_benchmark(cuda_config(), memory_snapshot=str(path))
    assert record.status == "ok"
    with path.open("rb") as handle:
        snapshot = pickle.load(handle)
    assert snapshot["segments"] and "device_traces" in snapshot


def test_compile_on_gpu():
    record = run_benchmark(cuda_config(compile=True, pass_type="forward-backward"))
    assert record.status == "ok", record.error
    assert record.compile_s > 0
