"""Per-step timings from every rank: a collective's step ends when its slowest rank does."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence


def max_over_ranks(per_rank: Sequence[Sequence[float]]) -> list[float]:
    """Iteration i of a collective ends when its slowest rank does: the max over ranks."""
    return [max(values) for values in zip(*per_rank, strict=True)]


def mean_over_ranks(per_rank: Sequence[Sequence[float]]) -> list[float]:
    return [math.fsum(values) / len(values) for values in zip(*per_rank, strict=True)]


class BarrierFirst:
    """A StepTimer that aligns the ranks (untimed) before each timed step, so a step's time is
    its own and not how late another rank arrived."""

    def __init__(self, timer, barrier: Callable[[], None]):
        self.timer, self.barrier = timer, barrier

    def time_ms(self, step) -> float:
        self.barrier()
        return self.timer.time_ms(step)
