"""python -m cs336_systems.find_max: the largest batch size or context length that runs.

Doubles the value from --start until a probe runs out of memory (or --max is reached),
then bisects between the last value that ran and the first that did not, until they are
--resolution apart. Each probe is one configuration in a fresh child process (as in
run_benchmarks), so a failed allocation cannot leave the next probe a fragmented heap.
Every probe is a row in --output; the answer is printed and written to --summary.

Example:
    python -m cs336_systems.find_max --dimension batch-size --model-size xl --context-length 512 \
        --pass-type train-step --precision bf16 --output results/find_max_xl.csv
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cs336_systems.benchmark import build_parser as build_benchmark_parser
from cs336_systems.benchmark import config_from_args
from cs336_systems.cli import fail, positive_int
from cs336_systems.models import ConfigError, ModelFactoryError, load_model_factory
from cs336_systems.monitor import check_monitor_arguments, monitored
from cs336_systems.results import ResultFileError, ResultSink, check_output_paths, collect_environment
from cs336_systems.runner import BenchmarkConfig, DeviceError, resolve_device
from cs336_systems.sweep import add_child_arguments, child_limits_from_args, describe, run_in_child

PROG = "python -m cs336_systems.find_max"
DIMENSIONS = {"batch-size": "batch_size", "context-length": "context_length"}


@dataclass
class Search:
    dimension: str
    largest_ok: int | None = None
    smallest_oom: int | None = None
    stopped_because: str = ""
    probes: list[tuple[int, str]] = field(default_factory=list)


def probe_config(base: BenchmarkConfig, dimension: str, value: int) -> BenchmarkConfig:
    if dimension == "context-length":
        return base.replace(context_length=value, model=base.model.replace(context_length=value))
    return base.replace(batch_size=value)


def search(probe, start: int, maximum: int, resolution: int, dimension: str) -> Search:
    """`probe(value)` returns a status. Doubling, then bisection on 'ok' / 'oom'."""
    result = Search(dimension)

    def run(value: int) -> str:
        status = probe(value)
        result.probes.append((value, status))
        if status == "ok":
            result.largest_ok = value
        elif status == "oom":
            result.smallest_oom = value
        return status

    value = start
    while True:
        status = run(value)
        if status != "ok":
            break
        if value >= maximum:
            result.stopped_because = f"reached --max {maximum} without running out of memory"
            return result
        value = min(2 * value, maximum)
    if status != "oom":
        result.stopped_because = f"probe {value} ended with status {status!r}, not 'oom': search stopped"
        return result
    if result.largest_ok is None:
        result.stopped_because = f"even --start {start} runs out of memory"
        return result
    while result.smallest_oom - result.largest_ok > resolution:
        status = run((result.largest_ok + result.smallest_oom) // 2)
        if status not in ("ok", "oom"):
            result.stopped_because = f"a probe ended with status {status!r}: search stopped"
            return result
    result.stopped_because = f"boundary found to within --resolution {resolution}"
    return result


def main(argv: list[str] | None = None) -> int:
    parser = build_benchmark_parser()
    parser.prog, parser.description = PROG, __doc__.split("\n")[0]
    parser.add_argument("--dimension", choices=tuple(DIMENSIONS), required=True)
    parser.add_argument("--start", type=positive_int, help="first value probed (default: 1 for batch, 128 for context)")
    parser.add_argument("--max", type=positive_int, default=1 << 20, help="largest value probed")
    parser.add_argument("--resolution", type=positive_int, default=1, help="stop when ok and oom are this close")
    parser.add_argument("--summary", type=Path, help="write the answer as JSON here")
    add_child_arguments(parser)
    parser.set_defaults(warmup_steps=1, measure_steps=1)
    args = parser.parse_args(argv)
    try:
        device = resolve_device(args.device)
        if args.model_factory:
            load_model_factory(args.model_factory)
        start = args.start or (1 if args.dimension == "batch-size" else 128)
        args.context_length = start if args.dimension == "context-length" else args.context_length
        base = config_from_args(args).replace(device=str(device))
        limits = child_limits_from_args(args, device)
        sink = ResultSink(check_output_paths(args.output))
        check_monitor_arguments(args)  # --monitor comes with the benchmark flags
    except (ConfigError, DeviceError, ModelFactoryError, ResultFileError, ValueError) as exc:
        return fail(PROG, str(exc))

    env = collect_environment(device)

    def probe(value: int) -> str:
        config = probe_config(base, args.dimension, value)
        record = run_in_child(config, limits, env)
        sink.write(record)
        print(f"  {args.dimension} {value}: {record.status} ({describe(config)})", file=sys.stderr, flush=True)
        return record.status

    with monitored(args.monitor, args.monitor_interval):
        result = search(probe, start, args.max, args.resolution, args.dimension)
    print(f"largest {args.dimension} that runs: {result.largest_ok}")
    print(f"smallest {args.dimension} that runs out of memory: {result.smallest_oom}")
    print(f"({result.stopped_because}; {len(result.probes)} probes)")
    if args.summary:
        args.summary.write_text(json.dumps({**asdict(result), "config": describe(base)}, indent=2) + "\n")
    return 0 if result.largest_ok is not None and "status" not in result.stopped_because else 1


if __name__ == "__main__":
    sys.exit(main())
