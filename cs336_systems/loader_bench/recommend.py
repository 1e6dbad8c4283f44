"""The recommendation: the fastest loader flags whose predicted buffer fits the RAM budget."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..units import format_bytes
from .config import LOADER_FLAGS, LoaderConfig


def _normal(value):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


@dataclass(frozen=True)
class Recommendation:
    flags: dict
    samples_per_s: float  # over all epochs: total samples / total wall time
    predicted_buffer_bytes: int | None
    worker_rss_bytes: int | None
    ram_budget_bytes: int | None
    fastest_overall: dict  # flags of the fastest combination, budget or not
    excluded: int  # combinations whose predicted buffer exceeds the budget


def recommend(rows: Sequence[dict], ram_budget_bytes: int | None) -> Recommendation | None:
    """The fastest combination (total samples / total wall over its epochs) whose predicted
    buffer fits the budget. Works on records' rows or rows read back from a results file."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        if row.get("status") == "ok":
            groups.setdefault(tuple(_normal(row.get(name)) for name in LOADER_FLAGS), []).append(row)
    scored = []
    for key, group in groups.items():
        wall = sum(float(r["wall_s"]) for r in group)
        buffers = [_normal(r.get("predicted_buffer_bytes")) for r in group]
        rss = [_normal(r.get("worker_rss_bytes")) for r in group]
        scored.append(
            (
                sum(int(r["samples"]) for r in group) / wall if wall > 0 else 0.0,
                dict(zip(LOADER_FLAGS, key)),
                max((b for b in buffers if b is not None), default=None),
                max((r for r in rss if r is not None), default=None),
            )
        )
    if not scored:
        return None
    scored.sort(key=lambda item: -item[0])
    fits = [s for s in scored if ram_budget_bytes is None or s[2] is None or s[2] <= ram_budget_bytes]
    if not fits:
        return None
    best = fits[0]
    return Recommendation(
        flags=best[1],
        samples_per_s=best[0],
        predicted_buffer_bytes=best[2],
        worker_rss_bytes=best[3],
        ram_budget_bytes=ram_budget_bytes,
        fastest_overall=scored[0][1],
        excluded=len(scored) - len(fits),
    )


def recommendation_text(rec: Recommendation | None, ram_budget_bytes: int | None) -> str:
    if rec is None:
        return "no recommendation: no combination ran and fits --ram-budget"
    flags = rec.flags
    config = LoaderConfig(
        num_workers=flags["num_workers"],
        prefetch_factor=flags["prefetch_factor"],
        pin_memory=bool(flags["pin_memory"]),
        persistent_workers=bool(flags["persistent_workers"]),
        processes=flags["processes"] or 1,
        child_processes=(flags["processes"] or 1) > 1,
    )
    budget = "no budget" if ram_budget_bytes is None else f"budget {format_bytes(ram_budget_bytes)}"
    lines = [
        f"recommended: {config.flags()}",
        f"  {rec.samples_per_s:.1f} samples/s over all epochs; predicted host buffer "
        f"{format_bytes(rec.predicted_buffer_bytes)} ({budget}); measured worker RSS {format_bytes(rec.worker_rss_bytes) or 'n/a'}",
    ]
    if rec.excluded:
        lines.append(f"  {rec.excluded} faster or slower combination(s) left out: predicted buffer over the budget")
    return "\n".join(lines)
