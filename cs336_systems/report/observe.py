"""Small helpers for observations: sentences computed from measured rows (ratios, ranges, which is
largest), never an interpretation. A helper that cannot find its rows returns None, and the
observation is left out rather than guessed."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import pandas as pd

from .document import sig3
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


def times(value: float) -> str:
    return f"{value:.2f}x" if value < 10 else f"{value:.1f}x"


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
