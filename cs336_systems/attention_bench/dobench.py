"""`--timer do-bench`: Triton's do_bench where it can run (Triton importable, a CUDA device), else
the CUDA-event loop, else the host clock; the row's `timer_used` says which ran and `notes` why."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..timing import triton_do_bench

TRITON = "triton.do_bench"


def do_bench_backend(device: torch.device) -> tuple[str, Callable | None, str | None]:
    """(timer used, do_bench or None, why not Triton) for --timer do-bench on `device`."""
    do_bench = triton_do_bench()
    if do_bench is not None and device.type == "cuda":
        return TRITON, do_bench, None
    why = "Triton is not importable" if do_bench is None else "Triton's do_bench needs a CUDA device"
    fallback = "cuda-event" if device.type == "cuda" else "host"
    return fallback, None, f"--timer do-bench: {why}; timed with the {fallback} loop instead"


def do_bench_samples(
    do_bench: Callable, step: Callable[[], object], grad_to_none: Sequence[torch.Tensor]
) -> list[float]:
    """Per-repetition times (ms) from do_bench. It picks its own warmup and repetitions by time
    (25 ms and 100 ms by default) and clears `grad_to_none` between repetitions."""
    try:
        result = do_bench(step, grad_to_none=list(grad_to_none), return_mode="all")
    # A Triton without return_mode raises TypeError; one whose return_mode lacks "all" fails an assert.
    except (TypeError, AssertionError):  # the mean alone, then
        result = do_bench(step, grad_to_none=list(grad_to_none))
    return [float(x) for x in result] if isinstance(result, (list, tuple)) else [float(result)]
