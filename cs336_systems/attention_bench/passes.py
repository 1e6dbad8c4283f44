"""attention_bench's three timed passes (forward, backward, end to end) over one set of inputs: in the
timing loop (timing.time_steps), or as do_bench calls. Each pass returns its (measured, warmup) samples."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..timing import UntimedSetup, time_steps
from .config import AttentionConfig
from .dobench import do_bench_samples

Samples = tuple[Sequence[float], Sequence[float]]  # (measured, warmup) per-step times in ms


def clear_grads(inputs: Sequence[torch.Tensor]) -> None:
    """Gradients of q, k, v dropped between steps (each backward writes fresh ones)."""
    for tensor in inputs:
        tensor.grad = None


def do_bench_passes(do_bench: Callable, attend: Callable, inputs, grad_out) -> dict[str, Callable[[], Samples]]:
    """Each pass as one do_bench call (it picks its own warmup): forward, backward, end to end."""

    def backward() -> list[float]:
        out = attend(*inputs)
        return do_bench_samples(do_bench, lambda: out.backward(grad_out, retain_graph=True), inputs)

    return {
        "forward": lambda: (do_bench_samples(do_bench, lambda: attend(*inputs), inputs), []),
        "backward": lambda: (backward(), []),
        "end_to_end": lambda: (do_bench_samples(do_bench, lambda: attend(*inputs).backward(grad_out), inputs), []),
    }


def timed_passes(
    config: AttentionConfig, timer, attend: Callable, inputs, grad_out
) -> dict[str, Callable[[], Samples]]:
    """Each pass in the timing loop: what a step does not time (freeing the last output, a fresh
    forward before a backward, clearing gradients) runs outside the clock (UntimedSetup)."""
    budget = dict(
        warmup_steps=config.warmup_steps, measure_steps=config.measure_steps, budget_s=config.max_seconds or None
    )

    def forward() -> Samples:
        held = {}  # each output is freed before the next step starts, outside the clock
        times = time_steps(
            lambda: held.__setitem__("out", attend(*inputs)), timer=UntimedSetup(timer, held.clear), **budget
        )
        held.clear()
        return times.measured_ms, times.warmup_ms

    def backward() -> Samples:
        state = {}

        def fresh_forward() -> None:
            clear_grads(inputs)
            state["out"] = attend(*inputs)

        times = time_steps(
            lambda: state.pop("out").backward(grad_out), timer=UntimedSetup(timer, fresh_forward), **budget
        )
        return times.measured_ms, times.warmup_ms

    def end_to_end() -> Samples:
        clear = lambda: clear_grads(inputs)  # noqa: E731
        times = time_steps(lambda: attend(*inputs).backward(grad_out), timer=UntimedSetup(timer, clear), **budget)
        return times.measured_ms, times.warmup_ms

    return {"forward": forward, "backward": backward, "end_to_end": end_to_end}
