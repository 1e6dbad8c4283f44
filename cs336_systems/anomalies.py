"""Flag rows that ran far below what comparable rows achieved, with their likely cause.

A row is anomalous when its achieved FLOP/s is below a third of the best row measured on
the same device, in the same precision and pass type. Likely causes, checked in order:
  memory oversubscription  the predicted peak exceeds the device's memory, so the driver
                           spills to host memory or the allocator thrashes (docs/reference.md
                           section 3: large at 17.8 s vs medium at 0.93 s on a 16 GB laptop);
  host-bound (measured)    the profiled step (cs336_systems.profiling) shows the GPU idle
                           for more than HOST_BOUND_IDLE_PCT of the step: the host cannot
                           launch kernels fast enough; with the GPU busy instead, the row is
                           device-bound (slow kernels, not launches);
  launch-bound             without a measured busy figure: each layer does under 1/8 of the
                           best row's work, so kernel launches and small kernels likely dominate;
  unexplained              neither: look at cv_pct, clocks and other processes.
A compiled or CUDA-graph GPU row is also marked when its steps vary by more than NOISY_CV_PCT
(flag_noisy_gpu_steps), with the profiled step's GPU-busy figure as its cause.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

SLOW_FRACTION = 1 / 3
LAUNCH_BOUND_WORK_FRACTION = 1 / 8
HOST_BOUND_IDLE_PCT = 20.0
GROUP_FIELDS = ("device_name", "precision", "pass_type")
NOISY_CV_PCT, NOISY_MIN_STEPS = 2.0, 10  # a compiled or CUDA-graph GPU step this noisy is explained or marked


def fast_path_flags(row: dict) -> str | None:
    """The fast-path flags a row (or BenchmarkConfig.identity()) used, as typed, or None."""

    def given(name: str) -> object:
        value = row.get(name)
        return None if value is None or (isinstance(value, float) and math.isnan(value)) or value == "" else value

    accum, dtype, fused = given("grad_accum_steps"), given("param_dtype"), given("fused_projections")
    flags = [
        f"--grad-accum-steps {int(float(accum))}" if accum is not None and int(float(accum)) > 1 else "",
        f"--param-dtype {dtype}" if dtype is not None and dtype != "fp32" else "",
        "--fused-projections" if fused is not None and str(fused).lower() == "true" else "",
    ]
    return " ".join(flag for flag in flags if flag) or None


def _number(row: dict, name: str) -> float | None:
    value = row.get(name)
    if value is None or isinstance(value, str):
        return None
    value = float(value)
    return None if math.isnan(value) else value


def flag_anomalies(rows: Sequence[dict]) -> dict[int, str]:
    """{row index: 'why it is slow'} for the rows that ran below a third of their group's best."""
    best: dict[tuple, dict] = {}
    for row in rows:
        achieved = _number(row, "achieved_tflops")
        if row.get("status") != "ok" or achieved is None:
            continue
        key = tuple(row.get(name) for name in GROUP_FIELDS)
        if key not in best or achieved > _number(best[key], "achieved_tflops"):
            best[key] = row
    flags = {}
    for index, row in enumerate(rows):
        achieved = _number(row, "achieved_tflops")
        reference = best.get(tuple(row.get(name) for name in GROUP_FIELDS))
        if achieved is None or reference is None or reference is row:
            continue
        best_achieved = _number(reference, "achieved_tflops")
        if achieved >= SLOW_FRACTION * best_achieved:
            continue
        why = f"{achieved / best_achieved:.0%} of the best comparable row's FLOP/s: {_cause(row, reference)}"
        fast = [
            f"{which} {flags_used}"
            for which, flags_used in (("this row", fast_path_flags(row)), ("the best row", fast_path_flags(reference)))
            if flags_used
        ]
        flags[index] = why + (f" (fast path: {'; '.join(fast)})" if fast else "")
    return flags


def _cause(row: dict, reference: dict) -> str:
    predicted, capacity = _number(row, "predicted_memory_bytes"), _number(row, "device_memory_bytes")
    if predicted is not None and capacity is not None and predicted > capacity:
        return (
            f"memory oversubscription (predicted peak {predicted / 2**30:.1f} GiB > "
            f"{capacity / 2**30:.1f} GiB on the device: expect host spill)"
        )
    busy_pct = _number(row, "device_busy_pct")
    if busy_pct is not None:
        return _measured_cause(busy_pct, _number(row, "kernels_per_step"))
    work, best_work = _work_per_layer(row), _work_per_layer(reference)
    if work is not None and best_work and work < LAUNCH_BOUND_WORK_FRACTION * best_work:
        return "launch-bound (too little work per kernel: each layer does under 1/8 of the best row's FLOPs)"
    return "unexplained (not predicted to overflow memory, not small): check cv_pct, clocks, other processes"


def flag_noisy_gpu_steps(rows: Sequence[dict]) -> dict[int, str]:
    """{row index: why} for the compiled or CUDA-graph GPU rows of NOISY_MIN_STEPS+ measured steps whose
    CV is above NOISY_CV_PCT: such a step replays the same kernels, so its spread has a cause, which
    the profiled step's GPU-busy figure names (host-bound launches or not), or says it was not measured."""
    flags = {}
    for index, row in enumerate(rows):
        cv, steps = _number(row, "cv_pct"), _number(row, "measure_steps")
        replayed = any(str(row.get(name)).lower() == "true" for name in ("compile", "cuda_graphs"))
        gpu = str(row.get("device") or "").startswith("cuda")
        if row.get("status") != "ok" or not (replayed and gpu) or cv is None or (steps or 0) < NOISY_MIN_STEPS:
            continue
        if cv <= NOISY_CV_PCT:
            continue
        busy = _number(row, "device_busy_pct")
        cause = (
            _measured_cause(busy, _number(row, "kernels_per_step"))
            if busy is not None
            else "no profiled step says whether the host or the GPU set the pace"
        )
        flags[index] = f"CV {cv:.1f}% over {steps:.0f} steps, above {NOISY_CV_PCT:g}% for a replayed step: {cause}"
    return flags


def _work_per_layer(row: dict) -> float | None:
    flops, layers = _number(row, "flops_per_step"), _number(row, "num_layers")
    return flops / layers if flops and layers else None


def _measured_cause(busy_pct: float, kernels: float | None) -> str:
    """The cause read from the profiled step: how much of it the GPU sat idle."""
    counted = f", {kernels:,.0f} kernels" if kernels is not None else ""
    if 100.0 - busy_pct > HOST_BOUND_IDLE_PCT:
        return f"host-bound: GPU idle {100.0 - busy_pct:.0f}% of the step{counted} (measured in a profiled step)"
    return f"device-bound: GPU busy {busy_pct:.0f}% of the step{counted}: slow kernels, not launches (measured)"
