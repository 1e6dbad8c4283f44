"""Sections from `benchmark` rows: end-to-end timings, mixed precision, memory, torch.compile.

Step-time tables have sizes as rows and contexts as columns, one table per (pass type,
precision, and whatever else varies: compile, attention, batch, device); cells are
"mean ± std ms" with failures marked.
"""

from __future__ import annotations

import pandas as pd

from ..anomalies import fast_path_flags, flag_anomalies
from ..models import MODEL_SIZES, SIZE_TABLES
from ..results import BenchmarkRecord
from ..results.markdown import row_label, row_warnings
from ..stats import HIGH_CV_PCT, is_noisy
from .document import (
    FAILURE_MARK,
    IMPOSSIBLE_MFU_MARK,
    NOISY_MARK,
    Section,
    Table,
    byte_unit,
    device_caption,
    missing,
    ms_cell,
    sig3,
    slug,
)

# Besides pass type and precision, a table is split by whatever of these varies.
TABLE_KEYS = ("pass_type", "precision", "compile", "attention", "batch_size", "device_name", "fast_path")
PHASES = ("forward", "backward", "optimizer")
SPEEDUPS = (
    ("precision", "fp32", "bf16"),
    ("precision", "fp32", "fp16"),
    ("precision", "fp32", "tf32"),
    ("compile", False, True),
)
NOTE_LABEL = (*BenchmarkRecord.label_columns, "device_name")  # two machines in one report: say which
NOISY_FOOTNOTE = f"{NOISY_MARK} CV above {HIGH_CV_PCT:g}%: noisy, treat the mean with care (see Notes)."


def model_label(row: dict) -> str:
    """The row label of a table: the size name, or the shape (and factory) of a custom model,
    so that two different custom models never share a row."""
    name, table = str(row.get("model_size")), str(row.get("size_table"))
    if name != "custom":
        # A size that means another shape in the other handout edition (xl) says which table.
        other = SIZE_TABLES.get(table, {}).get(name)
        return f"{name} ({table})" if other is not None and MODEL_SIZES.get(name) not in (None, other) else name
    shape = f"d{row.get('d_model')} L{row.get('num_layers')} ff{row.get('d_ff')} V{row.get('vocab_size')}"
    factory = row.get("model_factory")
    return f"{factory} {shape}" if isinstance(factory, str) and factory else f"custom {shape}"


def prepare(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.copy()
    for key in TABLE_KEYS:  # files from older versions may lack a column
        if key not in frame.columns:
            frame[key] = None
    frame["compile"] = frame["compile"].astype(str).str.lower().eq("true")
    frame["model"] = [model_label(row) for row in frame.to_dict("records")]
    # rows run with fast-path flags get tables (and titles) of their own
    frame["fast_path"] = [fast_path_flags(row) or "off" for row in frame.to_dict("records")]
    return frame


def size_order(frame: pd.DataFrame) -> list[str]:
    """Named sizes in the table's order, then other models by parameter count."""
    names = [name for sizes in SIZE_TABLES.values() for name in sizes]
    names += [f"{name} ({table})" for table, sizes in SIZE_TABLES.items() for name in sizes]
    known = [name for name in dict.fromkeys(names) if name in set(frame["model"])]
    others = frame[~frame["model"].isin(known)].sort_values("num_params", na_position="last")["model"]
    return known + list(dict.fromkeys(others))


def _noisy(row) -> bool:
    return is_noisy(None if missing(row.get("cv_pct")) else float(row["cv_pct"]))


def _failed(row) -> str | None:
    return None if row["status"] == "ok" else FAILURE_MARK.get(row["status"], str(row["status"]))


def _step_cell(rows: pd.DataFrame) -> str:
    row = rows.iloc[-1]  # the latest measurement of a configuration wins
    return _failed(row) or ms_cell(row["mean_ms"], row["std_ms"], _noisy(row))


def _mfu_cell(rows: pd.DataFrame) -> str:
    row = rows.iloc[-1]
    if _failed(row) or missing(row.get("mfu")):
        return _failed(row) or ""
    return f"{100 * row['mfu']:.1f}%" + (f" {IMPOSSIBLE_MFU_MARK}" if row["mfu"] > 1 else "")


def _pivot(rows: pd.DataFrame, sizes: list[str], cell) -> pd.DataFrame:
    contexts = sorted(rows["context_length"].unique())
    table = pd.DataFrame(index=[s for s in sizes if s in set(rows["model"])], columns=contexts, dtype=object)
    for (size, context), group in rows.groupby(["model", "context_length"]):
        table.loc[size, context] = cell(group)
    table = table.fillna("")
    table.columns = [f"ctx {c}" for c in table.columns]
    table.index.name = "model"
    return table


def varying(frame: pd.DataFrame) -> list[str]:
    return [key for key in TABLE_KEYS if key in ("pass_type", "precision") or frame[key].nunique(dropna=False) > 1]


def title(keys: list[str], values: tuple) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in zip(keys, values))


def _groups(frame: pd.DataFrame, keys: list[str]):
    for values, rows in frame.groupby(keys, dropna=False, sort=False):
        yield (values if isinstance(values, tuple) else (values,)), rows


def _footnotes(text: str) -> list[str]:
    notes = [NOISY_FOOTNOTE] if NOISY_MARK in text else []
    if IMPOSSIBLE_MFU_MARK in text:
        notes.append(
            f"{IMPOSSIBLE_MFU_MARK} MFU above 100% is impossible: the peak it divides by is wrong (see Notes)."
        )
    if "OOM" in text:
        notes.append("OOM: out of memory; n/a: unsupported on that machine.")
    return notes


def _table(name: str, heading: str, rows: pd.DataFrame, body: pd.DataFrame) -> Table:
    text = body.to_string()
    return Table(slug(name), heading, device_caption(rows), body, _footnotes(text))


def step_tables(frame: pd.DataFrame, sizes: list[str]) -> list[Table]:
    keys = varying(frame)
    return [
        _table(f"step {title(keys, values)}", title(keys, values), rows, _pivot(rows, sizes, _step_cell))
        for values, rows in _groups(frame, keys)
    ]


def phase_tables(frame: pd.DataFrame, sizes: list[str]) -> list[Table]:
    """forward / backward / optimizer / step per size and context, from the per-phase columns."""
    phases = [
        p
        for p in PHASES
        if f"{p}_ms" in frame.columns and pd.to_numeric(frame[f"{p}_ms"], errors="coerce").notna().any()
    ]
    if not phases:
        return []
    keys = varying(frame)
    tables = []
    for values, rows in _groups(frame, keys):
        body = []
        for (model, context), group in rows.groupby(["model", "context_length"], sort=False):
            row = group.iloc[-1]
            cells = {"model": model, "context": str(context)}
            for phase in phases:
                std = row.get(f"{phase}_std_ms")
                cells[f"{phase} (ms)"] = _failed(row) or ms_cell(
                    pd.to_numeric(row[f"{phase}_ms"], errors="coerce"), std
                )
            cells["step (ms)"] = _step_cell(group)
            body.append(cells)
        table = pd.DataFrame(body)
        table["order"] = table["model"].map({s: i for i, s in enumerate(sizes)})
        table = table.sort_values(["order"], kind="stable").drop(columns="order").set_index("model")
        tables.append(_table(f"phases {title(keys, values)}", f"Phases: {title(keys, values)}", rows, table))
    return tables


def mfu_tables(frame: pd.DataFrame, sizes: list[str]) -> list[Table]:
    keys = varying(frame)
    return [
        _table(f"mfu {title(keys, values)}", f"MFU (%): {title(keys, values)}", rows, _pivot(rows, sizes, _mfu_cell))
        for values, rows in _groups(frame, keys)
        if rows["status"].eq("ok").any() and "mfu" in rows and rows["mfu"].notna().any()
    ]


def speedup_tables(frame: pd.DataFrame, sizes: list[str], key: str) -> list[Table]:
    """base time / other time per (size, context), where both sides ran."""
    out = []
    ok = frame[frame["status"] == "ok"]
    for name, base, other in SPEEDUPS:
        if name != key:
            continue
        rest = [k for k in varying(frame) if k != key]
        for values, rows in _groups(ok, rest):
            base_rows, other_rows = rows[rows[key] == base], rows[rows[key] == other]
            if base_rows.empty or other_rows.empty:
                continue
            base_last = base_rows.groupby(["model", "context_length"]).last()
            other_last = other_rows.groupby(["model", "context_length"]).last()
            ratio = (base_last["mean_ms"] / other_last["mean_ms"]).dropna()
            if ratio.empty:
                continue
            noisy = base_last.apply(_noisy, axis=1).reindex(ratio.index) | other_last.apply(_noisy, axis=1).reindex(
                ratio.index
            )
            cells = pd.Series(
                [f"{x:.2f}x" + (f" {NOISY_MARK}" if n else "") for x, n in zip(ratio, noisy)], index=ratio.index
            )
            table = cells.unstack("context_length").fillna("")
            table = table.reindex([s for s in sizes if s in table.index])
            table.columns = [f"ctx {c}" for c in table.columns]
            table.index.name = "model"
            label = {True: "compiled", False: "eager"}
            heading = f"Speedup of {label.get(other, other)} over {label.get(base, base)}: {title(rest, values)}"
            out.append(_table(heading, heading, rows, table))
    return out


def memory_tables(frame: pd.DataFrame, sizes: list[str]) -> list[Table]:
    """Peak memory per size and context: forward vs train step, each precision (and checkpointing) a column."""
    if "peak_memory_bytes" not in frame.columns or frame["peak_memory_bytes"].notna().sum() == 0:
        return []
    column_keys = ["pass_type", "precision"] + (["checkpoint_blocks"] if "checkpoint_blocks" in frame.columns else [])
    tables = []
    for device, rows in frame.groupby("device_name", dropna=False, sort=False):
        unit, scale = byte_unit(rows["peak_memory_bytes"])
        body: dict[str, dict[tuple, str]] = {}
        for values, group in rows.groupby(column_keys, dropna=False, sort=False):
            values = values if isinstance(values, tuple) else (values,)
            header = " ".join(
                str(v) if k != "checkpoint_blocks" else f"ckpt {v}"
                for k, v in zip(column_keys, values)
                if not missing(v)
            )
            for (model, context), cell_rows in group.groupby(["model", "context_length"]):
                row = cell_rows.iloc[-1]
                value = row["peak_memory_bytes"]
                body.setdefault(f"{header} ({unit})", {})[(model, context)] = _failed(row) or (
                    "" if missing(value) else sig3(value / scale)
                )
        table = pd.DataFrame(body).fillna("")
        order = {s: i for i, s in enumerate(sizes)}
        table = table.loc[sorted(table.index, key=lambda mc: (order.get(mc[0], len(order)), mc[1]))]
        table.index = [f"{m} ctx {c}" for m, c in table.index]
        table.index.name = "model"
        source = (
            rows["memory_source"].dropna().iloc[0]
            if "memory_source" in rows and rows["memory_source"].notna().any()
            else None
        )
        heading = f"Peak memory ({unit}): {device}"
        tables.append(_table(heading, heading, rows, table))
        if source:
            tables[-1].footnotes.append(f"Measured as {source}.")
    return tables


def notes(frame: pd.DataFrame) -> list[str]:
    records = frame.astype(object).where(frame.notna(), None).to_dict("records")
    lines = [line for row in records for line in row_warnings(row, NOTE_LABEL)]
    lines += [f"{row_label(records[i], NOTE_LABEL)}: SLOW: {why}" for i, why in sorted(flag_anomalies(records).items())]
    lines += [note for row in records if (note := impossible_mfu_note(row))]
    return lines


def impossible_mfu_note(row: dict) -> str | None:
    """MFU above 100% cannot be: say which peak was wrong and why it may be."""
    mfu = row.get("mfu")
    if mfu is None or pd.isna(mfu) or mfu <= 1:
        return None
    why = {
        "measured": "the peak was measured by a matmul probe while the machine ran slower than during this row "
        "(a shared or throttled machine); pass --peak-tflops, or compare achieved_tflops instead",
        "user": "the --peak-tflops given is below what this row achieved",
    }.get(row.get("peak_source"), "the peak used is below what this row achieved")
    return (
        f"{row_label(row, NOTE_LABEL)}: MFU {100 * mfu:.0f}% {IMPOSSIBLE_MFU_MARK} is impossible: achieved "
        f"{row['achieved_tflops']:.4f} TFLOP/s against a peak of {row['peak_tflops']:.4f} ({row.get('peak_source')}): {why}"
    )


def sections(frame: pd.DataFrame) -> tuple[list[Section], list[str]]:
    """The benchmark sections (plots are added by the caller) and the rows' notes."""
    frame = prepare(frame)
    sizes = size_order(frame)
    timing = Section(
        "End-to-end benchmarking",
        "benchmarking_script",
        [
            "Cells are mean ± sample standard deviation of the measured steps in ms (3 significant figures); "
            "OOM = out of memory, n/a = unsupported on that machine."
        ],
        phase_tables(frame, sizes) + step_tables(frame, sizes) + mfu_tables(frame, sizes),
    )
    out = [timing]
    mixed = speedup_tables(frame, sizes, "precision")
    if mixed:
        out.append(
            Section(
                "Mixed precision",
                "benchmarking_mixed_precision",
                [
                    "Speedup = fp32 mean step time / lower-precision mean step time, same size and context; "
                    f"{NOISY_MARK}: either side is noisy."
                ],
                mixed,
            )
        )
    memory = memory_tables(frame, sizes)
    if memory:
        out.append(
            Section(
                "Memory",
                "memory_profiling",
                ["Peak memory per size and context, forward pass against the full training step, per precision."],
                memory,
            )
        )
    compiled = speedup_tables(frame, sizes, "compile")
    if compiled:
        out.append(
            Section(
                "torch.compile of the whole model",
                "torch_compile",
                ["Speedup = eager mean step time / compiled mean step time."],
                compiled,
            )
        )
    return out, notes(frame)
