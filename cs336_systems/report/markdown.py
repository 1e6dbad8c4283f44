"""The report as Markdown: pipe tables (each after its spec comment, for --verify), PNG links."""

from __future__ import annotations

import os
from pathlib import Path

from .document import Bullets, Document, Figure, Heading, Table, Text
from .spec import spec_comment


def _pipe_safe(frame):
    """A '|' inside a cell would split it: escaped, as --verify reads it back."""
    frame = frame.map(lambda cell: str(cell).replace("|", "\\|"))
    frame.index = [str(i).replace("|", "\\|") for i in frame.index]
    frame.index.name = None if frame.index.name is None else str(frame.index.name)
    return frame


def table_markdown(table: Table, heading: bool = True) -> str:
    lines = [f"#### {table.title}", ""] if heading else []
    if table.caption:
        lines += [f"*{table.caption}*", ""]
    if table.spec is not None:
        lines.append(spec_comment(table.spec))
    frame = _pipe_safe(table.frame)
    frame.index.name = table.frame.index.name
    lines += [frame.to_markdown(disable_numparse=True, index=table.frame.index.name is not None), ""]
    lines += [*(f"{note}  " for note in table.footnotes), ""] if table.footnotes else []
    return "\n".join(lines)


def figure_markdown(figure: Figure, directory: Path) -> str:
    return f"![{figure.title}]({Path(os.path.relpath(figure.path, directory)).as_posix()})\n"


def document_markdown(document: Document, directory: Path) -> str:
    lines = [f"# {document.title}", "", *(line for p in document.paragraphs for line in (p, ""))]
    for section in document.sections:
        lines += [f"## {section.title}", ""]
        for block in section.blocks:
            if isinstance(block, Text):
                lines += [block.text, ""]
            elif isinstance(block, Heading):
                lines += [f"### {block.text}", ""]
            elif isinstance(block, Table):
                lines.append(table_markdown(block, heading=True))
            elif isinstance(block, Figure):
                lines.append(figure_markdown(block, directory))
            elif isinstance(block, Bullets):
                lines += [*(f"- {item}" for item in block.items), ""]
    return "\n".join(lines).rstrip("\n") + "\n"
