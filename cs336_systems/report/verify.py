"""`report --verify WRITEUP.md RESULTS...`: every table of a write-up made again from the result files
and compared whole, or what differs named.

Each table of a Markdown write-up is preceded by its spec (an HTML comment, spec.spec_comment): the
tool, its source files, the settings every row shares, the label columns, per value column the field,
its format and the keys that pick the row, the builder's title and caption, and each table row's
labels. From the rows of the sources that have those settings and labels, the table is built again by
the builder's own code (grid.grid, or the function a rebuilt table's spec names), laid out by the
report's own Markdown writer and read back by the one parser (markdown_tables.py); its heading,
caption, spec, columns and every row must then read as the write-up's. A row deleted, duplicated or
relabelled, a heading or caption that says otherwise, a spec edited with its cells, a number changed
anywhere a table renders (indented, in a blockquote) is a failure; so is a table of numbers with no
spec, a source not given, or a heading, caption or column header that names a precision, compile
setting or pass (or, in a header, a key of another column) that its rows do not have.
"""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pandas as pd

from ..argtypes import PRECISIONS
from ..config import PASS_TYPES
from .document import Table
from .fields import derive, label_text
from .grid import FoldedRows, grid, matches
from .markdown import table_markdown
from .markdown_tables import ParsedTable, parse_tables
from .sentences import check_sentences
from .spec import Spec, Value

__all__ = ["parse_tables", "verify"]

# Words a heading, caption or header may use to say which rows a table shows: each must be true of them
# ("forward" is also a phase of every pass: a title may name it over train-step rows).
CLAIMS = {"precision": PRECISIONS, "compile": ("eager", "compiled"), "pass_type": PASS_TYPES[1:]}


def rebuilders() -> dict:
    from .observed import rebuild_monitor
    from .summary import REBUILD

    return {**REBUILD, "monitor": rebuild_monitor}


class NotRebuilt(ValueError):
    """The spec cannot make a table from these results (one line for the write-up's reader)."""


def rebuild(spec: Spec, frames: dict[str, pd.DataFrame]) -> tuple[Table, list[dict]]:
    """The table `spec` describes, made again from its sources' rows by the builder's code, and the
    rows behind it."""
    sources = {s: frames[s] for s in spec.sources}
    if spec.tool.startswith("rebuild:"):
        from .summary import rebuilt_table

        kind = spec.tool.removeprefix("rebuild:")
        if kind not in rebuilders():
            raise NotRebuilt(f"its spec names no known table ({kind})")
        return rebuilt_table(kind, kind, spec.title, spec.caption, sources, rebuilders()[kind]), []
    rows = derive(pd.concat(list(sources.values()), ignore_index=True), spec.tool)
    records = rows.astype(object).where(rows.notna(), None).to_dict("records")
    names, shown = [n for _, n in spec.labels], set(spec.rows)
    behind = [
        r
        for r in records
        if matches(r, spec.fixed) and tuple(label_text(n, r) for n in names) in shown and _in_a_column(r, spec.values)
    ]
    try:
        table = grid(
            pd.DataFrame(behind, columns=rows.columns),
            spec.tool,
            title=spec.title,
            caption=spec.caption,
            labels=spec.labels,
            values=spec.values,
            keep_empty=True,
        )
    except FoldedRows as exc:
        raise NotRebuilt(f"not one row's value ({exc})") from None
    except (KeyError, TypeError, ValueError) as exc:  # an unknown format or aggregate in the spec
        raise NotRebuilt(f"its spec cannot be applied ({type(exc).__name__}: {exc})") from None
    return table, behind


def _in_a_column(row: dict, values: list[Value]) -> bool:
    """Whether a column's keys pick `row` (a speedup table's rows are those of its two settings)."""
    return not values or any(matches(row, keys) for v in values for keys in (v.where, v.ratio_to) if keys is not None)


def _numbers(table: ParsedTable) -> bool:
    return any(re.search(r"\d", cell) for row in table.rows for cell in row)


def check_table(table: ParsedTable, frames: dict[str, pd.DataFrame]) -> list[str]:
    """The failures of one parsed table, each naming what differs from the table its results make."""
    where = f"line {table.line} ({table.title or 'table'})"
    spec = table.spec
    if isinstance(spec, str):
        return [f"{where}: {spec}"]
    if spec is None:
        return [f"{where}: a table of numbers with no spec: not derived from result rows"] if _numbers(table) else []
    if not spec.sources:
        return [f"{where}: its spec names no source file"]
    missing_sources = [s for s in spec.sources if s not in frames]
    if missing_sources:
        return [f"{where}: its source {missing_sources[0]} is not among the result files given"]
    try:
        rebuilt, behind = rebuild(spec, frames)
    except NotRebuilt as exc:
        return [f"{where}: {exc}"]
    expected = parse_tables(table_markdown(rebuilt))[0]
    problems = [f"{where}: {p}" for p in _spec_differences(spec, expected.spec)]
    if table.title != expected.title:
        problems.append(f"{where}: its heading reads {table.title!r}, the results' table is {expected.title!r}")
    if table.caption != expected.caption:
        problems.append(f"{where}: its caption reads {table.caption!r}, the results give {expected.caption!r}")
    problems += [f"{where}: {p}" for p in _claims(spec, behind)]
    if table.header != expected.header:
        return [*problems, f"{where}: columns {table.header} are not the results' table's {expected.header}"]
    return problems + [f"{where}: {p}" for p in _row_differences(table, expected, max(1, len(spec.labels)))]


def _spec_differences(written: Spec, made: Spec) -> list[str]:
    """Where the spec says other than the spec its rows make (its table's rows are compared apart)."""
    problems = []
    if written.labels != made.labels:  # grid labelled a setting the spec's columns fold together
        folded = [n for _, n in made.labels if n not in [m for _, m in written.labels]]
        return [
            f"its rows differ in {', '.join(folded)}, which no label or column key tells apart: not one row's value (folded)"
        ]
    for part in (f.name for f in fields(Spec) if f.name not in ("labels", "rows", "title", "caption")):
        if getattr(written, part) != getattr(made, part):
            problems.append(f"its spec's {part} {getattr(written, part)!r} are not its rows' {getattr(made, part)!r}")
    return problems


def _row_differences(table: ParsedTable, expected: ParsedTable, label_count: int) -> list[str]:
    """Each row shown that the results do not give, given but not shown, shown more often, or with a
    cell that differs from the rebuilt row's."""
    shown: dict[tuple, list[list[str]]] = {}
    made: dict[tuple, list[list[str]]] = {}
    for rows, into in ((table.rows, shown), (expected.rows, made)):
        for row in rows:
            into.setdefault(tuple(row[:label_count]), []).append(row)
    problems = []
    for key, rows in shown.items():
        label = ", ".join(key)
        if key not in made:
            problems.append(f"row '{label}': no result row has these labels")
            continue
        if len(rows) != len(made[key]):
            problems.append(f"row '{label}' is shown {len(rows)} times, the results give it {len(made[key])}")
        for got, want in zip(rows, made[key]):
            for column, a, b in zip(table.header, got, want):
                if a != b:
                    problems.append(f"row '{label}', column '{column}': shows {a!r}, the result row gives {b!r}")
    problems += [f"row '{', '.join(key)}': in the results, not in the table" for key in made if key not in shown]
    return problems


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+(?:[-.]\w+)*", text))


def _claims(spec: Spec, behind: list[dict]) -> list[str]:
    """A precision, compile setting or pass the heading or caption names that no row behind the table
    has; a column header that names a key of its field other than its own (`ctx 8` over context 16)."""
    problems = []
    said = _words(f"{spec.title} {spec.caption}")
    for name, vocabulary in CLAIMS.items():
        have = {label_text(name, row) for row in behind} - {""}
        if have and (wrong := sorted((said & set(vocabulary)) - have)):
            problems.append(f"its heading or caption says {', '.join(wrong)}; its rows are {', '.join(sorted(have))}")
    for name in {n for v in spec.values for keys in (v.where, v.ratio_to or {}) for n in keys}:
        columns = [v for v in spec.values if name in v.where or name in (v.ratio_to or {})]
        texts = {keys[name] for v in columns for keys in (v.where, v.ratio_to or {}) if name in keys} - {""}
        named = len(texts) > 1 and all(any(t in _words(v.header) for v in columns) for t in texts)
        vocabulary = set(CLAIMS.get(name, ())) | (texts if named else set())
        for value in columns:
            own = {keys[name] for keys in (value.where, value.ratio_to or {}) if name in keys}
            if wrong := sorted((_words(value.header) & vocabulary) - own):
                problems.append(
                    f"column '{value.header}' says {', '.join(wrong)}; its rows have {name} {', '.join(sorted(own))}"
                )
    return problems


def verify(writeup: Path, frames_by_file: dict[str, pd.DataFrame]) -> tuple[int, int, list[str]]:
    """(tables checked, observations checked, failures) for the Markdown write-up against the files' rows
    (by file name): its tables here, its sentences by sentences.py."""
    text = writeup.read_text(errors="replace")
    tables = parse_tables(text)
    problems = [p for table in tables for p in check_table(table, frames_by_file)]
    said, wrong = check_sentences(text, frames_by_file)
    return len(tables), said, problems + wrong
