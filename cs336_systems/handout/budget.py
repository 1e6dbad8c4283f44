"""A plan's time: predicted seconds as a reader reads them, the wall time with some steps at once, and
--budget, which shrinks the plan until that wall time fits (fewer measured steps, fewer contexts, then
the last problems of the handout's order skipped)."""

from __future__ import annotations

from ..errors import UsageError
from .plan import Step, predict
from .target import Target

MEASURE_REDUCTIONS = {"benchmark": 5, "ddp": 5, "attention": 20, "allreduce": 5}


def format_seconds(value: float | None) -> str:
    if value is None:
        return "?"
    if value < 120:
        return f"{value:.0f} s"
    return f"{value / 60:.0f} min" if value < 7200 else f"{value / 3600:.1f} h"


def total_seconds(steps: list[Step]) -> float:
    return sum(s.predicted_s or 0 for s in steps if s.status == "run")


def _lane_finishes(steps: list[Step], lanes: int | None) -> list[float]:
    """When each step to run would end with `lanes` jobs at once (None: as many as there are steps, as on
    Slurm with no --slurm-array-parallelism), each started in the plan's order on the lane free first.
    Queue waits and steps that wait for another's output are not modelled: a lower bound."""
    free = [0.0] * (lanes or max(1, len(steps)))
    finishes = []
    for step in steps:
        if step.status == "run":
            lane = free.index(min(free))
            free[lane] += step.predicted_s or 0
            finishes.append(free[lane])
    return finishes


def wall_seconds(steps: list[Step], lanes: int | None = 1) -> float:
    """The plan's predicted wall time with `lanes` jobs at once (1: one step after another)."""
    return max(_lane_finishes(steps, lanes), default=0.0)


def fit_budget(
    steps: list[Step], budget_s: float, target: Target, user_model: bool, lanes: int | None = 1
) -> list[str]:
    """Shrink the plan until its predicted wall time with `lanes` jobs at once fits `budget_s`, in this
    order: fewer measured steps, fewer contexts (the longest dropped), then the last problems of the
    handout's order skipped. Each step records its own reductions; the plan-level ones are returned."""
    notes = []
    if wall_seconds(steps, lanes) <= budget_s:
        return notes
    for step in steps:
        fewer = MEASURE_REDUCTIONS.get(step.kind)
        measured = step.args().measure_steps if step.status == "run" and fewer else 0  # as the tool counts them
        if step.status == "run" and fewer and measured > fewer:
            step.flags["--measure-steps"] = fewer
            step.reductions.append(f"--measure-steps {measured} -> {fewer} (--budget)")
            predict(step, target, user_model)
    notes.append("fewer measured steps")
    if wall_seconds(steps, lanes) <= budget_s:
        return notes
    for step in steps:
        contexts = step.flags.get("--context-lengths")
        if step.status == "run" and isinstance(contexts, list) and len(contexts) > 2:
            kept = sorted(contexts, key=int)[: max(2, len(contexts) // 2)]
            dropped = [c for c in contexts if c not in kept]
            step.flags["--context-lengths"] = kept
            step.reductions.append(f"contexts {' '.join(map(str, dropped))} dropped (--budget)")
            predict(step, target, user_model)
    notes.append("fewer contexts")
    free = [0.0] * (lanes or max(1, len(steps)))
    for step in steps:
        if step.status != "run":
            continue
        lane = free.index(min(free))
        if free[lane] + (step.predicted_s or 0) > budget_s:
            step.skip(
                f"over --budget: predicted {step.predicted_s:.0f} s, {max(0.0, budget_s - free[lane]):.0f} s left"
            )
        else:
            free[lane] += step.predicted_s or 0
    notes.append("later problems skipped")
    return notes


def parse_duration(text: str) -> float:
    """'45m', '2h', '90s', '1h30m', or seconds: seconds, more than zero (a UsageError otherwise)."""
    import re

    value = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", value):
        seconds = float(value)
    else:
        parts = re.findall(r"(\d+(?:\.\d+)?)\s*([hms])", value)
        if not parts or "".join(n + u for n, u in parts) != value.replace(" ", ""):
            raise UsageError(f"--budget {text!r}: expected a duration like 45m, 2h, 1h30m or 90s")
        seconds = sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)
    if seconds <= 0:
        raise UsageError(f"--budget {text!r}: must be more than zero")
    return seconds
