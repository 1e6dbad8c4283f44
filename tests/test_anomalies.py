import pytest

from cs336_systems.anomalies import flag_anomalies, flag_noisy_gpu_steps
from cs336_systems.flops import analytic_flops_per_step
from cs336_systems.memory import estimate_memory
from cs336_systems.models import ModelConfig
from cs336_systems.results import BenchmarkRecord

LAPTOP = "NVIDIA GeForce RTX 4090 Laptop GPU"


def laptop_row(size: str, mean_ms: float, **changes) -> dict:
    """docs/reference.md section 3: fp32, context 512, batch 4, forward-backward, the handout's attention."""
    model = ModelConfig.from_size(size, "2025", context_length=512, attention="naive")
    flops = analytic_flops_per_step(model, 4, 512, "forward-backward")
    row = dict(
        model_size=size,
        num_layers=model.num_layers,
        context_length=512,
        batch_size=4,
        pass_type="forward-backward",
        precision="fp32",
        device_name=LAPTOP,
        status="ok",
        mean_ms=mean_ms,
        flops_per_step=flops,
        achieved_tflops=flops / (mean_ms / 1e3) / 1e12,
        device_memory_bytes=16 * 2**30,
        predicted_memory_bytes=estimate_memory(model, 4, 512, "forward-backward", "fp32", "cuda").peak_bytes,
    )
    row.update(changes)
    return row


def test_laptop_large_is_flagged_as_memory_oversubscription():
    rows = [laptop_row("small", 308.0), laptop_row("medium", 928.0), laptop_row("large", 17_800.0)]
    flags = flag_anomalies(rows)
    assert set(flags) == {2}
    assert "memory oversubscription" in flags[2] and "> 16.0 GiB" in flags[2]
    assert "SLOW: " in BenchmarkRecord.markdown(rows) and "memory oversubscription" in BenchmarkRecord.markdown(rows)


def test_small_work_is_flagged_as_launch_bound():
    big = laptop_row("medium", 928.0, predicted_memory_bytes=1)
    tiny_flops = big["flops_per_step"] / 1000
    tiny = dict(
        big,
        model_size="tiny",
        num_layers=2,
        flops_per_step=tiny_flops,
        mean_ms=50.0,
        achieved_tflops=tiny_flops / 0.05 / 1e12,
    )
    flags = flag_anomalies([big, tiny])
    assert list(flags) == [1] and "launch-bound" in flags[1]


def test_slow_but_unexplained_and_groups_kept_apart():
    fast = laptop_row("medium", 928.0, predicted_memory_bytes=1)
    slow = laptop_row("medium", 4000.0, predicted_memory_bytes=1)
    assert "unexplained" in flag_anomalies([fast, slow])[1]
    other_precision = dict(slow, precision="bf16")
    other_device = dict(slow, device_name="NVIDIA H100 80GB HBM3")
    assert flag_anomalies([fast, other_precision, other_device]) == {}


@pytest.mark.parametrize("status", ["oom", "error"])
def test_failed_rows_are_not_compared(status):
    rows = [laptop_row("medium", 928.0), laptop_row("large", 17_800.0, status=status, achieved_tflops=None)]
    assert flag_anomalies(rows) == {}


def test_measured_busy_figure_replaces_the_launch_bound_heuristic():
    big = laptop_row("medium", 928.0, predicted_memory_bytes=1)
    tiny_flops = big["flops_per_step"] / 1000
    tiny = dict(
        big,
        model_size="tiny",
        num_layers=2,
        flops_per_step=tiny_flops,
        mean_ms=50.0,
        achieved_tflops=tiny_flops / 0.05 / 1e12,
        device_busy_pct=38.0,
        kernels_per_step=4800,
    )
    flags = flag_anomalies([big, tiny])
    assert list(flags) == [1]
    assert "host-bound: GPU idle 62% of the step, 4,800 kernels" in flags[1]
    assert "launch-bound" not in flags[1]


def test_measured_busy_device_says_device_bound_even_where_the_heuristic_guessed_launches():
    big = laptop_row("medium", 928.0, predicted_memory_bytes=1)
    tiny_flops = big["flops_per_step"] / 1000
    tiny = dict(
        big,
        model_size="tiny",
        num_layers=2,
        flops_per_step=tiny_flops,
        mean_ms=50.0,
        achieved_tflops=tiny_flops / 0.05 / 1e12,
        device_busy_pct=97.0,
        kernels_per_step=120,
    )
    assert "device-bound: GPU busy 97% of the step, 120 kernels" in flag_anomalies([big, tiny])[1]
    unmeasured = dict(tiny, device_busy_pct=float("nan"), kernels_per_step=None)  # CSV round-trip of a CPU row
    assert "launch-bound" in flag_anomalies([big, unmeasured])[1]


def test_oversubscription_still_comes_before_the_measured_figure():
    rows = [laptop_row("medium", 928.0), laptop_row("large", 17_800.0, device_busy_pct=30.0, kernels_per_step=900)]
    assert "memory oversubscription" in flag_anomalies(rows)[1]


def test_a_noisy_replayed_gpu_step_is_marked_with_what_the_profiled_step_measured():
    base = dict(status="ok", device="cuda", compile=True, measure_steps=10, kernels_per_step=900)
    host_bound = dict(base, cv_pct=6.1, device_busy_pct=61.0)
    steady = dict(base, cv_pct=0.5, device_busy_pct=97.0)
    unprofiled = dict(base, cuda_graphs=True, compile=False, cv_pct=3.0)
    short = dict(base, cv_pct=9.0, measure_steps=5)  # too few steps to judge a CV
    on_cpu = dict(base, cv_pct=9.0, device="cpu")
    eager = dict(base, compile=False, cv_pct=9.0)
    flags = flag_noisy_gpu_steps([host_bound, steady, unprofiled, short, on_cpu, eager])
    assert sorted(flags) == [0, 2]
    assert flags[0] == (
        "CV 6.1% over 10 steps, above 2% for a replayed step: host-bound: GPU idle 39% of the step, 900 kernels "
        "(measured in a profiled step)"
    )
    assert "no profiled step" in flags[2]
