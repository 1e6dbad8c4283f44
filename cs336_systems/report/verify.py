"""`report --verify WRITEUP.md RESULTS...`: every number of a write-up's tables re-derived from the
result files, or the cell named that is not exactly one row's value.

Each table of a Markdown write-up is preceded by its spec (an HTML comment, grid.spec_comment):
the tool, its source files, the settings every row shares, the label columns and, per value
column, the field, its format and the keys that pick the row. For each table row the rows whose
labels read as the cells do are found; each value cell must then be the formatted field of exactly
one of them (a ratio: of exactly one row on each side). A table of numbers with no spec, a source
not given, a label that names no row, a cell that two rows could fill, or a value that differs
from the row's is a failure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .fields import derive, label_text
from .grid import SPEC_MARK, FoldedRows, Spec, cell_value, matches

_COMMENT = re.compile(rf"^<!-- {SPEC_MARK} (.*) -->$")


@dataclass
class ParsedTable:
    line: int  # 1-based line of its header in the write-up
    spec: Spec | str | None  # a str: why its spec could not be read
    header: list[str]
    rows: list[list[str]]
    title: str


def split_row(line: str) -> list[str]:
    cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
    return [cell.strip().replace("\\|", "|") for cell in cells]


def parse_tables(text: str) -> list[ParsedTable]:
    tables, lines = [], text.splitlines()
    spec, title, fenced, index = None, "", False, 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (match := _COMMENT.match(line.strip())):
            try:
                spec = Spec.from_json(match.group(1).replace("-\\u002d", "--"))
            except (ValueError, KeyError, TypeError) as exc:  # a spec edited by hand
                spec = f"its spec cannot be read ({type(exc).__name__}: {exc})"
        elif not fenced and line.startswith("#"):
            title = line.lstrip("#").strip()
        elif not fenced and line.startswith("|"):
            start = index
            block = []
            while index < len(lines) and lines[index].startswith("|"):
                block.append(lines[index])
                index += 1
            body = [split_row(row) for row in block[2:]]
            tables.append(ParsedTable(start + 1, spec, split_row(block[0]), body, title))
            spec = None
            continue
        index += 1
    return tables


def _numbers(table: ParsedTable) -> bool:
    return any(re.search(r"\d", cell) for row in table.rows for cell in row)


def check_table(table: ParsedTable, frames: dict[str, pd.DataFrame]) -> list[str]:
    """The failures of one parsed table, each naming the cell."""
    where = f"line {table.line} ({table.title or 'table'})"
    spec = table.spec
    if isinstance(spec, str):
        return [f"{where}: {spec}"]
    if spec is None:
        return [f"{where}: a table of numbers with no spec: not derived from result rows"] if _numbers(table) else []
    missing_sources = [s for s in spec.sources if s not in frames]
    if missing_sources:
        return [f"{where}: its source {missing_sources[0]} is not among the result files given"]
    if not spec.sources:
        return [f"{where}: its spec names no source file"]
    if spec.tool.startswith("rebuild:"):
        return check_rebuilt(table, spec.tool.removeprefix("rebuild:"), {s: frames[s] for s in spec.sources}, where)
    rows = pd.concat([frames[s] for s in spec.sources], ignore_index=True)
    rows = derive(rows, spec.tool)
    records = rows.astype(object).where(rows.notna(), None).to_dict("records")
    candidates = [r for r in records if matches(r, spec.fixed)]
    problems = []
    headers = [h for h, _ in spec.labels] + [v.header for v in spec.values]
    if table.header != headers:
        return [f"{where}: columns {table.header} are not the spec's {headers}"]
    for cells in table.rows:
        row = dict(zip(table.header, cells, strict=False))
        members = [r for r in candidates if all(label_text(f, r) == row[h] for h, f in spec.labels)]
        label = ", ".join(row[h] for h, _ in spec.labels)
        if not members:
            problems.append(f"{where}: row '{label}': no result row has these labels")
            continue
        for value in spec.values:
            try:
                expected = cell_value(members, value, tuple(label))
            except FoldedRows as exc:
                problems.append(f"{where}: row '{label}', column '{value.header}': not one row's value ({exc})")
                continue
            except (KeyError, TypeError, ValueError) as exc:  # an unknown format or aggregate in the spec
                problems.append(
                    f"{where}: column '{value.header}': its spec cannot be applied ({type(exc).__name__}: {exc})"
                )
                continue
            if row[value.header] != expected:
                problems.append(
                    f"{where}: row '{label}', column '{value.header}': shows {row[value.header]!r}, "
                    f"the result row gives {expected!r}"
                )
    return problems


def rebuilders() -> dict:
    from .observed import rebuild_monitor
    from .summary import REBUILD

    return {**REBUILD, "monitor": rebuild_monitor}


def check_rebuilt(table: ParsedTable, kind: str, frames: dict[str, pd.DataFrame], where: str) -> list[str]:
    """A table that is not one row per cell (a column per machine): made again from its sources by
    the function its spec names, and compared cell by cell."""
    make = rebuilders().get(kind)
    if make is None:
        return [f"{where}: its spec names no known table ({kind})"]
    frame = make(frames)
    frame = frame.reset_index() if frame.index.name is not None else frame
    expected = [[str(c) for c in row] for row in frame.astype(str).itertuples(index=False)]
    header = [str(c) for c in frame.columns]
    if table.header != header:
        return [f"{where}: columns {table.header} are not the rebuilt table's {header}"]
    problems = []
    for got, want in zip(table.rows, expected, strict=False):
        for column, a, b in zip(header, got, want, strict=False):
            if a != b:
                problems.append(f"{where}: row '{got[0]}', column '{column}': shows {a!r}, the results give {b!r}")
    if len(table.rows) != len(expected):
        problems.append(f"{where}: {len(table.rows)} rows, the results give {len(expected)}")
    return problems


def verify(writeup: Path, frames_by_file: dict[str, pd.DataFrame]) -> tuple[int, list[str]]:
    """(tables checked, failures) for the Markdown write-up against the files' rows (by file name)."""
    tables = parse_tables(writeup.read_text(errors="replace"))
    problems = [p for table in tables for p in check_table(table, frames_by_file)]
    return len(tables), problems
