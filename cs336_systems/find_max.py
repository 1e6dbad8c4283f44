"""python -m cs336_systems.find_max: the largest batch size or context length that runs.

From --start, doubles the value while probes run (up to --max), or halves it while they
run out of memory (down to 1); then bisects between the largest value that ran and the
smallest that ran out of memory until they are --resolution apart. Each probe is one
configuration in a fresh child process (as in run_benchmarks), so a failed allocation
cannot leave the next probe a fragmented heap. Every probe is a row in --output; the
answer is printed and written as JSON to --summary (default: beside the first --output,
suffix .json).

Outcomes (exit status): boundary found, or --max reached without running out of memory
(0: the answer is the largest value that ran; with --max, no smallest OOM); even 1 runs
out of memory, or a probe ended in 'error'/'timeout' (1: the search stops there and says
so). Ctrl-C stops after the probe in progress (130). With --executor slurm the whole search is one
Slurm job (find_max_job.py).

Example:
    cs336-bench find_max --dimension batch-size --model-size xl --context-length 512 \
        --pass-type train-step --precision bf16 --output results/find_max_xl.csv
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from . import find_max_job
from .argtypes import EXIT_FAILED, EXIT_OK, ArgumentParser, output_path, positive_int
from .benchmark import config_from_args, configuration_parser
from .benchmark_flags import announce_size_table, check_runnable, size_table_of
from .child import add_child_arguments, check_user_model_in_child, child_limits_from_args, run_in_child
from .command import Command
from .config import BenchmarkConfig
from .device import resolve_device
from .errors import UsageError
from .executor import add_executor_arguments, settings_from_args
from .monitor import check_monitor_arguments, monitored
from .results import (
    ResultSink,
    ResultWriteError,
    check_distinct,
    check_output_path,
    check_output_paths,
    write_whole,
)
from .results.origin import TOOL
from .search import search_boundary
from .step import describe_config, describe_measurement
from .sweep import StopRequest
from .tools import prog

PROG = prog("find_max")
DIMENSIONS = {"batch-size": "batch_size", "context-length": "context_length"}


def probe_config(base: BenchmarkConfig, dimension: str, value: int) -> BenchmarkConfig:
    if dimension == "context-length":
        return base.replace(context_length=value, model=base.model.replace(context_length=value))
    return base.replace(batch_size=value)


def build_parser() -> ArgumentParser:
    parser = configuration_parser()
    parser.prog, parser.description = PROG, __doc__.split("\n")[0]
    parser.add_argument("--dimension", choices=tuple(DIMENSIONS), required=True)
    parser.add_argument("--start", type=positive_int, help="first value probed (default: 1 for batch, 128 for context)")
    parser.add_argument("--max", type=positive_int, default=1 << 20, help="largest value probed")
    parser.add_argument("--resolution", type=positive_int, default=1, help="stop when ok and oom are this close")
    parser.add_argument(
        "--summary", type=output_path, help="write the answer as JSON here (default: first --output, .json)"
    )
    add_child_arguments(parser)
    # the search as one Slurm job (find_max_job.py); its probes are not spread: each depends on the last
    add_executor_arguments(parser, kinds=("inline", "slurm"))
    parser.set_defaults(warmup_steps=1, measure_steps=1)
    return parser


def run(args: argparse.Namespace) -> int:
    if args.executor == "slurm":
        return find_max_job.run(args, build_parser(), PROG)
    settings_from_args(args)  # inline: the executor's flags are refused
    device = resolve_device(args.device)
    start = args.start or (1 if args.dimension == "batch-size" else 128)
    if start > args.max:
        raise UsageError(f"--start {start} is above --max {args.max}")
    table = size_table_of(args, [args.model_size])
    first_context = start if args.dimension == "context-length" else None  # the first probe's context
    base = config_from_args(args, table=table, context_length=first_context).replace(device=str(device))
    # its children build the model, never this process
    check_runnable(base, device, check_model_elsewhere=check_user_model_in_child)
    limits = child_limits_from_args(args, device)
    outputs = check_output_paths(args.output)
    sink = ResultSink(outputs)
    summary = args.summary or (outputs[0].with_suffix(".json") if outputs else None)
    if summary:
        summary = check_output_path(summary, "--summary")  # checked now, not after every probe ran
        monitor = Path(args.monitor) if args.monitor else None
        check_distinct(
            [
                ("--summary", summary),
                ("--monitor", monitor),
                ("--monitor (its .json)", monitor and monitor.with_suffix(".json")),
                *(("--output", path) for path in outputs),
            ]
        )
    check_monitor_arguments(args)  # --monitor comes with the benchmark flags

    searched = searched_config(base, args.dimension)
    env = None  # children record their own; the parent stays off the GPU
    stop = StopRequest()
    done: list[tuple[int, str]] = []

    def probe(value: int) -> str:
        nonlocal env
        if stop.requested:
            raise KeyboardInterrupt
        record = run_in_child(probe_config(base, args.dimension, value), limits, env)
        env = record.environment or env
        with stop.writing():
            sink.write(record)
        done.append((value, record.status))
        error = f": {record.error}" if record.error else ""
        print(f"  {args.dimension} {value}: {record.status}{error}", file=sys.stderr, flush=True)
        return record.status

    announce_size_table(table)
    print("\n".join(describe_measurement([base])), file=sys.stderr)
    print(f"{PROG}: largest {args.dimension} of {searched}, from {start}", file=sys.stderr, flush=True)
    with stop.installed(), monitored(args.monitor, args.monitor_interval):
        try:
            result = search_boundary(probe, start, args.max, args.resolution, args.dimension)
        except KeyboardInterrupt:
            saved = " and saved" if outputs else ""
            print(f"interrupted: no answer; {len(done)} probes done{saved}: {done}", file=sys.stderr)
            return stop.exit_status
        except ResultWriteError as exc:
            print(f"{PROG}: error: {exc.strerror}; no answer, {len(done)} probes done: {done}", file=sys.stderr)
            return EXIT_FAILED
    print(f"{searched}")
    print(f"largest {args.dimension} that runs: {result.largest_ok}")
    print(f"smallest {args.dimension} that runs out of memory: {result.smallest_oom}")
    print(f"({result.stopped_because}; {len(result.probes)} probes)")
    if summary:
        answer = {**asdict(result), "config": searched, "size_table": base.model.size_table, "device": str(device)}
        text = json.dumps({TOOL: "find_max", **answer}, indent=2)
        try:
            write_whole(summary, text + "\n")
        except ResultWriteError as exc:  # a full disk after all the work: the answer is printed above
            print(
                f"{PROG}: error: {exc.strerror} (the answer is printed above; every probe's row is kept)",
                file=sys.stderr,
            )
            return EXIT_FAILED
        print(f"wrote {summary}", file=sys.stderr)
    return EXIT_OK if result.complete else EXIT_FAILED


def searched_config(base: BenchmarkConfig, dimension: str) -> str:
    """The configuration with the searched value shown as '*'."""
    text = describe_config(base)
    if dimension == "context-length":
        return text.replace(f"T={base.context_length}", "T=*")
    return text.replace(f"B={base.batch_size}", "B=*")


main = Command(build_parser, run)

if __name__ == "__main__":
    main.start()
