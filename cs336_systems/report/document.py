"""What a report is made of, independent of its format: sections of tables and figures.

Every section builder returns `Section`s of `Table`s whose cells are already text, so the
Markdown, LaTeX and Typst writers only lay them out and never format a number themselves.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

NOISY_MARK = "†"  # CV above stats.HIGH_CV_PCT: the mean is not to be trusted alone
IMPOSSIBLE_MFU_MARK = "‡"  # above 100%: the peak it was divided by is wrong for this row
FAILURE_MARK = {"oom": "OOM", "error": "error", "timeout": "timeout", "unsupported": "n/a", "skipped": "skipped"}


@dataclass
class Table:
    """A table of text cells; `name` names its file under --tables-only."""

    name: str
    title: str
    caption: str  # says which device the numbers come from
    frame: pd.DataFrame  # strings only; the index is the row label
    footnotes: list[str] = field(default_factory=list)


@dataclass
class Figure:
    title: str
    path: Path


@dataclass
class Section:
    title: str
    problem: str | None  # the handout problem the section answers
    paragraphs: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    bullets: list[str] = field(default_factory=list)
    listings: list[str] = field(default_factory=list)  # preformatted text a tool printed, shown as written


@dataclass
class Document:
    title: str
    paragraphs: list[str]
    sections: list[Section]

    def tables(self) -> list[Table]:
        return [table for section in self.sections for table in section.tables]


def missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA or value is pd.NaT


def sig3(value: float) -> str:
    """Three significant figures, never in exponent form; whole numbers from 100 up."""
    if missing(value):
        return ""
    if value == 0:
        return "0"
    decimals = max(0, 2 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f}"


def plain(value: object) -> str:
    """A setting as written: 2, not 2.0 (a column with a missing value is read as floats)."""
    if missing(value):
        return ""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def ms_cell(mean: object, std: object = None, noisy: bool = False) -> str:
    if missing(mean):
        return ""
    text = sig3(float(mean)) + ("" if missing(std) else f" ± {sig3(float(std))}")
    return text + (f" {NOISY_MARK}" if noisy else "")


def byte_unit(values: pd.Series) -> tuple[str, int]:
    """GiB when the largest value reaches 1 GiB, else MiB: one unit per table, named in its header."""
    largest = pd.to_numeric(values, errors="coerce").max()
    return ("GiB", 2**30) if not missing(largest) and largest >= 2**30 else ("MiB", 2**20)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def device_caption(rows: pd.DataFrame) -> str:
    names = [str(n) for n in dict.fromkeys(rows.get("device_name", pd.Series(dtype=object)).dropna())]
    return f"Device: {', '.join(names)}." if names else "Device: not recorded in the results file."
