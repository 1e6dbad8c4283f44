"""python -m cs336_systems.allreduce_bench: time torch.distributed.all_reduce by world size and size.

  worker.py  what each rank runs for one size (and --memory-limit's cap)
  record.py  the row: AllReduceRecord, algbw and busbw, its Markdown view
  plot.py    bandwidth against size
  cli.py     the flags and main (the launch and row loop are cs336_systems.distributed.driver's)

What is measured and how to read it: docs/distributed.md; the flags: --help.
"""

from .cli import build_parser, main
from .plot import plot_bandwidth
from .record import (
    AllReduceRecord,
    bandwidths_gbps,
    bus_factor,
    record_for,
)
from .worker import AllReduceUnit, allreduce_worker, parse_size

__all__ = [
    "AllReduceRecord",
    "AllReduceUnit",
    "allreduce_worker",
    "bandwidths_gbps",
    "build_parser",
    "bus_factor",
    "main",
    "parse_size",
    "plot_bandwidth",
    "record_for",
]
