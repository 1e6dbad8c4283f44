"""The profiled step: interval-union arithmetic on hand-made intervals, the CUDA summary on
fake kernel events, and the CPU columns on a real tiny step."""

import subprocess
from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType

from cs336_systems.factory import build_model
from cs336_systems.optimizer import make_optimizer
from cs336_systems.profiling import kineto_lines_dropped, profile_step, summarize_events, union_length
from cs336_systems.step import make_step
from tests.helpers import PYTHON, REPO, child_env, tiny_benchmark_config
from tests.tiny import TINY_SHAPE


@pytest.mark.parametrize(
    "intervals, covered",
    [
        ([], 0.0),
        ([(0, 10)], 10.0),
        ([(0, 10), (20, 25)], 15.0),  # disjoint: a gap of idle device
        ([(0, 10), (5, 15)], 15.0),  # overlapping (two streams): counted once
        ([(0, 30), (5, 10), (12, 20)], 30.0),  # nested
        ([(10, 20), (0, 10)], 20.0),  # touching, out of order
        ([(40, 50), (0, 5), (3, 8), (45, 60)], 28.0),
    ],
)
def test_union_length(intervals, covered):
    assert union_length(intervals) == pytest.approx(covered)


def event(name, start_us, end_us, device=DeviceType.CUDA, self_us=0.0, annotation=False):
    return SimpleNamespace(
        name=name,
        device_type=device,
        time_range=SimpleNamespace(start=start_us, end=end_us),
        self_cpu_time_total=self_us,
        is_user_annotation=annotation,
    )


def test_cuda_summary_uses_the_union_of_kernel_intervals_over_the_step():
    events = [
        event("cudaLaunchKernel", 0, 1000, device=DeviceType.CPU),  # host side: not a kernel
        event("gemm", 100, 400),
        event("gemm", 300, 600),  # overlaps the first on another stream
        event("softmax", 800, 900),
    ]
    profile = summarize_events(events, "cuda", step_ms=2.0, profiled_step_ms=3.5)
    assert profile.kernels_per_step == 3
    assert profile.device_busy_ms == pytest.approx(0.6)  # 100..600 and 800..900 us
    assert profile.device_busy_pct == pytest.approx(30.0)  # 0.6 ms of a 2 ms step
    assert profile.profiled_step_ms == 3.5
    assert profile.top_kernels == (
        {"name": "gemm", "calls": 2, "total_ms": pytest.approx(0.6)},
        {"name": "softmax", "calls": 1, "total_ms": pytest.approx(0.1)},
    )


def test_cuda_user_annotations_and_bad_timestamps_are_not_kernels():
    # Recent PyTorch reports each record_function range that launched kernels as a CUDA user
    # annotation spanning first to last kernel, gaps included; CUPTI 13.0 can emit zero timestamps.
    events = [
        event("cs336_systems: profiled step", 50, 1050, device=DeviceType.CPU, annotation=True),  # the window
        event("Optimizer.step#AdamW.step", 100, 1000, annotation=True),
        event("Torch-Compiled Region", 100, 1000, annotation=True),
        event("multi_tensor_apply_kernel", 100, 200),
        event("gemm", 900, 1000),
        event("zero_stamp", 0, 0),
        event("negative", 500, 400),
        event("late", 1000, 1400),  # runs past the window: clipped to its end
    ]
    profile = summarize_events(events, "cuda", step_ms=1.0)
    assert profile.kernels_per_step == 3
    assert profile.device_busy_ms == pytest.approx(0.25)  # 100..200 and 900..1050
    assert profile.device_busy_pct == pytest.approx(25.0)
    assert {k["name"] for k in profile.top_kernels} == {"multi_tensor_apply_kernel", "gemm", "late"}


def test_cuda_busy_never_exceeds_100_pct():
    # the profiled step runs slower than the median step it is divided by
    profile = summarize_events([event("gemm", 100, 5100)], "cuda", step_ms=2.0)
    assert profile.device_busy_pct == 100.0


def test_cuda_profile_without_kernel_events_reports_nothing_rather_than_an_idle_gpu():
    profile = summarize_events([event("cudaLaunchKernel", 0, 10, device=DeviceType.CPU)], "cuda", step_ms=2.0)
    assert profile.kernels_per_step is None and profile.device_busy_pct is None and profile.top_kernels == ()


def test_cpu_summary_counts_ops_and_has_no_busy_figure():
    events = [
        event("aten::mm", 0, 10, DeviceType.CPU, 8.0),
        event("aten::add", 10, 12, DeviceType.CPU, 2.0),
        event("my_region", 0, 12, DeviceType.CPU, 2.0, annotation=True),
    ]
    profile = summarize_events(events, "cpu", step_ms=1.0, top=1)
    assert profile.kernels_per_step == 2 and profile.device_busy_pct is None and profile.device_busy_ms is None
    assert profile.top_kernels == ({"name": "aten::mm", "calls": 1, "total_ms": pytest.approx(0.008)},)


@pytest.mark.parametrize("pass_type", ["forward", "train-step"])
def test_profiled_real_cpu_step(pass_type):
    config = tiny_benchmark_config(pass_type=pass_type)
    device = torch.device("cpu")
    model = build_model(config.model, device)
    optimizer = make_optimizer(model, device) if pass_type == "train-step" else None
    step = make_step(config, model, device, optimizer)
    step()
    syncs = []
    profile = profile_step(step, device, lambda: syncs.append(1), step_ms=5.0)
    assert profile.device_busy_pct is None and profile.profiled_step_ms > 0
    # a forward of 2 blocks dispatches dozens of ops; a train step several times more
    assert profile.kernels_per_step > (200 if pass_type == "train-step" else 30)
    names = [kernel["name"] for kernel in profile.top_kernels]
    assert 0 < len(names) <= 10 and any(name.startswith("aten::") for name in names)
    assert [k["total_ms"] for k in profile.top_kernels] == sorted(
        (k["total_ms"] for k in profile.top_kernels), reverse=True
    )
    assert len(syncs) == 2


def test_the_benchmark_prints_no_kineto_lines():
    # Kineto writes `USDT: ... profiler_start` to fd 2 at every profiler start and stop.
    command = [
        PYTHON,
        "-m",
        "cs336_systems.benchmark",
        *TINY_SHAPE,
        "--context-length",
        "8",
        "--batch-size",
        "1",
        "--warmup-steps",
        "0",
        "--measure-steps",
        "1",
        "--pass-type",
        "train-step",
    ]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=child_env(), timeout=300)
    assert done.returncode == 0, done.stderr
    assert "USDT" not in done.stderr and "profiler_start" not in done.stderr


def test_other_stderr_lines_pass_through_while_kineto_lines_are_dropped(capfd):
    import os

    with kineto_lines_dropped():
        os.write(2, b"USDT:2026 x.cpp:52] profiler_start\nkeep me\n")
    assert capfd.readouterr().err == "keep me\n"
