"""python -m cs336_systems.report: a write-up (Markdown, LaTeX, Typst, PDF) from result files.

    python -m cs336_systems.report results/sweep.csv results/attention.csv ... \\
        --output writeup/report.md --output writeup/report.pdf [--tables-only] [--note "..."]

load.py reads the files and tells each tool's rows apart; benchmark.py, attention.py,
distributed.py and environment.py make the sections (document.py: tables of text);
markdown.py, latex.py and typst_source.py lay them out; cli.py is the command.
"""

from .benchmark import model_label, size_order
from .cli import main

__all__ = ["main", "model_label", "size_order"]
