"""Tables of `benchmark` rows: phases per model, step time per context, speedups between two
settings, peak memory per context and phase, MFU, and the warmup study's runs. Each is a grid
(grid.py): one row's value per cell, the settings the rows share in the caption."""

from __future__ import annotations

import pandas as pd

from ..results.markdown import row_label, row_warnings
from ..stats import is_noise_warning
from .document import byte_unit, missing
from .fields import PHASES, label_text
from .grid import Value, grid
from .observe import maker

NOTE_LABEL = ("model_size", "context_length", "batch_size", "pass_type", "precision", "device_name")


def _filled(frame: pd.DataFrame, column: str) -> bool:
    return column in frame.columns and pd.to_numeric(frame[column], errors="coerce").notna().any()


MEDIAN_CAPTION = "Median (interquartile range) of the measured steps, ms"
STATISTIC = {
    "median": ("median_ms", "ms", MEDIAN_CAPTION),
    "mean": ("mean_ms", "ms±", "Mean ± sample standard deviation of the measured steps, ms"),
}


def phase_table(frame: pd.DataFrame, title: str, statistic: str = "median") -> pd.DataFrame:
    """forward / backward / optimizer / whole step of each (model, pass) row: the median (IQR) ms, or the
    mean ± std where the handout asks for them."""
    field, fmt, caption = STATISTIC[statistic]
    values = [Value(f"{p} (ms)", f"{p}_{field}", fmt) for p in PHASES if _filled(frame, f"{p}_{field}")]
    values.append(Value("step (ms)", field, fmt))
    return grid(
        frame,
        "benchmark",
        title=title,
        caption=caption,
        labels=[("model", "model"), ("pass", "pass_type")],
        values=values,
    )


def contexts(frame: pd.DataFrame) -> list[str]:
    numbers = sorted({int(float(c)) for c in frame["context_length"].dropna()})
    return [str(c) for c in numbers]


def context_table(frame: pd.DataFrame, title: str, field: str = "median_ms", fmt: str = "ms") -> pd.DataFrame:
    """One row per model, one column per context length."""
    values = [Value(f"ctx {c}", field, fmt, where={"context_length": c}) for c in contexts(frame)]
    unit, caption = {"ms": ("ms", MEDIAN_CAPTION), "x100": ("%", "")}.get(fmt, (fmt, ""))
    return grid(
        frame, "benchmark", title=f"{title} ({unit})", caption=caption, labels=[("model", "model")], values=values
    )


def speedup_table(frame: pd.DataFrame, key: str, base: str, other: str, title: str, labels=None) -> pd.DataFrame:
    """Both medians and their ratio (base / other: above 1x, `other` is faster), per model and pass."""
    names = {"compile": {"eager": "eager", "compiled": "compiled"}}.get(key, {})
    values = [
        Value(f"{names.get(base, base)} (ms)", "median_ms", "ms", where={key: base}),
        Value(f"{names.get(other, other)} (ms)", "median_ms", "ms", where={key: other}),
        Value("speedup", "median_ms", "ratio", where={key: base}, ratio_to={key: other}),
    ]
    return grid(
        frame,
        "benchmark",
        title=title,
        caption=f"{MEDIAN_CAPTION}; speedup = {base} median / {other} median",
        labels=labels or [("model", "model"), ("pass", "pass_type")],
        values=values,
    )


def memory_table(
    frame: pd.DataFrame, title: str, columns: list[tuple[str, dict]], labels=None, predicted: bool = False
) -> pd.DataFrame:
    """Peak memory of the rows each column's keys pick, one unit for the table; with `predicted`, the
    estimator's figure for the same row beside each."""
    unit = byte_unit(frame["peak_memory_bytes"])
    values = []
    for header, where in columns:
        values.append(Value(f"{header} ({unit})", "peak_memory_bytes", unit, where=where))
        if predicted:
            values.append(Value(f"{header} predicted ({unit})", "predicted_memory_bytes", unit, where=where))
    source = ", ".join(dict.fromkeys(str(s) for s in frame.get("memory_source", pd.Series(dtype=object)).dropna()))
    caption = "Peak memory of a step" + (f", measured as {source}" if source else "")
    return grid(
        frame,
        "benchmark",
        title=title,
        caption=caption,
        labels=labels or [("context", "context_length")],
        values=values,
    )


def peak_columns(frame: pd.DataFrame) -> list[tuple[str, dict]]:
    """One column per (pass, precision) present, forward first."""
    order = {"forward": 0, "forward-backward": 1, "train-step": 2}
    pairs = {(label_text("pass_type", r), label_text("precision", r)) for r in frame.to_dict("records")}
    pairs = sorted(pairs, key=lambda p: (p[1] != "fp32", p[1], order.get(p[0], 3)))
    return [(f"{p} {q}", {"pass_type": p, "precision": q}) for p, q in pairs]


def mfu_table(frame: pd.DataFrame, title: str) -> pd.DataFrame:
    return context_table(frame, f"{title}: MFU", field="mfu", fmt="x100")


def warmup_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The warmup study: the measured steps after each number of warmup steps (one run each)."""
    measured = {"measured": "measured"}
    values = [
        Value("measured steps", "step_ms", "count", where=measured, over="step_index"),
        Value("mean ± std (ms)", "step_ms", "mean±std", where=measured, over="step_index"),
        Value("first measured (ms)", "step_ms", "first", where=measured, over="step_index"),
        Value("later: median (range) (ms)", "step_ms", "later", where=measured, over="step_index"),
    ]
    return grid(
        frame,
        "warmup_study",
        title="Measured steps after 0, 1, 2 and 5 warmup steps",
        caption="Each number of warmup steps in a fresh process",
        labels=[("warmup steps", "warmup_steps")],
        values=values,
    )


@maker
def row_notes(rows: list[dict]) -> str:
    """Each distinct note of the rows once (noise is marked in the cells), with the rows it is on."""
    seen: dict[str, list[str]] = {}
    for row in rows:
        for line in row_warnings(row, NOTE_LABEL):
            if is_noise_warning(line):
                continue
            text = line.split(": ", 1)[1] if ": " in line else line
            seen.setdefault(text, []).append(row_label(row, ("model", "context_length", "pass_type", "precision")))
    notes = [f"{text} ({len(rows)} row{'s' * (len(rows) > 1)})" for text, rows in seen.items()]
    return f"Notes on these rows: {'; '.join(notes)}." if notes else ""


def has(frame: pd.DataFrame, column: str, value: str) -> bool:
    return column in frame.columns and any(
        label_text(column, r) == value for r in frame.to_dict("records") if not missing(r.get(column))
    )
