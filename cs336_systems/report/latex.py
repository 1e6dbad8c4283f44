"""The report as LaTeX: booktabs tables from pandas' Styler, figures as \\includegraphics.

Compiles with a standard distribution: only booktabs and graphicx beyond the article class.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .document import Block, Bullets, Document, Figure, Heading, Table, Text

PREAMBLE = r"""\documentclass[10pt]{article}
\usepackage{booktabs,graphicx}
\setlength{\textwidth}{16cm}\setlength{\oddsidemargin}{0cm}\setlength{\evensidemargin}{0cm}
\begin{document}
\raggedright\sloppy
"""
SYMBOLS = {
    "±": r"$\pm$",
    "†": r"\dag{}",
    "‡": r"\ddag{}",
    "×": r"$\times$",
    "≥": r"$\geq$",
    "≤": r"$\leq$",
    "…": r"\ldots{}",
    "–": "--",
    "—": "---",
    "→": r"$\to$",
}
_SPECIAL = {
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "\\": r"\textbackslash{}",
}


def escape(text: str) -> str:
    text = re.sub(r"[&%$#_{}~^\\]", lambda m: _SPECIAL[m.group()], str(text))
    return symbols(text)


def symbols(text: str) -> str:
    return "".join(SYMBOLS.get(ch, ch) for ch in text)


def table_latex(table: Table) -> str:
    frame = table.frame.reset_index()  # the row label becomes a plain first column
    frame.columns = [escape(c) for c in frame.columns]
    styler = frame.style.hide(axis="index").format(escape="latex")
    body = styler.to_latex(hrules=True, column_format="l" * len(frame.columns))  # booktabs rules
    body = symbols(body)
    notes = "".join(f"\\par\\footnotesize {escape(note)}\n" for note in table.footnotes)
    # shrink a table wider than the text, never enlarge a narrow one
    return (
        "\\begin{table}[!htbp]\n\\centering\n"
        f"\\caption{{{escape(table.title)}. {escape(table.caption)}}}\n"
        "\\resizebox{\\ifdim\\width>\\linewidth\\linewidth\\else\\width\\fi}{!}{%\n"
        f"{body.rstrip()}\n}}\n{notes}\\end{{table}}\n"
    )


def figure_latex(figure: Figure, directory: Path) -> str:
    path = Path(os.path.relpath(figure.path, directory)).as_posix()
    return (
        "\\begin{figure}[!htbp]\n\\centering\n"
        f"\\includegraphics[width=\\linewidth,height=0.8\\textheight,keepaspectratio]{{{path}}}\n\\caption{{{escape(figure.title)}}}\n\\end{{figure}}\n"
    )


def _paragraph(text: str) -> str:
    # `code` spans become \texttt
    parts = text.split("`")
    return "".join(escape(p) if i % 2 == 0 else f"\\texttt{{{escape(p)}}}" for i, p in enumerate(parts)) + "\n\n"


def _block(block: Block, directory: Path) -> str:
    if isinstance(block, Text):
        return _paragraph(block.text)
    if isinstance(block, Heading):
        return f"\\subsection{{{escape(block.text)}}}\n"
    if isinstance(block, Table):
        return table_latex(block)
    if isinstance(block, Figure):
        return figure_latex(block, directory)
    if isinstance(block, Bullets):
        items = "".join(f"\\item {_paragraph(item).rstrip()}\n" for item in block.items)
        return f"\\begin{{itemize}}\n{items}\\end{{itemize}}\n"
    raise TypeError(f"no LaTeX for {type(block).__name__}")


def document_latex(document: Document, directory: Path) -> str:
    out = [PREAMBLE, f"\\section*{{{escape(document.title)}}}\n", *(_paragraph(p) for p in document.paragraphs)]
    for section in document.sections:
        out.append(f"\\section{{{escape(section.title)}}}\n")
        out += [_block(block, directory) for block in section.blocks]
        out.append("\\clearpage\n" if section.page_break or len(section.tables) > 3 else "")
    out.append("\\end{document}\n")
    return "".join(out)
