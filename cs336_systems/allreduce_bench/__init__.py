"""python -m cs336_systems.allreduce_bench: time torch.distributed.all_reduce by world size and size.

Example (CPU, gloo):
    python -m cs336_systems.allreduce_bench --backend gloo --world-sizes 2 4 6 --sizes 1MB 10MB 100MB 1GB \
        --output results/allreduce.csv --output results/allreduce.md --plot results/allreduce.png

  worker.py  what each rank runs for one size (and --memory-limit's cap)
  record.py  the row: AllReduceRecord, bandwidths, its Markdown view
  plot.py    bandwidth against size
  cli.py     the flags and main (the launch and row loop are cs336_systems.distributed.driver's)

It starts its own ranks (one process each, on a free local port), or, under torchrun, is one
of the ranks (`torchrun --nproc-per-node 8 -m cs336_systems.allreduce_bench --backend nccl`).

What is measured, per (world size, size): a float32 tensor of that many bytes on every rank
(KB/MB/GB are powers of 10, KiB/MiB/GiB powers of 2), summed in place by all_reduce. One
untimed all-reduce first checks the sum. Then each step: an untimed barrier, the host clock
(device synchronised before and after, as for every timing in this harness), one all-reduce.
A step's latency is the slowest rank's; the statistics are over the measured steps.
    algbw = bytes / mean latency                  (what one rank sees, GB/s = 1e9 B/s)
    busbw = algbw * 2 (n - 1) / n                  (nccl-tests: each rank sends and receives
                                                    2 (n - 1) / n of the data in a ring all-reduce)
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
