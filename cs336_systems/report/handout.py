"""Sections from a handout plan (handout_plan.csv of `python -m cs336_systems.handout`): what ran,
what was reduced or skipped and why, and the printed output of the tools that print their results."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..units import format_bytes
from .document import Section, Table, missing, plain

PLAN_TITLE = "Handout plan"
# tools whose result is printed text (kept by the plan in a file), and the section that shows it
PRINTED = {
    "mixed_precision_accumulation": "Mixed-precision accumulation",
    "memory_profiling": "Residuals saved for backward",
}


def _seconds(value: object) -> str:
    if missing(value):
        return ""
    value = float(value)
    return f"{value:.0f} s" if value < 120 else f"{value / 60:.1f} min"


def _bytes(value: object) -> str:
    return "" if missing(value) else format_bytes(float(value))


def plan_sections(plan: pd.DataFrame, directory: Path) -> list[Section]:
    plan = plan.sort_values("order") if "order" in plan.columns else plan
    first = plan.iloc[0]
    device = f"{first['device_name']}{' (assumed)' if str(first.get('device_assumed')) == 'True' else ''}"
    counts = plan["outcome"].value_counts()
    summary = ", ".join(f"{n} {outcome}" for outcome, n in counts.items())
    paragraphs = [
        f"Edition {plain(first['edition'])}, {first['scale']} scale, on {device}: {len(plan)} steps ({summary}). "
        "Each step is one tool's command, run in its own process; predictions are rough (time from FLOPs at a "
        "fixed share of the device's peak, memory from the estimator), the outcomes are measured."
    ]
    if first["scale"] == "small":
        paragraphs.append(
            "Small scale: every model, attention and all-reduce shape is shrunk so a CPU runs the "
            "whole plan in minutes. These numbers test the pipeline; they are not the handout's answers."
        )
    body = pd.DataFrame(
        {
            "step": plan["step"].astype(str),
            "outcome": plan["outcome"].astype(str),
            "predicted peak": plan["predicted_peak_bytes"].map(_bytes),
            "predicted time": plan["predicted_s"].map(_seconds),
            "took": plan["elapsed_s"].map(_seconds),
        }
    )
    body.index = plan["problem"].astype(str).rename("problem")
    caption = f"Device: {device}; device memory {_bytes(first.get('device_memory_bytes')) or 'unknown'}."
    table = Table("handout_plan", "Every step of the plan, in the handout's order", caption, body)
    bullets = []
    for row in plan.to_dict("records"):
        why = "; ".join(str(x) for x in (row.get("reason"), row.get("reductions")) if not missing(x) and str(x))
        reduced = " (reduced)" if row.get("plan_status") == "reduced" else ""
        command = f" Command: `{row['command']}`." if not missing(row.get("command")) and row.get("command") else ""
        bullets.append(f"{row['step']}: {row['part']}{reduced}. {why}.{command}")
    sections = [Section(PLAN_TITLE, None, paragraphs, [table], bullets=bullets)]
    for row in plan.to_dict("records"):
        name = row.get("text_output")
        path = directory / str(name) if not missing(name) and name else None
        if path is None or row["problem"] not in PRINTED or row["outcome"] != "ok" or not path.is_file():
            continue
        text = path.read_text(errors="replace").rstrip()
        sections.append(
            Section(PRINTED[row["problem"]], row["problem"], [f"Printed by `{row['command']}`."], listings=[text])
        )
    return sections
