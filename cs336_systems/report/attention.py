"""Tables of `attention_bench` rows: forward and backward time and memory per head dimension and
sequence length, one implementation against another, FlashAttention against PyTorch."""

from __future__ import annotations

import pandas as pd

from .document import byte_unit
from .fields import label_text
from .grid import Value, grid

SHAPE = [("d", "head_dim"), ("seq", "context_length")]


def implementations(frame: pd.DataFrame) -> list[str]:
    """Flash implementations first (the student's), then PyTorch's."""
    found = list(dict.fromkeys(label_text("implementation", r) for r in frame.to_dict("records")))
    return sorted(found, key=lambda name: not name.startswith("flash"))


def timing_table(frame: pd.DataFrame, title: str, phases=("forward", "backward", "end_to_end")) -> pd.DataFrame:
    """One row per (implementation, d, seq): each phase's median (IQR) ms, and what it held before backward."""
    values = [Value(f"{p.replace('_', '-')} (ms)", f"{p}_median_ms", "ms") for p in phases]
    column = "memory_before_backward_bytes"
    if column in frame.columns and pd.to_numeric(frame[column], errors="coerce").notna().any():
        unit = byte_unit(frame[column])
        values.append(Value(f"held before backward ({unit})", column, unit))
    frame = frame.assign(_order=frame["implementation"].map({n: i for i, n in enumerate(implementations(frame))}))
    frame = frame.sort_values("_order", kind="stable").drop(columns="_order")
    return grid(
        frame,
        "attention_bench",
        title=title,
        caption="Median (interquartile range) of the measured passes, ms",
        labels=[("implementation", "implementation"), *SHAPE],
        values=values,
    )


def versus_table(
    frame: pd.DataFrame, base: str, other: str, title: str, phases=("forward", "backward"), times: bool = True
):
    """Per shape, each phase's speedup base time / other time (above 1x: other is faster), with both
    times beside it unless `times` is False."""
    pick, against = {"implementation": base}, {"implementation": other}
    values = []
    for phase in phases:
        name, field = phase.replace("_", "-"), f"{phase}_median_ms"
        if times:
            values += [
                Value(f"{base} {name} (ms)", field, "ms", where=pick),
                Value(f"{other} {name} (ms)", field, "ms", where=against),
            ]
        values.append(Value(f"{name} speedup" if times else name, field, "ratio", where=pick, ratio_to=against))
    caption = f"Median (interquartile range) ms; speedup = {base} median / {other} median" if times else ""
    caption = caption or f"Speedup = {base} median / {other} median: above 1x, {other} is faster"
    return grid(frame, "attention_bench", title=title, caption=caption, labels=list(SHAPE), values=values)


def speedup_only_table(frame: pd.DataFrame, base: str, other: str, title: str):
    """Only the ratios, forward / backward / end-to-end, per shape."""
    return versus_table(frame, base, other, title, ("forward", "backward", "end_to_end"), times=False)
