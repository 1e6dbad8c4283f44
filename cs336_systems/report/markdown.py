"""The report as Markdown: pipe tables (each after its spec comment, for --verify), PNG links."""

from __future__ import annotations

import os
from pathlib import Path

from ..results.markdown import escape
from .document import Bullets, Document, Figure, Heading, Table, Text
from .spec import spec_comment


def cell(text: object) -> str:
    """A cell as Markdown shows it (results.markdown.escape); a '|' would split it: escaped, as --verify reads it."""
    return escape(str(text)).replace("|", "\\|")


def _pipe_safe(frame):
    name = frame.index.name
    frame = frame.map(cell)
    frame.columns = [cell(c) for c in frame.columns]
    frame.index = [cell(i) for i in frame.index]
    frame.index.name = None if name is None else cell(name)
    return frame


def table_markdown(table: Table, heading: bool = True) -> str:
    lines = [f"#### {cell(table.title)}", ""] if heading else []
    if table.caption:
        lines += [f"*{cell(table.caption)}*", ""]
    if table.spec is not None:
        lines.append(spec_comment(table.spec))
    frame = _pipe_safe(table.frame)
    lines += [frame.to_markdown(disable_numparse=True, index=table.frame.index.name is not None), ""]
    lines += [*(f"{note}  " for note in table.footnotes), ""] if table.footnotes else []
    return "\n".join(lines)


def figure_markdown(figure: Figure, directory: Path) -> str:
    return f"![{figure.title}]({Path(os.path.relpath(figure.path, directory)).as_posix()})\n"


def sentences_markdown(block: Text | Bullets) -> list[str]:
    """A paragraph or a list, after its spec where it is an observation (nothing where it says nothing)."""
    lines = [block.text] if isinstance(block, Text) else [f"- {item}" for item in block.items]
    if not any(lines):
        return []
    return [*([spec_comment(block.spec)] if block.spec is not None else []), *lines, ""]


def document_markdown(document: Document, directory: Path) -> str:
    lines = [f"# {document.title}", "", *(line for p in document.paragraphs for line in (p, ""))]
    for section in document.sections:
        lines += [f"## {section.title}", ""]
        for block in section.blocks:
            if isinstance(block, (Text, Bullets)):
                lines += sentences_markdown(block)
            elif isinstance(block, Heading):
                lines += [f"### {block.text}", ""]
            elif isinstance(block, Table):
                lines.append(table_markdown(block, heading=True))
            elif isinstance(block, Figure):
                lines.append(figure_markdown(block, directory))
    return "\n".join(lines).rstrip("\n") + "\n"
