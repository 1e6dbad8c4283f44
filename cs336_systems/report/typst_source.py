"""The report as Typst source, and as PDF through the `typst` package (the [pdf] extra).

A table wider than the portrait text column is set on a landscape page of its own, so no header
is squeezed into its neighbour's; the width is estimated from the longest cell of each column.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from .document import Bullets, Document, Figure, Heading, Table, Text

# No creation date in the PDF: the same results make the same bytes.
PREAMBLE = """#set document(date: none)
#set page(paper: "a4", margin: 1.5cm, numbering: "1")
#set text(size: 9pt)
#set par(justify: false)
#set heading(numbering: "1.1")
#show heading.where(level: 1): it => block(above: 1.4em, below: 0.8em, text(size: 12pt, it))
#show heading.where(level: 2): it => block(above: 1.1em, below: 0.6em, text(size: 10pt, it))
#show table: set text(size: 7pt)
#show figure.where(kind: table): set figure.caption(position: top)
#show figure: set block(breakable: true)
#set table(stroke: none, inset: (x: 4pt, y: 2.5pt))
"""
INSTALL_HINT = 'PDF output needs the typst package: pip install "typst>=0.14"'
PORTRAIT_MM = 180.0  # A4 less 1.5 cm margins
LANDSCAPE_MM = 267.0
CHAR_MM = 1.3  # one character of 7 pt text, about
CELL_MM = 3.0  # a cell's inset
SMALLER_FONT_FITS = 7 / 5.5  # how much wider a table fits at 5.5 pt instead of 7


def string(text: object) -> str:
    """A Typst string literal: nothing in it is read as markup."""
    return json.dumps(str(text), ensure_ascii=False)


def _markup(text: str) -> str:
    # `code` spans become raw text; the rest is a string, so _ * # @ are printed as written
    parts = text.split("`")
    return " ".join(f"#{string(p)}" if i % 2 == 0 else f"#raw({string(p)})" for i, p in enumerate(parts) if p)


WRAP_CHARS = 40  # a column with longer cells wraps (its width a share of what is left)


def _columns(frame) -> list[tuple[str, int]]:
    """(header, longest cell or header word) per column."""
    out = []
    for column in frame.columns:
        longest_word = max((len(w) for w in str(column).split()), default=0)
        longest_cell = max((len(str(c)) for c in frame[column]), default=0)
        out.append((str(column), max(longest_word, longest_cell)))
    return out


def _numeric(cells) -> bool:
    """Numbers read best right-aligned; a column of words (a status, a reason) left."""
    filled = [str(c) for c in cells if str(c)]
    return bool(filled) and sum(c[0].isdigit() or c[0] in "-+." for c in filled) * 2 >= len(filled)


def table_width_mm(table: Table) -> float:
    """The width the table needs with its long text columns wrapped at WRAP_CHARS."""
    frame = table.frame.reset_index() if table.frame.index.name is not None else table.frame
    return sum(min(chars, WRAP_CHARS) * CHAR_MM + CELL_MM for _, chars in _columns(frame))


def table_typst(table: Table) -> str:
    frame = table.frame.reset_index() if table.frame.index.name is not None else table.frame
    labels = len(table.spec.labels) if table.spec is not None and table.spec.labels else 1
    # a long text column gets the width of WRAP_CHARS characters (a share of what is left, 1fr, can be
    # nothing beside wide columns, and its words then run into the next column)
    widths = ", ".join(
        f"{WRAP_CHARS * CHAR_MM + CELL_MM:.0f}mm" if chars > WRAP_CHARS else "auto" for _, chars in _columns(frame)
    )
    align = ", ".join("right" if i >= labels and _numeric(frame[c]) else "left" for i, c in enumerate(frame.columns))
    header = ", ".join(f"strong({string(c)})" for c in frame.columns)
    rows = ",\n    ".join(", ".join(string(cell) for cell in row) for row in frame.astype(str).itertuples(index=False))
    notes = "".join(f"#text(size: 7pt, {string(note)})\n\n" for note in table.footnotes)
    body = (
        "#figure(\n  table(\n"
        f"    columns: ({widths},), align: ({align},),\n"
        "    table.hline(),\n"
        f"    table.header({header}),\n"
        "    table.hline(stroke: 0.5pt),\n"
        f"    {rows},\n"
        "    table.hline(),\n  ),\n"
        f"  caption: {string(f'{table.title}. {table.caption}')},\n  kind: table,\n)\n{notes}"
    )
    width = table_width_mm(table)
    smaller = "#show table: set text(size: 5.5pt)\n"
    if width > LANDSCAPE_MM:  # wider than a landscape page too: there, at the smaller font
        return f"#page(flipped: true)[\n{smaller}{body}]\n"
    if width > PORTRAIT_MM * SMALLER_FONT_FITS:
        return f"#page(flipped: true)[\n{body}]\n"
    if width > PORTRAIT_MM:  # a little too wide: a smaller font keeps it on the page, in the flow
        return f"#[\n{smaller}{body}]\n"
    return body


def figure_typst(figure: Figure, directory: Path) -> str:
    path = Path(os.path.relpath(figure.path, directory)).as_posix()
    return f"#figure(image({string(path)}, width: 65%), caption: {string(figure.title)})\n"


def document_typst(document: Document, directory: Path) -> str:
    out = [PREAMBLE, f"#align(center, text(size: 16pt, strong({string(document.title)})))\n\n"]
    out += [_markup(p) + "\n\n" for p in document.paragraphs]
    for section in document.sections:
        out.append(f"#heading(level: 1, {string(section.title)})\n")
        for block in section.blocks:
            if isinstance(block, Text):
                out.append(_markup(block.text) + "\n\n")
            elif isinstance(block, Heading):
                out.append(f"#heading(level: 2, {string(block.text)})\n")
            elif isinstance(block, Table):
                out.append(table_typst(block))
            elif isinstance(block, Figure):
                out.append(figure_typst(block, directory))
            elif isinstance(block, Bullets):
                out += [f"- {_markup(item)}\n" for item in block.items] + ["\n"]
        if section.page_break:
            out.append("#pagebreak()\n")
    return "".join(out)


def compile_pdf(source: str, directory: Path) -> bytes:
    """The PDF of `source` compiled as if it were a file in `directory`, so image paths resolve."""
    import typst  # the [pdf] extra; main() checks it is installed before anything is written

    with tempfile.NamedTemporaryFile("w", suffix=".typ", dir=directory, delete=False) as handle:
        handle.write(source)
    try:
        return typst.compile(handle.name, pdf_tags=False)  # tags triple the size
    finally:
        os.unlink(handle.name)
