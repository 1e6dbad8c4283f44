"""A table's spec: what `report --verify` needs to make the table again from the result files alone.

The builder (grid.py) writes it before each Markdown table as an HTML comment (spec_comment); verify
reads it back with Spec.from_json. It names the tool and source files, the settings every row shares,
the label columns, each value column (a field, a format, the keys that pick its row), the builder's
title and caption words, and the label texts of each table row as built: with those, the table is
rebuilt whole and a row deleted, duplicated or relabelled in the Markdown no longer matches.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field

SPEC_MARK = "cells"  # <!-- cells {...} --> before a Markdown table: its spec
CLAIMS_MARK = "claims"  # <!-- claims {...} --> before an observation (a paragraph or a list): its spec
MAX_SPEC_DEPTH = 8  # a spec is four levels deep; json.loads of a spec nested 200,000 deep is a RecursionError


@dataclass(frozen=True)
class Value:
    """A value column: `field` of the one row that the table row's labels and `where` pick,
    shown in `fmt` (grid.FORMATS). With `ratio_to`, the cell is this row's value divided by the value
    of the row `ratio_to` picks instead of `where` (both from the same table row)."""

    header: str
    field: str
    fmt: str = "sig3"
    where: dict = field(default_factory=dict)  # field -> label text
    ratio_to: dict | None = None
    over: str | None = None  # an identity field aggregated over (the steps of one run): fmt gets those rows


@dataclass
class Spec:
    tool: str
    sources: list[str]
    fixed: dict  # field -> label text every row behind the table has
    labels: list[tuple[str, str]]  # (header, field)
    values: list[Value]
    title: str = ""
    caption: str = ""  # the builder's words; the caption shown adds the settings in `fixed` and the sources
    rows: list[tuple[str, ...]] = field(default_factory=list)  # each table row's label texts, in order

    def to_json(self) -> str:
        data = asdict(self)
        data["values"] = [
            {k: v for k, v in asdict(value).items() if v not in (None, {}, "sig3")} for value in self.values
        ]
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Spec:
        """The spec a comment holds; ValueError naming what is wrong with one edited by hand."""
        if (depth := nesting_depth(text)) > MAX_SPEC_DEPTH:
            raise ValueError(f"nested {depth} deep (a spec is at most {MAX_SPEC_DEPTH})")
        data = json.loads(text)
        missing = [name for name in ("tool", "sources", "fixed", "labels", "values") if name not in _mapping(data)]
        if missing:
            raise ValueError(f"no {missing[0]!r}")
        if "title" not in data or "rows" not in data:  # an older report's: it named cells, not the table
            raise ValueError("written by an older report (no title or rows): make the write-up again")
        values = [_value(v) for v in _list(data["values"], "values")]
        return cls(
            _text(data["tool"], "tool"),
            [_text(s, "sources") for s in _list(data["sources"], "sources")],
            _texts(data["fixed"], "fixed"),
            [_pair(label) for label in _list(data["labels"], "labels")],
            values,
            _text(data["title"], "title"),
            _text(data.get("caption", ""), "caption"),
            [tuple(_text(t, "rows") for t in _list(row, "rows")) for row in _list(data["rows"], "rows")],
        )


def spec_comment(spec: Spec | dict) -> str:
    """The spec as an HTML comment (invisible where the Markdown is rendered): a table's, or an
    observation's (a dict: observe.observations)."""
    text = spec.to_json() if isinstance(spec, Spec) else json.dumps(spec, ensure_ascii=False, separators=(",", ":"))
    # '--' may not appear inside a comment; nor is a result's '<script>' written there (JSON reads both back)
    text = re.sub(r"<(?=[A-Za-z/!?])", r"\\u003c", text.replace("--", "-\\u002d"))
    return f"<!-- {SPEC_MARK if isinstance(spec, Spec) else CLAIMS_MARK} {text} -->"


def nesting_depth(text: str) -> int:
    """How deep JSON's arrays and objects nest in `text`, counted without parsing it (strings skipped)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


# -- the shape of a spec read back: each part of the type the builder writes, or ValueError -------


def _mapping(value: object, name: str = "the spec") -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"{name} is not a JSON object")
    return value


def _list(value: object, name: str) -> list:
    if not isinstance(value, list):
        raise ValueError(f"{name!r} is not a list")
    return value


def _text(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name!r} holds {value!r}, not text")
    return value


def _texts(value: object, name: str) -> dict:
    return {_text(k, name): _text(v, name) for k, v in _mapping(value, repr(name)).items()}


def _pair(value: object) -> tuple[str, str]:
    items = _list(value, "labels")
    if len(items) != 2:
        raise ValueError(f"'labels' holds {items!r}, not (header, field)")
    return _text(items[0], "labels"), _text(items[1], "labels")


def _value(value: object) -> Value:
    data = _mapping(value, "a value column")
    unknown = set(data) - {"header", "field", "fmt", "where", "ratio_to", "over"}
    if unknown or "header" not in data or "field" not in data:
        raise ValueError(f"a value column {sorted(data)!r} is not (header, field, fmt, where, ratio_to, over)")
    ratio_to = data.get("ratio_to")
    over = data.get("over")
    return Value(
        _text(data["header"], "header"),
        _text(data["field"], "field"),
        _text(data.get("fmt", "sig3"), "fmt"),
        _texts(data.get("where", {}), "where"),
        None if ratio_to is None else _texts(ratio_to, "ratio_to"),
        None if over is None else _text(over, "over"),
    )
