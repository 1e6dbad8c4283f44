"""What both sweep commands share: the grid, its flags, resume, Ctrl-C, children, progress, and the
executor that runs the grid (--executor inline here; local and slurm through sweep_jobs.py).

Grid order (the order of rows in the output file): model size, attention, checkpointing, precision,
compile, context length, batch size, pass type. A model depends only on (size, shape,
attention), so `benchmark_direct` builds each one once and reuses it for every
precision, context, batch and pass type after it in the grid.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import shlex
import signal
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import torch
from tqdm import tqdm

from . import benchmark_flags
from .argtypes import EXIT_FAILED, EXIT_INTERRUPTED, ArgumentParser, add_all_columns_argument, exit_status, positive_int
from .child import add_child_arguments, check_user_model_in_child, child_limits_from_args
from .config import COMPILE_CHOICES, COMPILE_SCOPES, IDENTITY_FIELDS, MODEL_SHAPE_FIELDS, PASS_TYPES, BenchmarkConfig
from .contention import describe_rows
from .device import resolve_device
from .executor import add_executor_arguments, settings_from_args
from .executor.evidence import SLURM_TIME_LIMIT
from .flagfile import add_config_file_argument
from .identity import identity_value
from .lifetime import OurInterrupt
from .models import ATTENTION_KINDS
from .monitor import add_monitor_arguments, check_monitor_arguments, monitored
from .precision import PRECISIONS
from .progress import progress_bar
from .results import (
    BenchmarkRecord,
    ResultFileError,
    ResultSink,
    ResultWriteError,
    check_output_paths,
    collect_environment,
    read_results,
)
from .size_tables import SizeTableChoice
from .step import describe_config, describe_measurement
from .terminal import show


def add_grid_arguments(parser: argparse.ArgumentParser) -> None:
    grid = parser.add_argument_group("grid (every combination runs, in this order)")
    # plural list flags; the singular spelling (as `benchmark` takes it) is an alias
    grid.add_argument("--model-sizes", "--model-size", nargs="+", default=["small"], metavar="SIZE")
    grid.add_argument("--attentions", "--attention", nargs="+", choices=ATTENTION_KINDS, default=["sdpa"])
    grid.add_argument("--precisions", "--precision", nargs="+", choices=PRECISIONS, default=["fp32"])
    grid.add_argument("--compile", choices=tuple(COMPILE_CHOICES), default="off", help="off, on, or both")
    grid.add_argument("--compile-scope", choices=COMPILE_SCOPES, default="model")
    grid.add_argument("--context-lengths", "--context-length", nargs="+", type=positive_int, default=[512], metavar="T")
    grid.add_argument("--batch-sizes", "--batch-size", nargs="+", type=positive_int, default=[4], metavar="B")
    grid.add_argument("--pass-types", "--pass-type", nargs="+", choices=PASS_TYPES, default=["forward-backward"])
    benchmark_flags.add_checkpoint_argument(grid, plural=True)
    parser.add_argument("--resume", action="store_true", help="skip configurations already in the output file")
    parser.add_argument(
        "--wait-lock", action="store_true", help="if another run is writing an output, wait for it instead of exiting"
    )
    benchmark_flags.add_optimizer_argument(parser)
    benchmark_flags.add_shape_arguments(parser)
    benchmark_flags.add_execution_arguments(parser)


def grid_size_table(args: argparse.Namespace) -> SizeTableChoice:
    """The table the grid's --model-sizes are names in (benchmark_flags.size_table_of)."""
    return benchmark_flags.size_table_of(args, args.model_sizes)


def grid_from_args(
    args: argparse.Namespace, device: torch.device, table: SizeTableChoice | None = None
) -> list[BenchmarkConfig]:
    """Every configuration of the grid, in grid order; each refuses itself (ConfigError) as it is made.
    `table`: the run's size table, where it chose one already."""
    table = table or grid_size_table(args)
    longest = max(args.context_lengths)
    configs = []
    for size, attention, checkpoint, precision, compiled, context, batch, pass_type in itertools.product(
        args.model_sizes,
        args.attentions,
        args.checkpoint_blocks,
        args.precisions,
        COMPILE_CHOICES[args.compile],
        args.context_lengths,
        args.batch_sizes,
        args.pass_types,
    ):
        model = benchmark_flags.model_config_from_args(args, table, size, longest, attention, checkpoint)
        configs.append(
            benchmark_flags.benchmark_config_from_args(
                args,
                model,
                context_length=context,
                batch_size=batch,
                pass_type=pass_type,
                precision=precision,
                compile=compiled,
                device=str(device),
            )
        )
    return list(dict.fromkeys(configs))  # a value given twice runs once


# -- identity of a configuration (resume) -------------------------------------------------


def recorded_outputs(outputs: Iterable[Path]) -> list[Path]:
    """The outputs that keep rows to resume from (.csv, .jsonl); Markdown is only a rendering."""
    return [path for path in outputs if path.suffix in (".csv", ".jsonl")]


def rows_by_output(outputs: Iterable[Path]) -> dict[Path, list[dict]]:
    """The rows each .csv / .jsonl output already holds."""
    return {
        path: read_results(path).to_dict("records") if path.exists() and path.stat().st_size > 0 else []
        for path in recorded_outputs(outputs)
    }


# Rows a later run replaces: the job was ended by the scheduler or a person, not by the configuration.
REDONE_STATUSES = ("cancelled", "preempted")


def is_redone(row: dict) -> bool:
    """A row the same command runs again: a Slurm job cancelled, preempted, or ended at its time limit
    (--slurm-time; raise it first). run_benchmarks' own --timeout row is the configuration's answer and stays."""
    status = row.get("status")
    return status in REDONE_STATUSES or (
        status == "timeout" and str(row.get("error") or "").startswith(SLURM_TIME_LIMIT)
    )


def latest_rows(rows: Iterable[dict]) -> dict[tuple, dict]:
    """Each configuration's last row (a redone configuration's row follows the one it replaces)."""
    latest: dict[tuple, dict] = {}
    for row in rows:
        key = BenchmarkRecord.row_key(row)
        latest.pop(key, None)
        latest[key] = row
    return latest


def final_keys(rows: Iterable[dict]) -> set[tuple]:
    """The configurations whose last row is final (not one a later run replaces)."""
    return {key for key, row in latest_rows(rows).items() if not is_redone(row)}


def existing_rows(outputs: Iterable[Path]) -> list[dict]:
    """Every configuration's row already written, once: its last row, from the first output holding it."""
    rows: dict[tuple, dict] = {}
    for held in rows_by_output(outputs).values():
        for key, row in latest_rows(held).items():
            rows.setdefault(key, row)
    return list(rows.values())


def resumable(outputs: Sequence[Path]) -> bool:
    """Whether a stopped sweep can be resumed from these outputs (a .csv or .jsonl file)."""
    return bool(recorded_outputs(outputs))


def pending_configs(
    configs: Sequence[BenchmarkConfig], held: dict[Path, list[dict]], resume: bool
) -> list[BenchmarkConfig]:
    """The configurations not yet in every output. A configuration counts as done only when
    each .csv / .jsonl output holds a final row of it (a run killed between two writes re-runs it;
    the sink then writes it only where it is missing; a cancelled job's row is redone). Without
    --resume, an output that already holds rows is refused: a configuration is never run twice by accident."""
    for path, rows in held.items():
        if rows and not resume:
            raise ResultFileError(
                f"{path} already has {len(rows)} rows: pass --resume to continue it, or use a new file"
            )
        if differ := other_protocol(configs, rows):
            raise ResultFileError(
                f"--resume {path}: its rows were measured with {', '.join(differ)}: resume with those settings, "
                "or write to a new file"
            )
    keys = [final_keys(rows) for rows in held.values()]
    done = set.intersection(*keys) if keys else set()
    return [config for config in configs if config.key() not in done]


# A resumed grid may grow (another size, context, pass...); every other identity column says how a row was
# measured and must be this run's: the model's shape compared within its size, compile settings within compiled
# rows, the optimizer within train steps.
GRID = {"model_size", "attention", "checkpoint_blocks", "precision", "compile", "context_length", "batch_size"}
WITHIN = {**dict.fromkeys(MODEL_SHAPE_FIELDS, "model_size"), "compile_scope": "compile", "compile_mode": "compile"}


def other_protocol(configs: Sequence[BenchmarkConfig], rows: Iterable[dict]) -> list[str]:
    """Each setting the rows already in a file were measured with that this run's grid lacks, in column order:
    'measure_steps 3 (this run: 4)'."""

    def key(row: dict, name: str) -> tuple[str, str]:  # a column, and the value of the one it is compared within
        return name, identity_value(row.get({**WITHIN, "optimizer_factory": "pass_type"}.get(name, "")))

    mine: dict[tuple, set[str]] = {}
    for identity in (config.identity() for config in configs):
        for name in IDENTITY_FIELDS:
            mine.setdefault(key(identity, name), set()).add(identity_value(identity[name]))
    differ: dict[str, str] = {}
    for row in rows:
        for name in (name for name in IDENTITY_FIELDS if name not in {*GRID, "pass_type"}):
            ours, theirs = mine.get(key(row, name), ()), identity_value(row.get(name))
            if ours and theirs not in ours:
                differ.setdefault(name, f"{name} {_shown(theirs)} (this run: {' or '.join(sorted(map(_shown, ours)))})")
    return [differ[name] for name in IDENTITY_FIELDS if name in differ]


def _shown(value: str) -> str:
    return value.removesuffix(".0") or "unset"


def holds(held: dict[Path, list[dict]]) -> dict[Path, set]:
    """What each output already holds for the sink (ResultSink.holds): its final rows' keys."""
    return {path: final_keys(rows) for path, rows in held.items() if rows}


# -- Ctrl-C -----------------------------------------------------------------------------


class Abort(OurInterrupt):
    """Stop now: a second Ctrl-C, or SIGTERM. A child in progress is killed with its group."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopRequest:
    """The first Ctrl-C asks the sweep to stop after the configuration in progress (its
    row is saved); a second one, or SIGTERM, aborts at once. Rows already written stay on
    disk, and a row being written is finished first, so a file is never cut mid-row."""

    def __init__(self):
        self.requested = False
        self.exit_status = EXIT_INTERRUPTED
        self._writing = False
        self._pending: Abort | None = None

    def _handle(self, signum, frame):
        if signum == signal.SIGINT and not self.requested:
            self.requested = True
            print(
                "\nstopping after the current configuration (its row will be saved); Ctrl-C again to abort now",
                file=sys.stderr,
                flush=True,
            )
            return
        self.requested = True
        self.exit_status = 128 + signum
        if self._writing:
            self._pending = Abort(signum)
        else:
            raise Abort(signum)

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopRequest]:
        previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """An abort arriving while a row is written takes effect once it is written."""
        self._writing = True
        try:
            yield
        finally:
            self._writing = False
        if self._pending is not None:
            raise self._pending


def resume_command(prog: str, argv: Sequence[str]) -> str:
    args = list(argv)
    if "--resume" not in args:
        args.append("--resume")
    return f"{prog} {shlex.join(args)}"


def progress(total: int, description: str) -> tqdm:
    return progress_bar(total, "config", description)


# -- the driver both sweep commands run ----------------------------------------------------


class Writer:
    """Writes each finished row, advances the progress bar, and honours Ctrl-C."""

    def __init__(self, sink: ResultSink, bar: tqdm, stop: StopRequest):
        self.sink, self.bar, self.stop = sink, bar, stop
        self.written: list[BenchmarkRecord] = []

    def start(self, config: BenchmarkConfig) -> bool:
        """False once a stop was requested: the caller must not begin `config`."""
        if self.stop.requested:
            return False
        self.bar.set_description(describe_config(config))
        return True

    def write(self, record: BenchmarkRecord) -> None:
        with self.stop.writing():
            self.sink.write(record)
            self.written.append(record)
        self.bar.update(1)
        self.bar.set_postfix_str(f"last: {record.status} {_short_time(record)}")

    def log(self, line: str) -> None:
        """A line on stderr that does not break the progress bar."""
        self.bar.write(line, file=sys.stderr)


def _short_time(record: BenchmarkRecord) -> str:
    """The statistic the table leads with (the median), or why there is none."""
    return f"median {record.median_ms:.1f} ms" if record.median_ms is not None else (record.error or "")[:40]


def build_sweep_parser(prog: str, description: str, child_processes: bool) -> ArgumentParser:
    """A sweep command's flags: the grid, the benchmark flags, (run_benchmarks) the children's limits."""
    parser = ArgumentParser(prog=prog, description=description)
    add_config_file_argument(parser)
    add_grid_arguments(parser)
    add_all_columns_argument(parser)
    if child_processes:
        add_child_arguments(parser)
    add_executor_arguments(parser)
    add_monitor_arguments(parser)
    return parser


def sweep_command(prog: str, description: str, execute, child_processes: bool, run_jobs):
    """A sweep tool's (build_parser, run): the sweep's flags (with --config's), then `execute(pending,
    args, env, writer, limits)` over the grid (`limits`: the children's, or None), or with --executor
    local or slurm `run_jobs(args, prog, child_processes)` (sweep_jobs.run). The tool module declares
    `main = Command(build_parser, run)` with them."""

    def build_parser() -> argparse.ArgumentParser:
        return build_sweep_parser(prog, description, child_processes)

    def run(args: argparse.Namespace) -> int:
        if args.executor != "inline":
            return run_jobs(args, prog, child_processes)
        return run_sweep(args, prog, execute, child_processes)

    return build_parser, run


def run_sweep(args: argparse.Namespace, prog: str, execute, child_processes: bool) -> int:
    """Run the grid's pending configurations through `execute`, then print a table."""
    settings_from_args(args)  # inline: the executors' flags are refused
    device = resolve_device(args.device)
    table = grid_size_table(args)
    configs = grid_from_args(args, device, table)
    # one timer, device and user code for the whole grid; a user's model is built only in children there
    in_child = check_user_model_in_child if child_processes else None
    benchmark_flags.check_runnable(configs[0], device, check_model_elsewhere=in_child)
    outputs = check_output_paths(args.output)
    check_monitor_arguments(args)
    limits = child_limits_from_args(args, device) if child_processes else None
    # Locked for the whole sweep, cut last lines dropped, other tools' files refused; then read.
    sink = ResultSink(outputs, wait_lock=args.wait_lock, wait_flag="--wait-lock")
    try:
        held = rows_by_output(outputs)
        pending = pending_configs(configs, held, args.resume)
    except BaseException:
        sink.close()
        raise
    previous = existing_rows(outputs)
    sink.set_previous_rows(previous)
    sink.holds = holds(held)

    # Children record their own environment; the parent of CUDA children stays off the GPU.
    env = None if child_processes else collect_environment(device)
    benchmark_flags.announce_size_table(table)
    print("\n".join(describe_measurement(configs)), file=sys.stderr)
    print(
        f"{len(configs)} configurations, {len(configs) - len(pending)} already done, {len(pending)} to run",
        file=sys.stderr,
    )
    stop = StopRequest()
    with monitored(args.monitor, args.monitor_interval), stop.installed(), progress(len(pending), prog) as bar:
        writer = Writer(sink, bar, stop)
        try:
            execute(pending, args, env, writer, limits)
        except KeyboardInterrupt:
            stop.requested = True
        except ResultWriteError as exc:
            print(f"{prog}: error: {exc.strerror}", file=sys.stderr)
            print(
                f"{len(writer.written)} of {len(pending)} configurations saved. Free space, then resume with:\n"
                f"  {resume_command(prog, args.argv)}",
                file=sys.stderr,
            )
            return EXIT_FAILED
        finally:
            sink.close()
    shown = {BenchmarkRecord.row_key(row) for row in previous}  # a row re-run only for a file that lacked it shows once
    rows = [*previous, *(record.to_row() for record in writer.written if record.key() not in shown)]
    if rows:
        show(BenchmarkRecord.console(rows, args.all_columns))
        fresh = [row for row in (r.to_row() for r in writer.written) if row.get("other_load_cores") is not None]
        if fresh:  # how busy the machine was while this run measured (contention.py)
            show(describe_rows(fresh), sys.stderr)
    if stop.requested and len(writer.written) < len(pending):
        done = f"stopped: {len(writer.written)} of {len(pending)} configurations done"
        if resumable(outputs):
            print(f"{done} and saved. Resume with:\n  {resume_command(prog, args.argv)}", file=sys.stderr)
        else:
            print(f"{done}; nothing to resume from: pass --output FILE.csv (or .jsonl) to keep rows", file=sys.stderr)
        return stop.exit_status
    return exit_status(row.get("status") for row in rows)
