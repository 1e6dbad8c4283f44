"""Sections from `allreduce_bench`, `ddp_bench`, `loader_bench` and warmup-study rows."""

from __future__ import annotations

import pandas as pd

from ..results import ENVIRONMENT_FIELDS
from ..results.markdown import row_warnings
from .document import (
    FAILURE_MARK,
    NOISY_MARK,
    Section,
    Table,
    byte_unit,
    device_caption,
    missing,
    ms_cell,
    plain,
    sig3,
    slug,
)


def _noisy(row) -> bool:
    return not missing(row.get("cv_pct")) and float(row["cv_pct"]) > 10


def _ms(row) -> str:
    if row["status"] != "ok":
        return FAILURE_MARK.get(row["status"], str(row["status"]))
    return ms_cell(row["mean_ms"], row.get("std_ms"), _noisy(row))


def _footnotes(body: pd.DataFrame) -> list[str]:
    return [f"{NOISY_MARK} CV above 10%: noisy (see Notes)."] if NOISY_MARK in body.to_string() else []


def _records(frame: pd.DataFrame) -> list[dict]:
    return frame.astype(object).where(frame.notna(), None).to_dict("records")


def allreduce_section(frame: pd.DataFrame) -> tuple[Section, list[str]]:
    section = Section(
        "All-reduce",
        "distributed_communication_single_node",
        [
            "Time of one all-reduce (mean ± std ms) and bus bandwidth (GB/s), per world size "
            "(rows) and tensor size (columns)."
        ],
    )
    keys = [k for k in ("backend", "device", "dtype", "device_name") if k in frame.columns]
    for values, rows in frame.groupby(keys, dropna=False, sort=False):
        where = ", ".join(str(v) for v in (values if isinstance(values, tuple) else (values,)))
        sizes = rows.drop_duplicates("size_bytes").sort_values("size_bytes")["size"].tolist()
        for name, cell in (
            ("time (ms)", _ms),
            ("bus bandwidth (GB/s)", lambda r: _ms(r) if r["status"] != "ok" else sig3(r["busbw_gbps"])),
        ):
            body = pd.DataFrame(index=sorted(rows["world_size"].unique()), columns=sizes, dtype=object)
            for _, row in rows.iterrows():
                body.loc[row["world_size"], row["size"]] = cell(row)
            body = body.fillna("")
            body.index.name = "world size"
            heading = f"All-reduce {name}: {where}"
            section.tables.append(Table(slug(heading), heading, device_caption(rows), body, _footnotes(body)))
    notes = [line for row in _records(frame) for line in row_warnings(row, ["backend", "world_size", "size"])]
    return section, notes


DDP_COLUMNS = {  # column -> header; a column is shown when the file has it filled
    "strategy": "strategy",
    "world_size": "ranks",
    "bucket_cap_mb": "bucket (MB)",
    "model": "model",
    "context_length": "ctx",
    "batch_size": "batch/rank",
    "precision": "precision",
    "step": "step (ms)",
    "comm_ms": "comm (ms)",
    "comm_pct": "comm (%)",
    "samples_per_s": "samples/s",
    "scaling_efficiency": "scaling eff. (%)",
}


def ddp_section(frame: pd.DataFrame) -> tuple[Section, list[str]]:
    """One table row per result row: strategies are never folded together."""
    section = Section(
        "Data-parallel training",
        "naive_ddp_benchmarking",
        [
            "Step time per strategy and world size, one row per measured configuration; comm is the "
            "communication time the strategy exposes (see comm_method in the results)."
        ],
    )
    memory_columns = [
        c for c in frame.columns if c.endswith("_bytes") and c not in ENVIRONMENT_FIELDS and frame[c].notna().any()
    ]
    for device, rows in frame.groupby("device_name", dropna=False, sort=False):
        body = []
        for _, row in rows.iterrows():
            model = row["model_size"] if row["model_size"] != "custom" else f"d{row['d_model']} L{row['num_layers']}"
            cells = {
                "strategy": row["strategy"],
                "world_size": row["world_size"],
                "model": model,
                "bucket_cap_mb": plain(row.get("bucket_cap_mb")),
                "step": _ms(row),
                "comm_ms": sig3(row.get("comm_ms")),
                "comm_pct": sig3(row.get("comm_pct")),
                "samples_per_s": sig3(row.get("samples_per_s")),
                "scaling_efficiency": sig3(100 * row["scaling_efficiency"])
                if not missing(row.get("scaling_efficiency"))
                else "",
            }
            for column in ("context_length", "batch_size", "precision"):
                cells[column] = plain(row.get(column))
            for column in memory_columns:
                unit, scale = byte_unit(rows[column])
                cells[f"{column.removesuffix('_bytes').replace('_', ' ')} per rank ({unit})"] = (
                    "" if missing(row[column]) else sig3(row[column] / scale)
                )
            body.append(cells)
        table = pd.DataFrame(body)
        table = table[[c for c in table.columns if table[c].astype(str).ne("").any()]]
        table = table.rename(columns=DDP_COLUMNS).set_index("strategy")
        heading = f"DDP strategies: {device}"
        section.tables.append(Table(slug(heading), heading, device_caption(rows), table, _footnotes(table)))
    notes = [line for row in _records(frame) for line in row_warnings(row, ["strategy", "world_size", "bucket_cap_mb"])]
    return section, notes


LOADER_COLUMNS = {
    "storage": "storage",
    "dataset": "dataset",
    "num_workers": "workers",
    "prefetch_factor": "prefetch",
    "pin_memory": "pin",
    "batch_size": "batch",
    "epoch": "epoch",
    "samples_per_s": "samples/s",
    "predicted_samples_per_s": "predicted/s",
    "data_wait_pct": "data wait (%)",
    "verdict": "verdict",
}


def loader_section(frame: pd.DataFrame) -> tuple[Section, list[str]]:
    section = Section(
        "Input pipeline",
        None,
        [
            "loader_bench rows, one per measured epoch and configuration (not a handout problem: "
            "the pipeline feeding the step)."
        ],
    )
    for source, rows in frame.groupby("source", sort=False):
        body = pd.DataFrame(
            {
                header: [_loader_cell(row, column) for _, row in rows.iterrows()]
                for column, header in LOADER_COLUMNS.items()
                if column in rows and rows[column].notna().any()
            }
        )
        body = body.set_index(body.columns[0])
        heading = f"loader_bench: {source}"
        section.tables.append(Table(slug(heading), heading, device_caption(rows), body))
    notes = [line for row in _records(frame) for line in row_warnings(row, ["source", "storage", "num_workers"])]
    return section, notes


def _loader_cell(row, column: str) -> str:
    value = row.get(column)
    if column in ("samples_per_s", "predicted_samples_per_s", "data_wait_pct"):
        return "" if row["status"] != "ok" and column != "predicted_samples_per_s" else sig3(value)
    return plain(value)


def warmup_section(frame: pd.DataFrame) -> Section:
    """Step times after 0, 1, 2, ... warmup steps: what the first measured steps cost."""
    section = Section(
        "Warmup effect",
        "benchmarking_script",
        ["Mean ± std of the measured steps after each number of warmup steps, and the first measured step alone (ms)."],
    )
    for source, rows in frame.groupby("source", sort=False):
        body = []
        for warmup, group in rows.groupby("warmup_steps"):
            measured = group[group["measured"].astype(str).str.lower() == "true"].sort_values("step_index")["step_ms"]
            body.append(
                {
                    "warmup steps": str(warmup),
                    "measured steps": str(len(measured)),
                    "mean ± std (ms)": ms_cell(measured.mean(), measured.std()),
                    "first measured (ms)": sig3(measured.iloc[0]) if len(measured) else "",
                    "slowest (ms)": sig3(measured.max()),
                }
            )
        table = pd.DataFrame(body).set_index("warmup steps")
        heading = f"Warmup study: {source}"
        section.tables.append(Table(slug(heading), heading, device_caption(rows), table))
    return section
