"""A write-up's tables read back from its Markdown, as a reader sees them rendered: every block that
renders as a table (GitHub's pipe tables), with the heading, caption and spec before it.

A table is a header row, a delimiter row of as many cells (`---`, `:--:`) and the rows up to the next
blank line or block, whether its lines start with `|` or not, indented or inside `>` blockquotes and
list items; a fenced code block holds none. `report --verify` reads the write-up and the tables it
makes again with this one parser, so the two cannot be read differently.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .spec import SPEC_MARK, Spec

_COMMENT = re.compile(rf"^<!-- {SPEC_MARK} (.*) -->$")
# What a line's innermost block starts after: blockquote markers and list-item markers.
_CONTAINER = re.compile(r"^[ \t]{0,3}(?:>|[-+*](?=\s)|\d{1,9}[.)](?=\s))[ \t]?")
_DELIMITER_CELL = re.compile(r"^:?-+:?$")
_HEADING = re.compile(r"^#{1,6}(?:\s+|$)")
_FENCE = re.compile(r"^(`{3,}|~{3,})")
_CAPTION = re.compile(r"^\*(?!\s)(.*\S)\*$")


@dataclass
class ParsedTable:
    line: int  # 1-based line of its header in the write-up
    spec: Spec | str | None  # a str: why its spec could not be read
    header: list[str]
    rows: list[list[str]]
    title: str  # the heading above it
    caption: str = ""  # the italic line between that heading and the table


def content(line: str) -> str:
    """The text of `line` inside its blockquotes and list items, without indentation."""
    while match := _CONTAINER.match(line):
        line = line[match.end() :]
    return line.strip()


def split_row(text: str) -> list[str]:
    """The cells of a table row: an outer '|' on either side is optional, '\\|' is a '|' in a cell."""
    text = text.strip()
    text = text[1:] if text.startswith("|") else text
    text = text[:-1] if text.endswith("|") and not text.endswith("\\|") else text
    return [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", text)]


def _is_delimiter(text: str, header: str) -> bool:
    """Whether `text` under `header` makes the two a table's first rows."""
    if "|" not in text and "|" not in header:  # 'a' over '---' is a heading, not a table
        return False
    cells = split_row(text)
    return all(_DELIMITER_CELL.match(cell) for cell in cells) and len(cells) == len(split_row(header))


def _ends_table(text: str) -> bool:
    return not text or bool(_HEADING.match(text) or _FENCE.match(text) or text.startswith("<!--"))


def _spec(text: str) -> Spec | str:
    try:
        return Spec.from_json(text.replace("-\\u002d", "--"))
    except (ValueError, KeyError, TypeError) as exc:  # a spec edited by hand
        return f"its spec cannot be read ({type(exc).__name__}: {exc})"


def parse_tables(text: str) -> list[ParsedTable]:
    tables: list[ParsedTable] = []
    lines = [content(line) for line in text.splitlines()]
    spec, title, caption, fence, index = None, "", "", "", 0
    while index < len(lines):
        line = lines[index]
        if fence:
            fence = "" if line.startswith(fence) and not line.strip(fence[0]) else fence
        elif match := _FENCE.match(line):
            fence = match.group(1)
        elif match := _COMMENT.match(line):
            spec = _spec(match.group(1))
        elif _HEADING.match(line):
            title, caption = line.lstrip("#").strip().rstrip("#").strip(), ""
        elif match := _CAPTION.match(line):
            caption = match.group(1)
        elif (
            index + 1 < len(lines) and "|" in lines[index] + lines[index + 1] and _is_delimiter(lines[index + 1], line)
        ):
            header = split_row(line)
            start, index = index, index + 2
            body = []
            while index < len(lines) and not _ends_table(lines[index]):
                cells = split_row(lines[index])
                body.append((cells + [""] * len(header))[: len(header)])  # as rendered: padded or cut
                index += 1
            tables.append(ParsedTable(start + 1, spec, header, body, title, caption))
            spec, caption = None, ""
            continue
        index += 1
    return tables
