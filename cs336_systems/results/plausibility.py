"""What a measured value can be, declared once: a duration or a byte count is never below zero, MFU
is a share of the peak (at most 1), a share of a step is at most 100%, data-parallel ranks are never
faster together than one process alone, a difference of two noisy timings (DDP's exposed
communication) is a result only where its steps resolve it from zero, MFU only over a peak not
measured low (peak_flops), a phase's peak holds at least what its rank holds then, a whole timed on
its own is never below a part timed on its own, and a rate is on RATE_STATISTIC (report.grid shows it).

A row that breaks a rule keeps its raw values in the result files and says which field and why in
its notes; tables (report's grid, the tools' Markdown) show NOT_MEASURABLE in that cell, with the
reason under the table, never the impossible number.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from ..units import format_bytes

NOT_MEASURABLE = "n/m"
NOTE_PREFIX = "not measurable: "

# a share of something whole, in percent
SHARES_PCT = ("comm_pct", "device_busy_pct", "data_wait_pct", "share_pct", "kernel_share_pct")
# amounts and rates that are never negative, besides every *_ms, *_s and *_bytes
NON_NEGATIVE = ("tokens_per_s", "samples_per_s", "achieved_tflops", "algbw_gbps", "busbw_gbps", "flops_per_step")
# DDP's exposed communication as a difference of two timings (ddp_bench's comm_method says so)
DIFFERENCE_METHOD = "step - no_sync step"
# a value computed from another: unusable where that one is
DEPENDS_ON = {"comm_pct": "comm_ms", "end_to_end_tflops": "end_to_end_median_ms"}
# ddp_bench: a phase's peak (in words) holds at least its rank's parameters, + gradients, + optimizer state
HELD = dict(param_bytes_per_rank="parameters", grad_bytes_per_rank="gradients")
HELD["optimizer_state_bytes_per_rank"] = "optimizer state"
PEAK_HOLDS = {"peak_model_bytes": "after building", "peak_before_optimizer_bytes": "before the optimizer step"}
PEAK_HOLDS["peak_optimizer_bytes"] = "after the optimizer step"
# a whole and its parts each timed in loops of their own (attention_bench): for each statistic, whole >= part
WHOLE_OF_PARTS, LOCATIONS = {"end_to_end_": ("forward_", "backward_")}, ("median", "mean", "min", "max", "p10", "p90")
# every rate (per second, TFLOP/s, MFU) is on this statistic of the steps (stats.per_second)
RATE_STATISTIC, RATES = "median", ("tokens_per_s", "samples_per_s", "algbw_gbps", "busbw_gbps", "mfu")


def _number(value: object) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def _never_negative(field: str) -> bool:
    if field.endswith("_pct"):
        return False
    return field.endswith(("_ms", "_s", "_bytes")) or field in NON_NEGATIVE


def _straddles_zero(samples: list[float]) -> bool:
    """Whether the median of per-step differences cannot be told from zero: a 95% bootstrap interval
    of it contains 0 (with fewer than 3 steps nothing is resolved)."""
    values = np.asarray([s for s in samples if s is not None and math.isfinite(s)], dtype=float)
    if len(values) < 3:
        return True
    medians = np.median(np.random.default_rng(0).choice(values, (2000, len(values))), axis=1)
    low, high = np.quantile(medians, [0.025, 0.975])
    return low <= 0 <= high


def field_problem(field: str, value: object, row: Mapping) -> str | None:
    """Why `row`'s `field` cannot be a result, or None."""
    number = _number(value)
    if number is None:
        return None
    if not math.isfinite(number):
        return f"{field} is {number}"
    if field == "mfu" and not 0 <= number <= 1:
        return f"MFU {number:.3g} is not a share of the peak (0 to 1): the peak it divides by is wrong"
    if field == "mfu" and isinstance(row.get("peak_low"), str) and row["peak_low"]:
        return f"MFU over a peak measured low ({row['peak_low']}) reads high"
    if field in SHARES_PCT and not 0 <= number <= 100:
        return f"{_readable(field.removesuffix('_pct') + ' share', number)}% is not a share (0 to 100%)"
    if field == "scaling_efficiency" and number > 1:
        return (
            f"scaling efficiency {number:.0%}: the ranks together ran faster than one process alone, "
            "which the two timings' noise explains, not the ranks"
        )
    if field == "comm_ms" and str(row.get("comm_method") or "").startswith(DIFFERENCE_METHOD):
        steps = row.get("comm_step_ms")
        if isinstance(steps, list) and steps and _straddles_zero(steps):
            low, high = min(steps), max(steps)
            return f"exposed communication: per-step differences {low:+.1f}..{high:+.1f} ms straddle 0"
    if _never_negative(field) and number < 0:
        return f"{_readable(field, number)} is below zero (a difference of two noisy measurements)"
    return _below_what_it_holds(field, number, row)


def is_rate(field: str) -> bool:
    return field in RATES or field.endswith("_tflops")


def _below_what_it_holds(field: str, number: float, row: Mapping) -> str | None:
    """A peak below the bytes its rank holds in that phase, or a whole below one of its parts."""
    if field in PEAK_HOLDS:
        names = list(HELD)[: list(PEAK_HOLDS).index(field) + 1]
        held = [_number(row.get(name)) for name in names]
        if None not in held and number < sum(held):
            what = f"{format_bytes(sum(held))} the rank holds ({' + '.join(HELD[name] for name in names)})"
            return f"the peak {PEAK_HOLDS[field]}, {format_bytes(number)}, is below the {what}"
    whole = next((w for w in WHOLE_OF_PARTS if field.startswith(w)), None)
    statistic = field.removeprefix(whole or "").removesuffix("_ms")
    for part in WHOLE_OF_PARTS.get(whole, ()) if statistic in LOCATIONS else ():
        value = _number(row.get(f"{part}{statistic}_ms"))
        if value is not None and number < value:
            return (
                f"end-to-end {number:.3g} ms is below the {part[:-1]}'s {value:.3g} ms ({statistic}s, separate loops)"
            )
    return None


def _readable(field: str, number: float) -> str:
    """'peak optimizer 1.22 MiB' for peak_optimizer_bytes 1.28e6."""
    words = field.replace("_bytes", "").replace("_ms", "").replace("comm", "communication").replace("_", " ")
    if "_bytes" in field:
        return f"{words} {format_bytes(number)}"
    return f"{words} {number:.3g} ms" if field.endswith("_ms") else f"{words} {number:.3g}"


def problems(row: Mapping) -> dict[str, str]:
    """Every field of `row` that cannot be a result, and why (a value computed from one of them too)."""
    found = {}
    for field, value in row.items():
        if isinstance(value, (list, dict)):
            continue
        why = field_problem(field, value, row)
        if why:
            found[field] = why
    for field, source in DEPENDS_ON.items():
        if source in found and _number(row.get(field)) is not None:  # the root cause, not its symptom
            found[field] = f"from {source}: {found[source]}"
    return found


def with_note(notes: str | None, row: Mapping) -> str | None:
    """The row's notes with what cannot be a result said once (none added when all is plausible)."""
    found = problems(row)
    if not found:
        return notes
    said = NOTE_PREFIX + "; ".join(found.values())
    return said if not notes else (notes if said in notes else f"{notes}; {said}")
