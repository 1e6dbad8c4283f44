"""The report as Typst source, and as PDF through the `typst` package (the [pdf] extra)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from ..results import write_whole
from .document import Document, Figure, Table

# No creation date in the PDF: the same results make the same bytes.
PREAMBLE = """#set document(date: none)
#set page(paper: "a4", margin: 1.5cm)
#set text(size: 9pt)
#set heading(numbering: "1.")
#show table: set text(size: 7pt)
#set table(stroke: none, inset: (x: 4pt, y: 2.5pt))
"""
INSTALL_HINT = 'PDF output needs the typst package: pip install -e ".[pdf]"'


def string(text: object) -> str:
    """A Typst string literal: nothing in it is read as markup."""
    return json.dumps(str(text), ensure_ascii=False)


def _markup(text: str) -> str:
    # `code` spans become raw text; the rest is a string, so _ * # @ are printed as written
    parts = text.split("`")
    return " ".join(f"#{string(p)}" if i % 2 == 0 else f"#raw({string(p)})" for i, p in enumerate(parts) if p)


def table_typst(table: Table) -> str:
    frame = table.frame.reset_index()
    count = len(frame.columns)
    header = ", ".join(f"strong({string(c)})" for c in frame.columns)
    rows = ",\n    ".join(", ".join(string(cell) for cell in row) for row in frame.astype(str).itertuples(index=False))
    notes = "".join(f"#text(size: 7pt, {string(note)})\n\n" for note in table.footnotes)
    return (
        "#figure(\n  table(\n"
        f"    columns: {count}, align: (left,) + (right,) * {count - 1},\n"
        "    table.hline(),\n"
        f"    table.header({header}),\n"
        "    table.hline(stroke: 0.5pt),\n"
        f"    {rows},\n"
        "    table.hline(),\n  ),\n"
        f"  caption: {string(f'{table.title}. {table.caption}')},\n  kind: table,\n)\n{notes}"
    )


def figure_typst(figure: Figure, directory: Path) -> str:
    path = Path(os.path.relpath(figure.path, directory)).as_posix()
    return f"#figure(image({string(path)}, width: 85%), caption: {string(figure.title)})\n"


def document_typst(document: Document, directory: Path) -> str:
    out = [PREAMBLE, f"#align(center, text(size: 16pt, strong({string(document.title)})))\n\n"]
    out += [_markup(p) + "\n\n" for p in document.paragraphs]
    for section in document.sections:
        out.append(f"#heading(level: 1, {string(section.title)})\n")
        if section.problem:
            out.append(_markup(f"Handout problem: `{section.problem}`.") + "\n\n")
        out += [_markup(p) + "\n\n" for p in section.paragraphs]
        out += [table_typst(table) for table in section.tables]
        out += [figure_typst(figure, directory) for figure in section.figures]
        out += [f"- {_markup(bullet)}\n" for bullet in section.bullets]
        out += [f"#text(size: 6.5pt, raw({string(text)}, block: true))\n\n" for text in section.listings]
    return "".join(out)


def compile_pdf(source: str, output: Path) -> None:
    """Compile `source` as if it were a file beside `output`, so image paths resolve."""
    import typst  # the [pdf] extra; main() checks it is installed before anything is written

    with tempfile.NamedTemporaryFile("w", suffix=".typ", dir=output.parent, delete=False) as handle:
        handle.write(source)
    try:
        write_whole(output, typst.compile(handle.name, pdf_tags=False))  # tags triple the size; never through a link
    finally:
        os.unlink(handle.name)
