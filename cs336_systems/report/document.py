"""What a report is made of, independent of its format: sections holding blocks in reading order
(text, sub-headings, tables, figures, bullet lists).

Every section builder returns blocks whose cells are already text, so the Markdown, LaTeX and
Typst writers only lay them out and never format a number themselves.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

NOISY_MARK = "†"  # noisy: the spread of the statistic shown is above stats.NOISY_PCT (stats.NOISE)
IMPOSSIBLE_MFU_MARK = "‡"  # above 100%: the peak it was divided by is wrong for this row
FAILURE_MARK = {"oom": "OOM", "error": "error", "timeout": "timeout", "unsupported": "n/a", "skipped": "skipped"}


@dataclass
class Table:
    """A table of text cells; `name` names its file under --tables-only; `spec` (grid.Spec) says
    which row and field each cell shows, for `report --verify`."""

    name: str
    title: str
    caption: str  # what the rows share and which file they come from
    frame: pd.DataFrame  # strings only; the index is the first label column
    footnotes: list[str] = field(default_factory=list)
    spec: Any = None


@dataclass
class Figure:
    title: str
    path: Path


@dataclass
class Text:
    text: str  # `code` spans are kept as code
    spec: Any = None  # an observation's (spec.ClaimSpec), for `report --verify`


@dataclass
class Heading:
    text: str  # a part of a problem: "(b) Forward, backward and optimizer step"


@dataclass
class Bullets:
    items: list[str]
    spec: Any = None  # observations' (spec.ClaimSpec), for `report --verify`


Block = Table | Figure | Text | Heading | Bullets


@dataclass
class Section:
    title: str
    problem: str | None = None  # the handout problem the section answers
    blocks: list[Block] = field(default_factory=list)
    page_break: bool = False  # start the next section on a new page (PDF)

    def add(self, *blocks: Block | None) -> Section:
        self.blocks += [b for b in blocks if b is not None]
        return self

    @property
    def tables(self) -> list[Table]:
        return [b for b in self.blocks if isinstance(b, Table)]


@dataclass
class Document:
    title: str
    paragraphs: list[str]
    sections: list[Section]

    def tables(self) -> list[Table]:
        return [table for section in self.sections for table in section.tables]


def missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA or value is pd.NaT


def times(value: float) -> str:
    """A ratio as 'N.NNx': two decimals, two significant figures below 0.1x (0.0038x, never 0.00x)."""
    if 0 < abs(value) < 0.1:
        return f"{value:#.2g}x"  # "#": 0.10x keeps its second figure
    return f"{value:.2f}x" if value < 10 else f"{value:.1f}x"


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


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def byte_unit(values: pd.Series) -> str:
    """GiB when the largest value reaches 1 GiB, MiB from 1 MiB, else KiB: one unit per column."""
    largest = pd.to_numeric(values, errors="coerce").max()
    if missing(largest) or largest < 2**20:
        return "KiB"
    return "GiB" if largest >= 2**30 else "MiB"
