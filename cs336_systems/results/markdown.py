"""Markdown rendering of result rows: the table, the notes a reader must see, the environment.

Table headers are the records' field names, so a table parses back (files.read_markdown).
A record type says which columns, title and labels it shows (records.Record); this module
only knows how to draw rows.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from tabulate import tabulate

from ..anomalies import fast_path_flags, flag_anomalies, flag_noisy_gpu_steps
from ..stats import CONVENTIONS, NOISE
from . import plausibility
from .writing import write_whole

MARKDOWN_ENVIRONMENT = (
    "device_name",
    "device_memory_bytes",
    "torch_version",
    "cuda_version",
    "cudnn_version",
    "matmul_precision",
    "cuda_matmul_allow_tf32",
    "cudnn_allow_tf32",
    "num_threads",
    "cpu_name",
    "hostname",
    "git_commit",
    "git_dirty",
)
# Labels of a benchmark row (report and compare label rows without knowing their record type).
BENCHMARK_LABEL_COLUMNS = ("model_size", "context_length", "batch_size", "pass_type", "precision")
_SCIENTIFIC = ("max_abs_err_out", "max_abs_err_grad")  # errors of 1e-7 must not print as 0.000
_DECIMALS = {
    "tokens_per_s": 1,
    "cv_pct": 1,
    "iqr_pct": 1,
    "compile_s": 2,
    "achieved_tflops": 4,
    "peak_tflops": 4,
    "device_busy_pct": 1,
}
# Any `<name>_gib` / `<name>_mib` column not in a row shows the row's `<name>_bytes` in that unit.
_BYTE_UNITS = {"_gib": 2**30, "_mib": 2**20}


def is_missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA


_MARKUP = re.compile(r"<(?=[A-Za-z/!?])|&(?=#?\w)")  # what opens an HTML tag, comment or entity


def escape(text: str) -> str:
    """A result's text in Markdown, shown as written: a `<` that would open an HTML tag or comment and an `&`
    that would make an entity as entities (a `<script>` or a `-->` is text, not HTML), a line break as a space
    (it would end a table row); readers.read_markdown and report --verify read them back."""
    return _MARKUP.sub(lambda match: html.escape(match.group()), " ".join(str(text).splitlines()))


def escaped_fields(row: dict) -> dict:
    """`row` with its text escaped (escape), for lines that mix its fields with our own words."""
    return {name: escape(value) if isinstance(value, str) else value for name, value in row.items()}


def format_cell(name: str, value: object) -> str:
    if is_missing(value):
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.2e}" if name in _SCIENTIFIC else f"{value:.{_DECIMALS.get(name, 3)}f}"
    return str(value)


def source_field(row: dict, column: str) -> str:
    """The row's field a shown column comes from (`x_gib` shows `x_bytes`)."""
    if column in row:
        return column
    for suffix in _BYTE_UNITS:
        if column.endswith(suffix):
            return column.removesuffix(suffix) + "_bytes"
    return column


def cell_value(row: dict, column: str) -> object:
    """The row's value for a shown column; byte counts shown in GiB/MiB are computed here."""
    field = source_field(row, column)
    value = row.get(field)
    if field == column or is_missing(value):
        return value
    return float(value) / _BYTE_UNITS[column[-4:]]


def markdown_table(rows: Sequence[dict], columns: Sequence[str]) -> str:
    """Rows as a pipe table; a value that cannot be a result shows as NOT_MEASURABLE (its reason is in
    the row's notes, results/plausibility.py)."""
    body = []
    for row in rows:
        unusable = plausibility.problems(row)
        cells = [format_cell(c, cell_value(row, c)) for c in columns]
        body.append(
            [
                plausibility.NOT_MEASURABLE if source_field(row, c) in unusable else escape(cell)
                for c, cell in zip(columns, cells, strict=True)
            ]
        )
    return tabulate(body, headers=list(columns), tablefmt="github", disable_numparse=True)


def row_label(row: dict, label_columns: Sequence[str] = BENCHMARK_LABEL_COLUMNS) -> str:
    label = " ".join(f"{name}={format_cell(name, row.get(name))}" for name in label_columns if name in row)
    fast = fast_path_flags(row)  # the fast-path flags a benchmark row used
    return f"{label} {fast}" if fast else label


def row_warnings(row: dict, label_columns: Sequence[str] = BENCHMARK_LABEL_COLUMNS) -> list[str]:
    """Lines a reader must see below the table: noise, failures, caveats."""
    label = row_label(row, label_columns)
    lines = []
    if row.get("status") not in (None, "ok"):
        lines.append(f"{label}: status {row['status']}: {row.get('error') or ''}".rstrip(": "))
    rule = NOISE["median"]  # a table leads with the median
    spread = rule.spread_of(row)
    if rule.is_noisy(spread):
        lines.append(f"{label}: WARNING {rule.warning(spread)}")
    if not is_missing(row.get("notes")) and row.get("notes"):
        lines.append(f"{label}: note: {row['notes']}")
    return lines


def note_lines(rows: Sequence[dict], label_columns: Sequence[str]) -> list[str]:
    """Every row's warnings, then the rows anomalies finds slow, and the replayed GPU steps it finds noisy."""
    lines = [line for row in rows for line in row_warnings(row, label_columns)]
    slow, noisy = flag_anomalies(rows), flag_noisy_gpu_steps(rows)
    return (
        lines
        + [f"{row_label(rows[i], label_columns)}: SLOW: {why}" for i, why in sorted(slow.items())]
        + [f"{row_label(rows[i], label_columns)}: NOISY: {why}" for i, why in sorted(noisy.items())]
    )


def environment_lines(rows: Sequence[dict], names: Sequence[str] = MARKDOWN_ENVIRONMENT) -> list[str]:
    lines = []
    for name in names:
        values = sorted({format_cell(name, row.get(name)) for row in rows} - {""})
        if values:
            lines.append(f"- {name}: {escape(', '.join(values))}")
    return lines


def write_page(path: Path, *, title: str, command: str, body: Sequence[str], environment: Sequence[dict]) -> str:
    """A study's or self-check's page: title, the command that wrote it, its body lines, the
    environment. Written to `path` and returned (the scripts print it too)."""
    lines = [
        f"# {escape(title)}",
        "",
        f"Command: `{command}`",
        "",
        *body,
        "",
        "Environment:",
        "",
        *environment_lines(environment),
    ]
    text = "\n".join([*lines, ""])
    write_whole(path, text)
    return text


def render_document(
    rows: Sequence[dict],
    *,
    title: str,
    columns: Sequence[str],
    label_columns: Sequence[str],
    conventions: str = CONVENTIONS,
) -> str:
    """Title, table, per-row notes (failures, noise, caveats), environment, conventions."""
    parts = [f"# {escape(title)}", "", markdown_table(rows, columns), ""]
    notes = note_lines([escaped_fields(row) for row in rows], label_columns)
    if notes:
        parts += ["Notes:", "", *(f"- {line}" for line in notes), ""]
    env = environment_lines(rows)
    if env:
        parts += ["Environment:", "", *env, ""]
    parts.append(conventions)
    return "\n".join(parts) + "\n"


def console_table(
    rows: Sequence[dict], *, title: str, columns: Sequence[str], label_columns: Sequence[str], settings: Sequence[str]
) -> str:
    """A narrow Markdown document for a terminal: title, the `settings` every row shares in one line, a table
    of the settings that differ and the `columns` some row fills, the notes a reader must see."""
    cells = {c: {format_cell(c, cell_value(row, c)) for row in rows} for c in dict.fromkeys([*settings, *columns])}
    shared = [c for c in columns if c in settings and len(cells[c]) == 1] if len(rows) > 1 else []
    differ = [c for c in settings if len(cells[c]) > 1]
    shown = [c for c in dict.fromkeys([*differ, *columns]) if c not in shared and cells[c] != {""}]
    same = [f"every row: {', '.join(f'{c} {escape(cells[c].pop())}' for c in shared)}", ""] if shared else []
    notes = note_lines([escaped_fields(row) for row in rows], label_columns)
    lines = [f"# {escape(title)}", "", *same, markdown_table(rows, shown), *(f"- {line}" for line in notes)]
    return "\n".join(lines) + "\n"
