"""The report as Markdown: pipe tables, PNG links."""

from __future__ import annotations

import os
from pathlib import Path

from .document import Document, Figure, Table


def table_markdown(table: Table, heading: bool = True) -> str:
    lines = [f"### {table.title}", ""] if heading else []
    lines += [f"*{table.caption}*", "", table.frame.to_markdown(disable_numparse=True), ""]
    lines += [*(f"{note}  " for note in table.footnotes), ""] if table.footnotes else []
    return "\n".join(lines)


def figure_markdown(figure: Figure, directory: Path) -> str:
    return f"![{figure.title}]({Path(os.path.relpath(figure.path, directory)).as_posix()})\n"


def document_markdown(document: Document, directory: Path) -> str:
    lines = [f"# {document.title}", "", *(line for p in document.paragraphs for line in (p, ""))]
    for section in document.sections:
        lines += [f"## {section.title}", ""]
        if section.problem:
            lines += [f"Handout problem: `{section.problem}`.", ""]
        lines += [line for p in section.paragraphs for line in (p, "")]
        for table in section.tables:
            lines.append(table_markdown(table, heading=table.title != section.title))
        lines += [figure_markdown(figure, directory) for figure in section.figures]
        lines += [f"- {bullet}" for bullet in section.bullets] + ([""] if section.bullets else [])
        lines += [line for text in section.listings for line in ("```text", text, "```", "")]
    return "\n".join(lines).rstrip("\n") + "\n"
