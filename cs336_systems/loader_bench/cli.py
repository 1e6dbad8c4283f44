"""The command line of python -m cs336_systems.loader_bench."""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import sys
import tempfile
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import psutil

from ..argtypes import (
    ArgumentParser,
    add_device_argument,
    add_output_argument,
    boolean,
    byte_size,
    exit_status,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from ..command import Command
from ..device import resolve_device
from ..errors import UsageError
from ..lifetime import check_interrupted, temporary_directory
from ..monitor import add_monitor_arguments, check_monitor_arguments, monitored
from ..results import (
    ResultSink,
    check_output_paths,
    collect_environment,
)
from ..storage import (
    STORAGE_KINDS,
    check_data_dir,
    evict_page_cache,
    http_server,
    model_from_args,
    write_items,
)
from ..tools import prog
from ..units import format_bytes
from ..usercode import guarded
from .config import BenchConfig, LoaderConfig, load_dataset, loader_grid
from .measure import error_text, run_configuration
from .recommend import recommend, recommendation_text
from .record import (
    LoaderRecord,
    configuration_notes,
    new_record,
    records_for,
)
from .step import compute_description

PROG = prog("loader_bench")
DESCRIPTION = f"{PROG}: is training waiting for its data?"


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog=PROG, description=DESCRIPTION)
    data = parser.add_argument_group("data")
    data.add_argument("--storage", choices=STORAGE_KINDS, default="simulated")
    data.add_argument(
        "--dataset",
        metavar="package.module:callable",
        help="your own map-style Dataset (called with no arguments); replaces --storage",
    )
    data.add_argument("--num-items", type=positive_int, default=256)
    data.add_argument("--item-bytes", type=byte_size, default=64 * 1024, metavar="SIZE", help="e.g. 500KB (64KiB)")
    data.add_argument("--batch-size", type=positive_int, default=8)
    data.add_argument("--epochs", type=positive_int, default=2)
    data.add_argument(
        "--data-dir", type=Path, help="local/http: where the item files are written (default: a temp dir)"
    )
    store = parser.add_argument_group("simulated and http stores: time to fetch one item")
    store.add_argument("--latency-ms", type=non_negative_float, default=5.0, help="per item, before the first byte (5)")
    store.add_argument(
        "--bandwidth", type=byte_size, metavar="SIZE", help="bytes per second per item, e.g. 20MB (unlimited)"
    )
    store.add_argument("--jitter-ms", type=non_negative_float, default=0.0, help="uniform +- on the latency (0)")
    store.add_argument(
        "--cache-hit-rates",
        "--cache-hit-rate",
        type=non_negative_float,
        nargs="+",
        default=[0.0],
        metavar="RATE",
        help="fraction of items served from a warm cache in epoch 0, 1, ... (last repeats); "
        "'0 0.9' is a cold first epoch (0)",
    )
    store.add_argument("--warm-latency-ms", type=non_negative_float, default=0.0, help="time of a cache hit (0)")
    step = parser.add_argument_group("the training step")
    step.add_argument("--compute-ms", type=positive_float, help="stand-in step of this many ms (20)")
    step.add_argument("--model", choices=("tiny",), help="a real training step of a tiny byte-level Transformer LM")
    add_device_argument(step)
    step.add_argument("--seed", type=int, default=0)
    sweep = parser.add_argument_group("loader flags (lists: every combination runs)")
    sweep.add_argument("--num-workers", type=non_negative_int, nargs="+", default=[0], metavar="N")
    sweep.add_argument(
        "--prefetch-factors",
        "--prefetch-factor",
        dest="prefetch_factor",
        type=positive_int,
        nargs="+",
        default=[2],
        metavar="N",
    )
    sweep.add_argument("--pin-memory", type=boolean, nargs="+", default=[False], metavar="BOOL")
    sweep.add_argument("--persistent-workers", type=boolean, nargs="+", default=[False], metavar="BOOL")
    sweep.add_argument(
        "--processes",
        type=positive_int,
        nargs="+",
        metavar="N",
        help="run N independent processes, each fetching and computing its share (the items "
        "i with i mod N = rank); one row per N with the aggregate samples/s",
    )
    sweep.add_argument(
        "--ram-budget",
        type=byte_size,
        metavar="SIZE",
        help="host RAM the loader's buffer may use (default: RAM available now)",
    )
    add_output_argument(parser, help=".csv, .md or .jsonl; repeatable")
    add_monitor_arguments(parser)
    return parser


def bench_from_args(args) -> BenchConfig:
    """Validate everything a user can get wrong; raise a UsageError with one line."""
    model = model_from_args(args)
    if args.model and args.compute_ms is not None:
        raise UsageError("give either --model tiny or --compute-ms, not both")
    if args.model and args.dataset:
        raise UsageError("--model tiny reads the built-in stores' bytes as tokens; use --compute-ms with --dataset")
    if args.model and args.item_bytes < 3:
        raise UsageError("--model tiny needs --item-bytes of at least 3 (tokens and next-token targets)")
    storage, num_items, item_bytes = args.storage, args.num_items, args.item_bytes
    if args.dataset:
        num_items, item_bytes, storage = len(load_dataset(args.dataset)), None, "dataset"
    per_process = num_items // max(args.processes or [1])
    if per_process < args.batch_size:
        raise UsageError(
            f"{num_items} items make no full batch of {args.batch_size}"
            + (f" per process with {max(args.processes)} processes" if args.processes else "")
        )
    if storage in ("local", "http"):
        need = num_items * item_bytes
        where = args.data_dir or Path(tempfile.gettempdir())
        where = where if where.exists() else where.parent
        if where.exists() and shutil.disk_usage(where).free < need:
            raise UsageError(f"--data-dir: {format_bytes(need)} of item files do not fit on {where}")
        if args.data_dir is not None:
            check_data_dir(args.data_dir, num_items)
    return BenchConfig(
        storage=storage,
        num_items=num_items,
        item_bytes=item_bytes,
        batch_size=args.batch_size,
        epochs=args.epochs,
        model=model,
        compute="tiny-model" if args.model else "sleep",
        compute_ms=None if args.model else (args.compute_ms if args.compute_ms is not None else 20.0),
        device=args.device,
        seed=args.seed,
        dataset=args.dataset,
    )


@contextlib.contextmanager
def prepared_storage(bench: BenchConfig, data_dir: Path | None) -> Iterator[BenchConfig]:
    """Write the item files and start the HTTP server when the store needs them."""
    if bench.storage not in ("local", "http"):
        yield bench
        return
    with contextlib.ExitStack() as stack:
        if data_dir is None:
            data_dir = Path(stack.enter_context(temporary_directory("loader")))
        print(f"writing {bench.num_items} items of {format_bytes(bench.item_bytes)} to {data_dir}", file=sys.stderr)
        write_items(data_dir, bench.num_items, bench.item_bytes, bench.seed)
        if bench.storage == "local":
            yield replace(bench, location=str(data_dir), data_dir=str(data_dir))
            return
        url = stack.enter_context(http_server(data_dir, bench.model))
        print(f"HTTP server at {url}", file=sys.stderr)
        yield replace(bench, location=url, data_dir=str(data_dir))


def run(args: argparse.Namespace) -> int:
    """Every loader configuration, a row each as it finishes (Ctrl-C keeps them: command.Command)."""
    bench = bench_from_args(args)
    device = resolve_device(args.device)
    bench = replace(bench, device=str(device))
    check_monitor_arguments(args)
    sink = ResultSink(check_output_paths(args.output), LoaderRecord)
    ram_budget = args.ram_budget if args.ram_budget is not None else psutil.virtual_memory().available
    grid = loader_grid(args.num_workers, args.prefetch_factor, args.pin_memory, args.persistent_workers, args.processes)
    env = collect_environment(device)
    rows: list[dict] = []
    compute_desc = compute_description(bench, device)
    label = f"{PROG} {shlex.join(args.argv)}"
    with monitored(args.monitor, args.monitor_interval, label), prepared_storage(bench, args.data_dir) as bench:
        print(
            f"{len(grid)} configurations x {bench.epochs} epochs, {bench.storage} storage, {compute_desc}",
            file=sys.stderr,
        )
        for loader in grid:
            location_note = None
            if bench.data_dir is not None:
                reason = evict_page_cache(bench.data_dir)
                location_note = reason or "item files evicted from the page cache before epoch 0"
            notes = configuration_notes(bench, loader, device, location_note)
            try:
                # the user's __getitem__ runs here when there are no workers: its exit or BaseException is the row's
                with guarded(f"--dataset {bench.dataset}", None) if bench.dataset else contextlib.nullcontext():
                    per_process = run_configuration(bench, loader)
                records = records_for(bench, loader, per_process, env, compute_desc, ram_budget, notes)
            except Exception as exc:  # a failing configuration is a row; the sweep goes on
                record = new_record(bench, loader, env, compute_desc, ram_budget, None)
                record.status, record.error = "error", error_text(exc)
                if os.environ.get("CS336_DEBUG"):
                    traceback.print_exc()
                records = [record]
            for record in records:
                sink.write(record)
                rows.append(record.to_row())
            print(progress_line(loader, records), file=sys.stderr, flush=True)
            check_interrupted()  # a Ctrl-C swallowed while a worker was forked stops here
    print(LoaderRecord.markdown(rows))
    print(recommendation_text(recommend(rows, ram_budget), ram_budget))
    for path in args.output:
        print(f"wrote {path}", file=sys.stderr)
    return exit_status(row["status"] for row in rows)


def progress_line(loader: LoaderConfig, records: Sequence[LoaderRecord]) -> str:
    parts = []
    for r in records:
        if r.status != "ok":
            parts.append(f"{r.status}: {r.error}")
        else:
            parts.append(
                f"epoch {r.epoch}: {r.samples_per_s:.1f} samples/s, data wait {r.data_wait_pct:.1f}% ({r.verdict})"
            )
    return f"  {loader.describe()}: " + "; ".join(parts)


main = Command(build_parser, run)

if __name__ == "__main__":
    main.start()
