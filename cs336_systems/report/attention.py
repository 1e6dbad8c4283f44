"""Sections from `attention_bench` rows: eager attention, compiled attention, FlashAttention."""

from __future__ import annotations

import pandas as pd

from ..results.markdown import row_warnings
from ..stats import is_noisy
from .document import FAILURE_MARK, NOISY_MARK, Section, Table, byte_unit, device_caption, missing, ms_cell, sig3, slug

LABELS = ("implementation", "head_dim", "context_length", "batch_size", "precision")
SPLIT = ("device_name", "precision", "batch_size")


def _cell(row: pd.Series, phase: str) -> str:
    if row["status"] != "ok" and missing(row.get(f"{phase}_mean_ms")):
        return FAILURE_MARK.get(row["status"], str(row["status"]))
    cv = row.get(f"{phase}_cv_pct")
    return ms_cell(
        row.get(f"{phase}_mean_ms"), row.get(f"{phase}_std_ms"), is_noisy(None if missing(cv) else float(cv))
    )


def _shape(row) -> str:
    return f"{row['head_dim']} × {row['context_length']}"


def _split(frame: pd.DataFrame):
    keys = [k for k in SPLIT if k in frame.columns]
    for values, rows in frame.groupby(keys, dropna=False, sort=False):
        values = values if isinstance(values, tuple) else (values,)
        yield ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in zip(keys, values)), rows


def _footnotes(body: pd.DataFrame) -> list[str]:
    text = body.to_string()
    notes = [f"{NOISY_MARK} CV above 10%: noisy (see Notes)."] if NOISY_MARK in text else []
    return notes + (["OOM: out of memory."] if "OOM" in text else [])


def _wide(rows: pd.DataFrame, implementations: list[str], cell) -> pd.DataFrame:
    """One row per head dim × sequence length, one column per (implementation, quantity)."""
    body: dict[str, dict[str, str]] = {}
    for _, row in rows.sort_values(["head_dim", "context_length"]).iterrows():
        if row["implementation"] in implementations:
            for column, text in cell(row).items():
                body.setdefault(f"{row['implementation']} {column}", {})[_shape(row)] = text
    table = pd.DataFrame(body).fillna("")
    table.index.name = "d_head × seq"
    return table


def timing_table(name: str, rows: pd.DataFrame, implementations: list[str], where: str) -> Table:
    body = _wide(rows, implementations, lambda r: {"fwd (ms)": _cell(r, "forward"), "bwd (ms)": _cell(r, "backward")})
    return Table(slug(f"{name} {where}"), f"{name}: {where}", device_caption(rows), body, _footnotes(body))


def memory_table(rows: pd.DataFrame, implementations: list[str], where: str) -> Table | None:
    column = "memory_before_backward_bytes"
    if column not in rows or rows[column].notna().sum() == 0:
        return None
    unit, scale = byte_unit(rows[column])

    def cell(row):
        failed = row["status"] != "ok" and missing(row[column])
        return {f"({unit})": FAILURE_MARK.get(row["status"], "") if failed else sig3(row[column] / scale)}

    body = _wide(rows, implementations, cell)
    heading = f"Memory held before backward ({unit}): {where}"
    return Table(slug(heading), heading, device_caption(rows), body, _footnotes(body))


def speedup_table(rows: pd.DataFrame, base: str, other: str, where: str) -> Table | None:
    """base time / other time, forward and backward, per shape where both ran."""
    ok = rows[rows["status"] == "ok"].set_index(["head_dim", "context_length"])
    left, right = ok[ok["implementation"] == base], ok[ok["implementation"] == other]
    both = left.index.intersection(right.index)
    if both.empty:
        return None
    body = pd.DataFrame(index=[f"{d} × {n}" for d, n in both])
    for phase in ("forward", "backward"):
        ratio = left.loc[both, f"{phase}_mean_ms"].to_numpy() / right.loc[both, f"{phase}_mean_ms"].to_numpy()
        body[f"{phase} speedup"] = ["" if missing(x) else f"{x:.2f}x" for x in ratio]
    body.index.name = "d_head × seq"
    heading = f"Speedup of {other} over {base}: {where}"
    return Table(slug(heading), heading, device_caption(rows), body)


def sections(frame: pd.DataFrame) -> tuple[list[Section], list[str]]:
    implementations = list(dict.fromkeys(frame["implementation"].astype(str)))
    flash = [i for i in implementations if i.startswith("flash")]
    pytorch = [i for i in implementations if i not in flash]
    eager = [i for i in pytorch if i != "compiled"]
    attention, compiled, flash_section = (
        Section(
            "Attention",
            "pytorch_attention",
            [
                "Forward and backward time of attention alone, per head dimension × sequence length "
                "(ms, 3 significant figures); OOM marked."
            ],
        ),
        Section("torch.compile of attention", "torch_compile", ["Speedup = eager time / compiled time."]),
        Section(
            "FlashAttention against PyTorch attention",
            "flash_benchmarking",
            ["Speedup = PyTorch time / FlashAttention time."],
        ),
    )
    for where, rows in _split(frame):
        if pytorch:
            attention.tables.append(timing_table("Attention", rows, pytorch, where))
            if table := memory_table(rows, eager, where):
                attention.tables.append(table)
        for base in ("naive", "sdpa"):
            if "compiled" in pytorch and (table := speedup_table(rows, base, "compiled", where)):
                compiled.tables.append(table)
                break
        if flash:
            flash_section.tables.append(timing_table("FlashAttention", rows, flash + eager, where))
            for impl in flash:
                flash_section.tables += [t for base in eager if (t := speedup_table(rows, base, impl, where))]
    records = frame.astype(object).where(frame.notna(), None).to_dict("records")
    notes = [line for row in records for line in row_warnings(row, [c for c in LABELS if c in frame.columns])]
    return [s for s in (attention, compiled, flash_section) if s.tables], notes
