"""python -m cs336_systems.allreduce_bench: the flags and main."""

from __future__ import annotations

import argparse
import sys

from ..argtypes import (
    ArgumentParser,
    add_memory_limit_argument,
    exit_status,
    step_count,
    warmup_count,
)
from ..command import Command, add_argument_with_aliases
from ..distributed import LaunchError
from ..distributed.driver import launch_from_args, launch_parser, run_rows
from ..results import ResultSink, check_output_path, check_output_paths
from .plot import plot_bandwidth
from .record import AllReduceRecord, describe, record_for
from .worker import AllReduceUnit, allreduce_worker, parse_size

DEFAULT_SIZES = ("1MB", "10MB", "100MB", "1GB")


def build_parser() -> ArgumentParser:
    parser = launch_parser(
        "allreduce_bench", "time torch.distributed.all_reduce by world size and size", default_timeout_s=300.0
    )
    add_argument_with_aliases(
        parser,
        "--sizes",
        "--size",
        nargs="+",
        type=parse_size,
        default=[parse_size(s) for s in DEFAULT_SIZES],
        metavar="SIZE",
        help=f"bytes per rank: 1MB = 1e6 bytes, 1MiB = 2^20 (default {' '.join(DEFAULT_SIZES)})",
    )
    parser.add_argument("--warmup-steps", type=warmup_count, default=5, help="untimed-for-statistics all-reduces")
    parser.add_argument("--measure-steps", type=step_count, default=20, help="measured all-reduces")
    add_memory_limit_argument(
        parser,
        help="CPU only: address space each rank may still map after joining the group "
        "(e.g. 512MiB); emulates a smaller machine, so a size that does not fit is an 'oom' row",
    )
    parser.add_argument("--plot", metavar="PATH.png", help="bandwidth against size, a line per world size")
    return parser


def run(args: argparse.Namespace) -> int:
    launch = launch_from_args(args)
    if args.memory_limit is not None and launch.first_device.type != "cpu":
        raise LaunchError("--memory-limit caps CPU address space (RLIMIT_AS); it cannot be used with nccl or CUDA")
    if args.plot and launch.rank0:
        check_output_path(args.plot, "--plot")
    sink = ResultSink(check_output_paths(args.output) if launch.rank0 else [], AllReduceRecord)

    units = [
        AllReduceUnit(size, size_bytes, args.warmup_steps, args.measure_steps, args.memory_limit)
        for size, size_bytes in args.sizes
    ]
    records = run_rows(
        launch, allreduce_worker, lambda world_size, first: units, record_for, sink.write, describe, AllReduceRecord
    )
    if not records:  # a torchrun rank other than 0
        return 0
    rows = [record.to_row() for record in records]
    print(AllReduceRecord.markdown(rows))
    if args.plot:
        plot_bandwidth(rows, args.plot)
    for path in [*args.output, *([args.plot] if args.plot else [])]:
        print(f"wrote {path}", file=sys.stderr)
    return exit_status([record.status for record in records])


main = Command(build_parser, run)
