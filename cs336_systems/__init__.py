"""cs336-bench: a benchmarking harness for Transformer language models (CS336 assignment 2), the package cs336_systems."""

__version__ = "0.1.0"

from .tools import import_ours_first  # noqa: E402

import_ours_first()
