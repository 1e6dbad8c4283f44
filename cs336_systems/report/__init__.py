"""python -m cs336_systems.report: a write-up (Markdown, LaTeX, Typst, PDF) from result files.

  load.py          reads the files and tells each tool's rows apart
  fields.py        what tells rows apart (each tool's identity) and how a label reads
  grid.py          tables where each cell is one row's value; spec.py the spec --verify rebuilds them from
  benchmark.py, attention.py, distributed.py, observed.py   tables and observations per kind of row
  summary.py       where each result was measured (a column per machine)
  document.py      blocks of text and tables; markdown.py, latex.py, typst_source.py lay them out
  plots.py         the figures; build.py puts the document together
  verify.py        checks a write-up: each table read back (markdown_tables.py), made again and compared
  cli.py           the command (a handout plan among the results: the handout writes it up)

The sections and formats: docs/sweeps.md; the flags: --help.
"""
