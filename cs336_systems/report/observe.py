"""Observations: sentences computed from measured rows, never an interpretation. Each ranking or sizing
of two timings ("1.9x as fast", "1.55x the time", "29% of a step") is a `Claim` made by one function,
`versus`, from the rows' per-step samples, and worded by one renderer, `say`. Each block of sentences
is a registered maker's (`observations`), its spec beside it so that `report --verify` says it again.
A helper that cannot find its rows returns None: the sentence is left out rather than guessed."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..contention import BUSY_CORES, describe_rows
from ..stats import MIN_SAMPLES, SAME_BAND_PCT, compare, compare_spreads
from .document import Bullets, Text, sig3, times
from .fields import derive, label_text
from .grid import matches


def records(frame: pd.DataFrame, tool: str) -> list[dict]:
    frame = derive(frame, tool) if tool else frame
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


def span(values: Iterable[float], show: Callable[[float], str] = times, both: bool = False) -> str:
    """'1.9x' or '1.9x to 2.4x' (`both`: the two ends even where they read alike, as an interval)."""
    values = sorted(v for v in values if v is not None)
    low, high = (show(values[0]), show(values[-1])) if values else ("", "")
    return low if low == high and not both else f"{low} to {high}"


def change(new: float, old: float) -> str:
    """'+12%' / '-30%' of new against old (two numbers with no noise: bytes, not times)."""
    return f"{100 * (new - old) / old:+.0f}%" if old else ""


def slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of log(y) on log(x): 1 linear, 2 quadratic; None from fewer than three
    lengths (two points always make a line, so they say nothing of its shape)."""
    points = [(x, y) for x, y in points if x and y and x > 0 and y > 0]
    return float(np.polyfit(*np.log(points).T, 1)[0]) if len({x for x, _ in points}) >= 3 else None


# -- claims: the one function that compares two timings, and the one renderer ---------------------

RESOLVED, SAME, UNTOLD, NOT_COMPARED = "resolved", "the same", "cannot tell", "not compared"
LOADED = "other processes kept"  # how a claim of rows measured on a busy machine says why (under_load)


@dataclass(frozen=True)
class Claim:
    """What a's steps say of b's: the ratio of their statistic (a / b) and its interval, or why the two
    are not compared. `caveat`: compared across thread counts or devices, which the sentence says."""

    ratio: float | None = None
    low: float = 0.0
    high: float = math.inf
    why_not: str = ""
    caveat: str = ""
    statistic: str = "median"

    @property
    def verdict(self) -> str:
        if self.why_not or self.ratio is None:
            return NOT_COMPARED
        if self.low > 1 or self.high < 1:
            return RESOLVED
        band = SAME_BAND_PCT / 100
        return SAME if 1 - band <= self.low and self.high <= 1 + band else UNTOLD

    @property
    def half_width_pct(self) -> float:
        return 100 * max(self.high - self.ratio, self.ratio - self.low) / self.ratio


def under_load(rows: list[dict]) -> str:
    """Why these rows' times are compared with nothing ('' where none was measured on a busy machine)."""
    busy = [load for r in rows if (load := number(r, "other_load_cores")) is not None and load > BUSY_CORES]
    gpus = any(number(r, "gpu_other_processes") for r in rows)
    if not (busy or gpus):
        return ""
    what = f"up to {max(busy):.1f} cores" if busy else "the GPU"
    return f"{LOADED} {what} busy while {'this row was' if len(rows) == 1 else 'these rows were'} measured"


def _steps(row: dict, phase: str, samples: str | None) -> list | None:
    steps = row.get(samples or (f"{phase}_samples_ms" if phase else "step_ms"))
    return steps if isinstance(steps, list) else None


def versus(
    a: dict | None, b: dict | None, phase: str = "", of: str | None = None, statistic: str = "median", samples=None
) -> Claim | None:
    """Row a's `phase` ('' the whole step) against row b's phase `of` (default the same; with a is b, one
    phase of a row sized against another): the ratio of their `statistic` with a bootstrap interval from
    each row's steps (a JSONL row keeps them; `samples` names another list of them), else from the
    statistic and its spread (a CSV row). Not compared where either row was measured while other
    processes kept the machine busy (each row's steps say nothing of what the load did to the other: a
    1 ms forward measured as 255 ms steps) or from fewer than MIN_SAMPLES steps; rows of other thread
    counts or devices are compared with a caveat. None without both rows."""
    if a is None or b is None:
        return None
    if why := under_load([a] if a is b else [a, b]):
        return Claim(why_not=why, statistic=statistic)
    caveat = "; ".join(
        f"measured with {label_text(name, a)} and {label_text(name, b)} {word}"
        for name, word in (("num_threads", "threads"), ("device_name", "devices"))
        if label_text(name, a) and label_text(name, b) and label_text(name, a) != label_text(name, b)
    )
    of = phase if of is None else of
    mine, theirs = _steps(a, phase, samples), _steps(b, of, samples)
    if mine is not None and theirs is not None:
        if min(len(mine), len(theirs)) < MIN_SAMPLES:
            return Claim(why_not=f"too few steps: {len(mine)} and {len(theirs)}", statistic=statistic)
        found = compare(mine, theirs, statistic)
    else:  # the statistic and half its spread: IQR / 2 of a median, the std of a mean
        spread, scale = ("iqr_ms", 0.5) if statistic == "median" else ("std_ms", 1.0)
        ends = [(f"{p}_" if p else "", row) for p, row in ((phase, a), (of, b))]
        ends = [(number(r, f"{p}{statistic}_ms"), (number(r, f"{p}{spread}") or math.nan) * scale) for p, r in ends]
        found = compare_spreads(*ends[0], *ends[1])
    return None if found is None else Claim(*found, caveat=caveat, statistic=statistic)


# form -> (the number a sentence shows for a ratio a / b, how it is written, the words after it)
FORMS: dict[str, tuple[Callable, Callable, str]] = {
    "speed": (lambda r: 1 / r if r else math.inf, times, " as fast"),
    "time": (lambda r: r, times, " the time"),
    "change": (lambda r: 100 * (r - 1), lambda v: f"{v:+.0f}%", ""),
    "share": (lambda r: 100 * r, lambda v: f"{sig3(v)}%", ""),
}


def _range(form: str, ratios: Iterable[float], interval: bool = False) -> str:
    return span([FORMS[form][0](r) for r in ratios], FORMS[form][1], interval)


def _clear_best(pairs: list[tuple[Claim, str]], compared: list[Claim], form: str) -> str:
    """Where one of several resolved claims shows the highest number with an interval clear of every
    other compared claim's: which."""
    shown = FORMS[form][0]
    best, label = max(pairs, key=lambda p: shown(p[0].ratio))
    bounds = sorted((shown(best.low), shown(best.high)))
    if len(compared) < 2 or not label:
        return ""
    if all(max(shown(c.low), shown(c.high)) < bounds[0] for c in compared if c is not best):
        return f"; the highest at {label}, its interval clear of every other's"
    return ""


def say(claims: Claim | Sequence[tuple[Claim | None, str]], a: str, b: str, form: str = "speed", unit: str = "") -> str:
    """The one renderer: what one claim, or claims over several (shapes, models: (claim, label) pairs,
    `unit` naming them), say of a against b, in `form` (FORMS). 'The same' only where an interval lies
    within SAME_BAND_PCT of 1; cannot tell, with how wide the interval is; not compared, with why."""
    pairs = [(claims, "")] if isinstance(claims, Claim) else [(c, label) for c, label in claims if c is not None]
    count = len(pairs)
    compared = [c for c, _ in pairs if c.verdict != NOT_COMPARED]
    parts = []
    for verdict in (RESOLVED, SAME, UNTOLD, NOT_COMPARED):
        group = [(c, label) for c, label in pairs if c.verdict == verdict]
        if not group:
            continue
        found = [c for c, _ in group]
        where = (
            "" if count == 1 else f" at all {count} {unit}" if len(group) == count else f" at {len(group)} of {count}"
        )
        if verdict == RESOLVED:
            text = _range(form, [c.ratio for c in found]) + FORMS[form][2] + where
            text += f" (interval {_range(form, [found[0].low, found[0].high], interval=True)}" if count == 1 else ""
            text += (", of the means)" if found[0].statistic == "mean" else ")") if count == 1 else ""
            text += _clear_best(group, compared, form)
        elif verdict == SAME:
            interval = f" (interval {times(found[0].low)} to {times(found[0].high)})" if count == 1 else ""
            text = f"the same within ±{SAME_BAND_PCT:g}%{where}{interval}"
        elif verdict == UNTOLD:
            width = max(c.half_width_pct for c in found)
            text = f"cannot tell{where}, {'±' if count == 1 else 'up to ±'}{width:.0f}%"
            text = text if math.isfinite(width) else f"cannot tell{where}, an interval without bound"
        else:  # the load once, at its most
            loads = sorted(
                (c for c in found if c.why_not.startswith(LOADED)),
                key=lambda c: [float(x) for x in re.findall(r"\d+\.\d+", c.why_not)],
            )
            why = dict.fromkeys(c.why_not for c in [*loads[-1:], *(c for c in found if c not in loads)])
            text = f"not compared{where} ({'; '.join(why)})"
        parts.append(text)
    if not parts:
        return ""
    caveats = "; ".join(dict.fromkeys(c.caveat for c, _ in pairs if c.caveat))
    subject = f"{a} as a share of {b}" if form == "share" else f"{a} against {b}"
    return f"{subject}: {'; '.join(parts)}" + (f" ({caveats})" if caveats else "")


# -- observation blocks: made by a registered maker from named files, so --verify makes them again --

MAKERS: dict[str, Callable[..., list[str] | str]] = {}


def maker(function: Callable) -> Callable:
    """Registers an observation maker, (rows, **args) -> sentences (a list, or one paragraph), by name."""
    if MAKERS.setdefault(function.__name__, function) is not function:
        raise ValueError(f"two observation makers named {function.__name__}")
    return function


maker(describe_rows)  # how busy the machine was: the first page's and report's load sentence


def claim_rows(frame: pd.DataFrame, tool: str, where: dict) -> list[dict]:
    return [row for row in records(frame, tool) if matches(row, where)]


def observations(make: Callable, frame: pd.DataFrame, tool: str = "", where: dict | None = None, **args):
    """The sentences the maker `make` says of `frame`'s rows (derived as `tool`'s, those `where`'s label
    texts pick), as a block (Bullets, or Text for one paragraph) carrying its spec: the maker, the files
    the rows come from, `where` and `args`, all `report --verify` needs to make it again."""
    said = make(claim_rows(frame, tool, where or {}), **args)
    sources = list(dict.fromkeys(str(s) for s in frame["source"].dropna())) if "source" in frame else []
    spec = {"maker": make.__name__, "tool": tool, "sources": sources, "where": where or {}, "args": args}
    return Text(said, spec=spec) if isinstance(said, str) else Bullets(said, spec=spec)
