"""python -m cs336_systems.report: a write-up (Markdown, LaTeX, Typst, PDF) from result files.

  load.py          reads the files and tells each tool's rows apart
  benchmark.py, attention.py, distributed.py, environment.py   the sections
  document.py      tables of text; markdown.py, latex.py, typst_source.py lay them out
  plots.py         the figures; build.py puts the document together; cli.py is the command

The sections and formats: docs/sweeps.md; the flags: --help.
"""

from .benchmark import model_label, size_order
from .cli import main

__all__ = ["main", "model_label", "size_order"]
