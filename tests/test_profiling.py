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
        ([(0.0, 10.0), (5.0, 15.0), (20.0, 25.0), (21.0, 22.0)], 20.0),  # a student's overlapping all-reduces
    ],
)
def test_union_length(intervals, covered):
    assert union_length(intervals) == pytest.approx(covered)


def event(name, start_us, end_us, device=DeviceType.CUDA, self_us=0.0, annotation=False, parent=None):
    return SimpleNamespace(
        name=name,
        device_type=device,
        time_range=SimpleNamespace(start=start_us, end=end_us),
        self_cpu_time_total=self_us,
        is_user_annotation=annotation,
        cpu_parent=parent,
    )


def entry(kernel):
    """A ranked operator as the tests of one step compare it."""
    return {key: kernel[key] for key in ("name", "calls", "total_ms")}


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
    assert [entry(k) for k in profile.top_kernels] == [
        {"name": "gemm", "calls": 2, "total_ms": pytest.approx(0.6)},
        {"name": "softmax", "calls": 1, "total_ms": pytest.approx(0.1)},
    ]


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
    assert [entry(k) for k in profile.top_kernels] == [
        {"name": "aten::mm", "calls": 1, "total_ms": pytest.approx(0.008)}
    ]
    assert profile.top_kernels[0]["share_pct"] == pytest.approx(80.0)  # of every operator's time, not the listed ones


WINDOW = "cs336_systems: profiled step"


def three_steps(*per_step):
    """Events of three profiled steps, each a WINDOW range holding (name, self us) operators."""
    events = []
    for index, ops in enumerate(per_step):
        start = 1000.0 * index
        events.append(event(WINDOW, start, start + 900, DeviceType.CPU, annotation=True))
        events += [event(name, start + 1, start + 2, DeviceType.CPU, us) for name, us in ops]
    return events


def test_operators_rank_by_their_median_over_the_steps_and_a_preempted_step_ranks_nothing():
    # the second step was preempted inside an unsqueeze's backward: one step's 5 ms, not the operator's
    events = three_steps(
        [("aten::bmm", 300.0), ("aten::exp", 200.0), ("UnsqueezeBackward0", 10.0)],
        [("aten::bmm", 310.0), ("aten::exp", 190.0), ("UnsqueezeBackward0", 5000.0)],
        [("aten::bmm", 290.0), ("aten::exp", 320.0), ("UnsqueezeBackward0", 12.0)],
    )
    profile = summarize_events(events, "cpu", step_ms=1.0)
    ranked = profile.top_kernels
    assert [k["name"] for k in ranked] == ["aten::bmm", "aten::exp", "UnsqueezeBackward0"]
    assert [k["total_ms"] for k in ranked] == pytest.approx([0.300, 0.200, 0.012])  # medians of three
    assert ranked[0]["step_ms"] == pytest.approx([0.300, 0.310, 0.290])
    # exp took longer than bmm in the third step: which of the two is longest is not resolved
    assert [k["ahead_of_next"] for k in ranked] == [False, False, True]
    assert profile.kernels_per_step == 3


def test_the_matmul_family_is_counted_together_and_softmax_is_found_fused_or_as_the_students_own_ops():
    # the ranges function_ranges puts around a call of the student's attention and softmax
    attention = event("function scaled_dot_product_attention", 0, 100, DeviceType.CPU, annotation=True)
    own_softmax = event("function softmax", 0, 50, DeviceType.CPU, annotation=True, parent=attention)
    ops = [
        event("aten::einsum", 0, 1, DeviceType.CPU, 5.0, parent=attention),
        event("aten::bmm", 0, 1, DeviceType.CPU, 40.0, parent=attention),  # einsum's lowering
        event("aten::addmm", 0, 1, DeviceType.CPU, 30.0),  # a projection: matmul, not attention's
        event("aten::mm", 0, 1, DeviceType.CPU, 20.0),
        event("MmBackward0", 0, 1, DeviceType.CPU, 1.0),
        event("aten::exp", 0, 1, DeviceType.CPU, 15.0, parent=own_softmax),
        event("aten::amax", 0, 1, DeviceType.CPU, 4.0, parent=own_softmax),
        event("aten::div", 0, 1, DeviceType.CPU, 3.0, parent=own_softmax),
        event("aten::_softmax", 0, 1, DeviceType.CPU, 2.0),  # torch's fused one, elsewhere
        event("aten::_log_softmax", 0, 1, DeviceType.CPU, 9.0),  # cross-entropy's: not a softmax
        event("aten::mul", 0, 1, DeviceType.CPU, 11.0),
        own_softmax,  # a function's range is not an operator
    ]
    profile = summarize_events(ops, "cpu", step_ms=1.0)
    families = {f["family"]: f for f in profile.families}
    assert families["matmul"]["total_ms"] == pytest.approx(0.096)  # einsum, bmm, addmm, mm, MmBackward0
    assert families["attention_matmul"]["total_ms"] == pytest.approx(0.045)
    assert families["softmax"]["total_ms"] == pytest.approx(0.024)
    assert families["softmax"]["operators"] == ["aten::_softmax", "aten::amax", "aten::div", "aten::exp"]
    assert families["matmul"]["share_pct"] == pytest.approx(100 * 96 / 140)
    assert profile.kernels_per_step == 11


def own_softmax(x, dim):
    shifted = x - x.amax(dim=dim, keepdim=True)
    exp = torch.exp(shifted)
    return exp / exp.sum(dim=dim, keepdim=True)


def scaled_dot_product_attention(q, k, v):
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / q.shape[-1] ** 0.5
    return torch.einsum("bhqk,bhkd->bhqd", own_softmax(scores, -1), v)


def test_a_real_profile_finds_a_students_own_softmax_and_einsums_lowering_over_several_steps():
    q, k, v = (torch.randn(2, 2, 64, 16) for _ in range(3))
    syncs = []
    profile = profile_step(lambda: scaled_dot_product_attention(q, k, v), torch.device("cpu"), lambda: syncs.append(1))
    assert len(syncs) == 1 + 3  # drained before, and after each of the three profiled steps
    families = {f["family"]: f for f in profile.families}
    assert {"aten::exp", "aten::sum", "aten::div"} <= set(families["softmax"]["operators"])
    assert "aten::bmm" in families["matmul"]["operators"] and len(families["softmax"]["step_ms"]) == 3
    assert families["attention_matmul"]["total_ms"] == pytest.approx(families["matmul"]["total_ms"])
    assert all(len(k["step_ms"]) == 3 for k in profile.top_kernels)
    assert not any(name.endswith("own_softmax") for name in (k["name"] for k in profile.top_kernels))


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
    assert len(syncs) == 4  # before the profiled steps, and after each of them


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


def test_the_writeup_ranks_only_what_every_profiled_step_agrees_on_and_finds_the_students_softmax():
    import pandas as pd

    from cs336_systems.handout.problems import nsys
    from cs336_systems.report.observe import records

    attention = event("function scaled_dot_product_attention", 0, 1, DeviceType.CPU, annotation=True)
    softmax = event("function softmax", 0, 1, DeviceType.CPU, annotation=True, parent=attention)

    def step(index, bmm_us, exp_us, addmm_us):
        start = 1000.0 * index
        return [
            event(WINDOW, start, start + 900, DeviceType.CPU, annotation=True),
            event("aten::bmm", start + 1, start + 2, DeviceType.CPU, bmm_us, parent=attention),
            event("aten::exp", start + 1, start + 2, DeviceType.CPU, exp_us, parent=softmax),
            event("aten::sum", start + 1, start + 2, DeviceType.CPU, 10.0, parent=softmax),
            event("aten::addmm", start + 1, start + 2, DeviceType.CPU, addmm_us),
        ]

    forward = summarize_events([*step(0, 300, 200, 50), *step(1, 310, 190, 50), *step(2, 290, 320, 50)], "cpu", 1.0)
    train = summarize_events([*step(0, 600, 100, 300), *step(1, 610, 90, 300), *step(2, 620, 95, 300)], "cpu", 1.0)
    base = {"tool": "benchmark", "status": "ok", "model": "small", "context_length": 256, "d_model": 64}
    frame = pd.DataFrame(
        [
            {**base, "num_heads": 4, "pass_type": pass_type, "top_kernels": list(p.top_kernels)}
            | {"kernel_families": list(p.families)}
            for pass_type, p in (("forward", forward), ("train-step", train))
        ]
    ).assign(source="rows.jsonl")
    lines = nsys.kernel_observations(records(nsys.kernel_rows(frame), "kernels"))
    said = "\n".join(lines)
    # forward: bmm and exp swap places in the third step, so neither is called the longest
    assert "`aten::bmm` and `aten::exp` take the most, and the profiled steps disagree" in said
    assert "(b) train-step, small context 256: the longest is `aten::bmm`" in said
    # the student's softmax is its exp and sum; attention's matmuls are the bmm alone
    assert (
        "softmax (`aten::exp`, `aten::sum`) takes 0.210 ms against 0.300 ms for attention's matrix multiplies" in said
    )
    assert "the 3 profiled steps disagree which is longer" in said
    # every matrix multiply counted together, bmm and addmm, of all the operator time: medians of 62.5, 64.3, 50.7%
    assert "(d) Matrix multiplies (mm, bmm, addmm, linear, matmul and einsum, counted together) are 62% " in said
    assert "and 90% in a training step" in said  # 89.1, 90.1, 89.8%
