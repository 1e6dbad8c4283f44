"""Small helpers for observations: sentences computed from measured rows (ratios, ranges, which is
largest), never an interpretation. A helper that cannot find its rows returns None, and the
observation is left out rather than guessed. A sentence that ranks or sizes a difference between two
rows goes through `versus` (stats.compare): it says the difference only where the noise of both rows
cannot explain it, and "the same within the noise" otherwise."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

import pandas as pd

from ..contention import BUSY_CORES
from ..stats import Comparison, compare, compare_spreads
from .document import sig3, times
from .fields import derive, label_text


def records(frame: pd.DataFrame, tool: str) -> list[dict]:
    frame = derive(frame, tool)
    return frame.astype(object).where(frame.notna(), None).to_dict("records")


def number(row: dict | None, name: str) -> float | None:
    if row is None:
        return None
    try:
        value = float(row.get(name))
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def ok(rows: Iterable[dict]) -> list[dict]:
    return [r for r in rows if r.get("status") == "ok"]


def pick(rows: Iterable[dict], **labels: str) -> dict | None:
    """The one row whose labels read as given; None when there is none or more than one."""
    found = [r for r in rows if all(label_text(k, r) == str(v) for k, v in labels.items())]
    return found[0] if len(found) == 1 else None


def distinct(rows: Iterable[dict], name: str) -> list[str]:
    return list(dict.fromkeys(label_text(name, r) for r in rows))


def span(values: Sequence[float], unit: str = "x") -> str:
    """'1.9x' or '1.9x to 2.4x'."""
    values = [v for v in values if v is not None]
    if not values:
        return ""
    low, high = min(values), max(values)
    show = times if unit == "x" else (lambda v: f"{sig3(v)}{unit}")
    return show(low) if show(low) == show(high) else f"{show(low)} to {show(high)}"


def percent(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole else ""


def change(new: float, old: float) -> str:
    """'+12%' / '-30%' of new against old."""
    return f"{100 * (new - old) / old:+.0f}%" if old else ""


def slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of log(y) on log(x): 1 linear, 2 quadratic; None from fewer than three
    lengths (two points always make a line, so they say nothing of its shape)."""
    points = [(x, y) for x, y in points if x and y and x > 0 and y > 0]
    if len({x for x, _ in points}) < 3:
        return None
    xs = [math.log(x) for x, _ in points]
    ys = [math.log(y) for _, y in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else None


# -- sentences that rank or size a difference: only where the noise of both rows allows -----------


def versus(a: dict | None, b: dict | None, phase: str = "") -> Comparison | None:
    """Row a's time against row b's (a / b, on medians): from their steps where the rows kept them (a
    JSONL row), else from their medians and interquartile ranges (a CSV row). None without both;
    never resolved where either row was measured on a busy machine (under_load)."""
    if a is None or b is None:
        return None
    samples = f"{phase}_samples_ms" if phase else "step_ms"
    if isinstance(a.get(samples), list) and isinstance(b.get(samples), list):
        return under_load(compare(a[samples], b[samples]), [a, b])
    prefix = f"{phase}_" if phase else ""
    comparison = compare_spreads(
        number(a, f"{prefix}median_ms"),
        number(a, f"{prefix}iqr_ms"),
        number(b, f"{prefix}median_ms"),
        number(b, f"{prefix}iqr_ms"),
    )
    return under_load(comparison, [a, b])


LOADED = "not compared: other processes kept"


def busy_loads(rows: Iterable[dict]) -> list[float]:
    """The other processes' load (cores) of each row measured while they kept the machine busy."""
    loads = [number(r, "other_load_cores") for r in rows]
    return [load for load in loads if load is not None and load > BUSY_CORES]


def under_load(comparison: Comparison | None, rows: Iterable[dict]) -> Comparison | None:
    """`comparison`, unresolved where any of `rows` was measured while other processes kept the machine
    busy: each row's steps say nothing of what the load did to the other row (a thread of one row
    waiting for a core, seen as 255 ms steps of a 1 ms forward), so no interval of the two is one."""
    rows = list(rows)
    gpus = [number(r, "gpu_other_processes") or 0 for r in rows]
    busy = busy_loads(rows)
    if comparison is None or not comparison.resolved or not (busy or any(gpus)):
        return comparison
    what = f"up to {max(busy):.1f} cores busy" if busy else "the GPU busy"
    return dataclasses.replace(comparison, resolved=False, method=f"{LOADED} {what} while these rows were measured")


def noise_text(comparison: Comparison) -> str:
    if comparison.method.startswith(LOADED):
        return f"({comparison.method})"
    width = comparison.half_width_pct
    return "the same within the noise" + (f" (±{width:.0f}%)" if math.isfinite(width) else f" ({comparison.method})")


def speed_text(comparison: Comparison) -> str:
    """'1.9x as fast (interval 1.8x to 2.0x)', or the same within the noise: a time ratio a / b read as a's speed."""
    if not comparison.resolved:
        return noise_text(comparison)
    return (
        f"{times(1 / comparison.ratio)} as fast (interval {times(1 / comparison.high)} to {times(1 / comparison.low)})"
    )


def change_text(comparison: Comparison) -> str:
    """'+12% (interval +8% to +15%)', or the same within the noise: a's time against b's."""
    if not comparison.resolved:
        return noise_text(comparison)
    low, high = 100 * (comparison.low - 1), 100 * (comparison.high - 1)
    return f"{100 * (comparison.ratio - 1):+.0f}% (interval {low:+.0f}% to {high:+.0f}%)"
