"""python -m cs336_systems.allreduce_bench: time torch.distributed.all_reduce by world size and size.

Example (CPU, gloo):
    python -m cs336_systems.allreduce_bench --backend gloo --world-sizes 2 4 6 --sizes 1MB 10MB 100MB 1GB \
        --output results/allreduce.csv --output results/allreduce.md --plot results/allreduce.png

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

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from cs336_systems.argtypes import ArgumentParser, fail, non_negative_int, positive_float, positive_int
from cs336_systems.device import first_line, is_out_of_memory, release_memory
from cs336_systems.distributed import (
    BACKENDS,
    DEFAULT_INIT_TIMEOUT_S,
    BarrierFirst,
    GroupResult,
    LaunchError,
    LaunchSpec,
    RankContext,
    check_launch,
    default_threads_per_rank,
    device_for,
    max_over_ranks,
    oversubscription_note,
    run_spawned,
    run_under_torchrun,
    torchrun_local_world_size,
    torchrun_rank,
    torchrun_threads_per_rank,
    torchrun_world_size,
    under_torchrun,
)
from cs336_systems.memory_cap import cap_address_space
from cs336_systems.results import (
    Environment,
    ResultFileError,
    ResultSink,
    check_output_paths,
    collect_environment,
    render_markdown,
    samples_field,
    utc_timestamp,
)
from cs336_systems.results import (
    LegacyRecord as Record,
)
from cs336_systems.stats import summarize
from cs336_systems.timing import HostTimer, device_synchronizer, time_steps
from cs336_systems.units import parse_bytes

PROG = "python -m cs336_systems.allreduce_bench"
DTYPE = torch.float32
BYTES_PER_ELEMENT = 4


@dataclass
class AllReduceRecord(Record):
    """One (world size, size) of the all-reduce benchmark."""

    backend: str
    device: str
    launcher: str
    world_size: int
    size: str  # as asked, e.g. "10MB"
    size_bytes: int  # really all-reduced: num_elements * 4
    num_elements: int
    dtype: str
    threads_per_rank: int
    warmup_steps: int
    measure_steps: int
    status: str
    error: str | None = None
    mean_ms: float | None = None
    std_ms: float | None = None
    cv_pct: float | None = None
    median_ms: float | None = None
    min_ms: float | None = None
    max_ms: float | None = None
    p10_ms: float | None = None
    p90_ms: float | None = None
    algbw_gbps: float | None = None
    busbw_gbps: float | None = None
    notes: str | None = None
    timestamp: str = field(default_factory=utc_timestamp)
    environment: Environment | None = None
    step_ms: list[float] = samples_field()  # per step, the slowest rank
    warmup_step_ms: list[float] = samples_field()
    rank_step_ms: list[list[float]] = samples_field()  # [rank][step]


MARKDOWN_COLUMNS = (
    "backend",
    "world_size",
    "size",
    "size_bytes",
    "status",
    "mean_ms",
    "std_ms",
    "cv_pct",
    "median_ms",
    "p10_ms",
    "p90_ms",
    "algbw_gbps",
    "busbw_gbps",
    "threads_per_rank",
)
LABEL_COLUMNS = ("backend", "world_size", "size")


def bus_factor(world_size: int) -> float:
    """2 (n - 1) / n: the fraction of the data each rank sends (and receives) in a ring all-reduce."""
    return 2 * (world_size - 1) / world_size


def bandwidths_gbps(size_bytes: int, seconds: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes per second)."""
    algbw = size_bytes / seconds / 1e9
    return algbw, algbw * bus_factor(world_size)


def parse_size(text: str) -> tuple[str, int]:
    """'10MB' -> ('10MB', 10_000_000): at least one float32 element, whole elements."""
    try:
        size_bytes = parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if size_bytes < BYTES_PER_ELEMENT:
        raise argparse.ArgumentTypeError(f"{text}: smaller than one float32 element ({BYTES_PER_ELEMENT} bytes)")
    return text, size_bytes


# -- what each rank runs -----------------------------------------------------------------


@dataclass(frozen=True)
class AllReduceUnit:
    size: str
    size_bytes: int
    warmup_steps: int
    measure_steps: int
    memory_limit_bytes: int | None = None  # CPU: address space each rank may still map


def allreduce_worker(ctx: RankContext, unit: AllReduceUnit) -> dict:
    """This rank's part of one size: {'status', 'error', 'warmup_ms', 'measured_ms'}."""
    if unit.memory_limit_bytes is not None:
        _cap_once(unit.memory_limit_bytes)
    tensor, error = None, None
    try:
        # filled (not torch.empty) so the pages are really allocated, on every rank
        tensor = torch.full(
            (unit.size_bytes // BYTES_PER_ELEMENT,), float(ctx.rank + 1), dtype=DTYPE, device=ctx.device
        )
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        error = first_line(exc)
    # Every rank learns whether all of them got their tensor, so none waits in an
    # all-reduce that another will never join.
    allocated = torch.tensor([0 if tensor is None else 1], dtype=torch.int32, device=ctx.device)
    dist.all_reduce(allocated, op=dist.ReduceOp.MIN)
    if not allocated.item():
        tensor = None
        release_memory(ctx.device)
        return {"status": "oom", "error": error or "another rank could not allocate its tensor"}

    def step() -> None:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)

    step()  # untimed: every element must now be 1 + 2 + ... + n
    expected = ctx.world_size * (ctx.world_size + 1) / 2
    if not bool((tensor == expected).all()):
        return {"status": "error", "error": f"all_reduce returned wrong values (expected every element = {expected:g})"}
    # Later steps keep summing in place; the values (growing, at most inf) do not change the speed.
    timer = BarrierFirst(HostTimer(synchronize=device_synchronizer(ctx.device)), ctx.barrier)
    times = time_steps(step, warmup_steps=unit.warmup_steps, measure_steps=unit.measure_steps, timer=timer)
    tensor = None
    release_memory(ctx.device)
    return {"status": "ok", "error": None, "warmup_ms": list(times.warmup_ms), "measured_ms": list(times.measured_ms)}


@functools.cache
def _cap_once(headroom_bytes: int) -> None:
    """The cap is set once per rank, after it joined the group (a cap cannot be raised again)."""
    cap_address_space(headroom_bytes)


# -- rows ------------------------------------------------------------------------------------


def record_for(
    unit: AllReduceUnit, result: GroupResult, base: dict, environment: Environment | None
) -> AllReduceRecord:
    """The row of one unit from every rank's message (or from the group's failure)."""
    world_size = base["world_size"]
    record = AllReduceRecord(
        **base,
        size=unit.size,
        size_bytes=unit.size_bytes // BYTES_PER_ELEMENT * BYTES_PER_ELEMENT,
        num_elements=unit.size_bytes // BYTES_PER_ELEMENT,
        dtype=str(DTYPE).removeprefix("torch."),
        warmup_steps=unit.warmup_steps,
        measure_steps=unit.measure_steps,
        status=result.status,
        error=result.error,
        environment=result.environment or environment,
    )
    notes = [n for n in (oversubscription_note(record.backend, world_size, record.threads_per_rank),) if n]
    if world_size == 1:
        notes.append("world size 1: no data leaves the rank, so busbw is 0 by definition")
    if result.status == "ok":
        messages = result.messages
        failed = next((m for m in messages if m["status"] != "ok"), None)
        if failed is not None:
            record.status, record.error = failed["status"], failed["error"]
        else:
            record.rank_step_ms = [m["measured_ms"] for m in messages]
            record.step_ms = max_over_ranks(record.rank_step_ms)
            record.warmup_step_ms = max_over_ranks([m["warmup_ms"] for m in messages]) if unit.warmup_steps else []
            summary = summarize(record.step_ms)
            for name, value in summary.as_dict(suffix="_ms").items():
                setattr(record, name, value)
            record.algbw_gbps, record.busbw_gbps = bandwidths_gbps(record.size_bytes, summary.mean / 1e3, world_size)
    record.notes = "; ".join(notes) or None
    return record


# -- plot --------------------------------------------------------------------------------


def plot_bandwidth(rows: Sequence[dict], path: str) -> None:
    """Bus bandwidth (solid) and algorithm bandwidth (dashed) against size, a line per world size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [row for row in rows if row.get("status") == "ok"]
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for world_size in sorted({row["world_size"] for row in ok}):
        points = sorted((row["size_bytes"], row["busbw_gbps"], row["algbw_gbps"]) for row in ok
                        if row["world_size"] == world_size)  # fmt: skip
        sizes = [p[0] for p in points]
        line = axis.plot(sizes, [p[1] for p in points], marker="o", label=f"n={world_size} busbw")[0]
        axis.plot(sizes, [p[2] for p in points], linestyle="--", color=line.get_color(), alpha=0.6,
                  label=f"n={world_size} algbw")  # fmt: skip
    backends = ", ".join(sorted({row["backend"] for row in ok}))
    devices = ", ".join(sorted({str(row.get("device_name")) for row in ok}))
    axis.set_xscale("log")
    axis.set_xlabel("all-reduce size (bytes, float32)")
    axis.set_ylabel("bandwidth (GB/s)")
    axis.set_title(f"all_reduce bandwidth: {backends} on {devices}", fontsize=9)
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


# -- command line ----------------------------------------------------------------------------


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=BACKENDS, default="gloo", help="gloo (CPU tensors) or nccl (CUDA)")
    parser.add_argument(
        "--world-sizes",
        "--world-size",
        nargs="+",
        type=positive_int,
        metavar="N",
        help="ranks per run (default: 2 for gloo, the GPU count for nccl; under torchrun, its WORLD_SIZE)",
    )
    parser.add_argument(
        "--sizes",
        nargs="+",
        type=parse_size,
        default=[parse_size(s) for s in ("1MB", "10MB", "100MB", "1GB")],
        metavar="SIZE",
        help="bytes per rank: 1MB = 1e6 bytes, 1MiB = 2^20 (default 1MB 10MB 100MB 1GB)",
    )
    parser.add_argument("--warmup-steps", type=non_negative_int, default=5, help="untimed-for-statistics all-reduces")
    parser.add_argument("--measure-steps", type=positive_int, default=20, help="measured all-reduces")
    parser.add_argument("--threads-per-rank", type=positive_int, help="CPU threads per rank (default: cores / ranks)")
    parser.add_argument("--timeout", type=positive_float, default=300.0, metavar="SECONDS",
                        help="per (world size, size): status 'timeout' after this long (300)")  # fmt: skip
    parser.add_argument("--init-timeout", type=positive_float, default=DEFAULT_INIT_TIMEOUT_S, metavar="SECONDS",
                        help="for starting the ranks and joining the group (120)")  # fmt: skip
    parser.add_argument(
        "--memory-limit",
        metavar="SIZE",
        help="CPU only: address space each rank may still map after joining the group (e.g. 512MiB); "
        "emulates a smaller machine, so a size that does not fit is an 'oom' row",
    )
    parser.add_argument("--output", action="append", default=[], metavar="PATH", help=".csv, .md or .jsonl; repeatable")
    parser.add_argument("--plot", metavar="PATH.png", help="bandwidth against size, a line per world size")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torchrun = under_torchrun()
    try:
        world_sizes = resolve_world_sizes(args.world_sizes, args.backend, torchrun)
        for world_size in world_sizes:
            check_launch(args.backend, torchrun_local_world_size() if torchrun else world_size)
        memory_limit = parse_memory_limit(args.memory_limit, args.backend)
        sink = ResultSink(check_output_paths(args.output) if not torchrun or torchrun_rank() == 0 else [],
                          fields=AllReduceRecord.row_fields(), render=render)  # fmt: skip
    except (LaunchError, ResultFileError, ValueError) as exc:
        return fail(PROG, str(exc))

    units = [AllReduceUnit(size, size_bytes, args.warmup_steps, args.measure_steps, memory_limit)
             for size, size_bytes in args.sizes]  # fmt: skip
    records = []
    for world_size in world_sizes:
        threads = args.threads_per_rank or (
            torchrun_threads_per_rank() if torchrun else default_threads_per_rank(max(world_sizes))
        )
        spec = LaunchSpec(
            args.backend, world_size, threads, init_timeout_s=args.init_timeout,
            collective_timeout_s=args.timeout + args.init_timeout,
        )  # fmt: skip
        base = dict(backend=args.backend, device=device_for(args.backend, 0).type,
                    launcher="torchrun" if torchrun else "spawn", world_size=world_size, threads_per_rank=threads)  # fmt: skip
        fallback = None if torchrun else collect_environment(device_for(args.backend, 0))
        results = (
            run_under_torchrun(allreduce_worker, units, spec)
            if torchrun
            else run_spawned(allreduce_worker, units, spec, unit_timeout_s=args.timeout)
        )
        for unit, result in results:
            record = record_for(unit, result, base, fallback)
            sink.write(record)
            records.append(record)
            print(f"n={world_size} {unit.size}: {_short(record)}", file=sys.stderr, flush=True)
    if not records:  # a torchrun rank other than 0
        return 0
    rows = [record.to_row() for record in records]
    print(render(rows))
    if args.plot:
        plot_bandwidth(rows, args.plot)
    for path in [*args.output, *([args.plot] if args.plot else [])]:
        print(f"wrote {path}", file=sys.stderr)
    return 1 if any(record.status in ("error", "timeout") for record in records) else 0


render = functools.partial(
    render_markdown, title="all_reduce benchmark", columns=MARKDOWN_COLUMNS, label_columns=LABEL_COLUMNS
)


def resolve_world_sizes(asked: list[int] | None, backend: str, torchrun: bool) -> list[int]:
    if torchrun:
        size = torchrun_world_size()
        if asked and asked != [size]:
            raise LaunchError(f"under torchrun the world size is torchrun's ({size}); drop --world-sizes {asked}")
        return [size]
    if asked:
        return asked
    if backend == "nccl" and torch.cuda.is_available():
        return [torch.cuda.device_count()]
    return [2]


def parse_memory_limit(text: str | None, backend: str) -> int | None:
    if text is None:
        return None
    if backend != "gloo":
        raise LaunchError("--memory-limit caps CPU address space (RLIMIT_AS); it cannot be used with nccl")
    return parse_bytes(text)


def _short(record: AllReduceRecord) -> str:
    if record.status != "ok":
        return f"{record.status}: {record.error}"
    return f"{record.mean_ms:.3f} ms, busbw {record.busbw_gbps:.2f} GB/s"


if __name__ == "__main__":
    sys.exit(main())
