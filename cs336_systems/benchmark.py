"""python -m cs336_systems.benchmark: time one configuration and print a Markdown table.

Example:
    cs336-bench benchmark --model-size xl --context-length 512 \
        --pass-type forward-backward --precision bf16 --output results/xl.csv
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from tabulate import tabulate

from . import jsontext, nvtx
from .argtypes import (
    EXIT_FAILED,
    ArgumentParser,
    add_all_columns_argument,
    add_timeout_argument,
    as_flag_value,
    exit_status,
    given_flags,
    output_path,
)
from .benchmark_flags import (
    add_checkpoint_argument,
    add_execution_arguments,
    add_model_arguments,
    add_optimizer_argument,
    add_shape_arguments,
    announce_size_table,
    benchmark_config_from_args,
    check_runnable,
    model_config_from_args,
    size_table_of,
)
from .command import Command
from .config import COMPILE_SCOPES, BenchmarkConfig
from .contention import describe_rows
from .device import DeviceError, resolve_device
from .errors import UsageError
from .factory import count_parameters_for
from .models import SIZE_TABLES, ConfigError, ModelConfig
from .monitor import add_monitor_arguments, check_monitor_arguments, monitored
from .results import BenchmarkRecord, ResultSink, ResultWriteError, check_output_paths
from .runner import run_benchmark
from .size_tables import SizeTableChoice
from .step import describe_measurement
from .terminal import show
from .tools import prog

PROG = prog("benchmark")


def configuration_parser() -> ArgumentParser:
    """The flags of one configuration and how it runs (find_max and warmup_study build on them)."""
    parser = ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    add_model_arguments(parser)
    parser.add_argument("--compile", action="store_true", help="wrap the model in torch.compile")
    parser.add_argument(
        "--compile-scope",
        choices=COMPILE_SCOPES,
        default="model",
        help="with --compile: the whole model, or each block (regional compilation: identical blocks share one "
        "compiled graph, so compiling takes about num_layers times less)",
    )
    parser.add_argument("--list-sizes", action="store_true", help="print --size-table's sizes and exit")
    parser.add_argument(
        "--config",
        metavar="FILE.json",
        help="run the configuration in this JSON file (or this JSON text), as BenchmarkConfig.to_dict writes it; "
        "it replaces every flag that describes the configuration (run_benchmarks hands its children theirs so)",
    )
    add_checkpoint_argument(parser)
    add_optimizer_argument(parser)
    parser.add_argument(
        "--memory-snapshot",
        type=output_path,
        metavar="PATH.pickle",
        help="CUDA: record the allocator's history over the measured steps and dump it (view at pytorch.org/memory_viz)",
    )
    parser.add_argument(
        "--nvtx",
        nargs="?",
        const="steps",
        choices=nvtx.LEVELS,
        help="CUDA: mark warmup, each measured step, forward/backward/optimizer and the naive attention's "
        "scores/softmax/weighted sum as NVTX ranges for nsys (the Nsight Systems wrapper in scripts/); `--nvtx blocks` "
        "also marks each Transformer block (block/N); no-op without CUDA",
    )
    add_shape_arguments(parser)
    add_execution_arguments(parser)
    add_monitor_arguments(parser)
    return parser


def size_table(args) -> str:
    rows = []
    table = size_table_of(args, [args.model_size])
    for name in SIZE_TABLES[table.edition]:
        config = model_config_from_args(args, table, name, args.context_length, args.attention, args.checkpoint_blocks)
        params = count_parameters_for(config)
        rows.append(
            [
                table.edition,
                name,
                config.d_model,
                config.d_ff,
                config.num_layers,
                config.num_heads,
                config.vocab_size,
                params,
                f"{params / 1e9:.2f}B" if params >= 1e9 else f"{params / 1e6:.1f}M",
            ]
        )
    headers = ["size_table", "size", "d_model", "d_ff", "num_layers", "num_heads", "vocab_size", "num_params", "approx"]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


# Where a --config file's settings come from on the command line: each is checked as its flag is.
FLAG_OF = {"optimizer_factory": "optimizer"}
MODEL_FLAG_OF = {"context_length": "max_context_length", "size_name": "model_size"}
# The flags whose values a --config file replaces (the rest, --output or --timeout, apply beside it).
CONFIGURATION_DESTS = {
    *(f.name for f in dataclasses.fields(BenchmarkConfig)),
    *(f.name for f in dataclasses.fields(ModelConfig)),
    *FLAG_OF.values(),
    *MODEL_FLAG_OF.values(),
}
MAX_CONFIG_BYTES = 1 << 20  # a configuration is a few hundred bytes


def _through_flags(parser, values: dict, flag_of: dict, where: str) -> dict:
    """Each value of a --config file checked and converted by its flag's own type and choices."""
    actions = {action.dest: action for action in parser._actions if action.option_strings}
    checked = {}
    for name, value in values.items():
        action = actions.get(flag_of.get(name, name))
        try:
            checked[name] = value if action is None else as_flag_value(action, value)
        except argparse.ArgumentTypeError as exc:
            raise ConfigError(f"--config: {where}{name} (as {action.option_strings[0]}): {exc}") from None
    return checked


def _config_text(text: str) -> str:
    """--config's JSON: the text itself (starting with '{'), or a regular file's (never a FIFO or a device,
    whose read would not end)."""
    if text.lstrip().startswith("{"):
        return text
    try:
        return jsontext.read_text(text, MAX_CONFIG_BYTES)
    except jsontext.UnreadableFile as exc:
        why = str(exc)
        hint = "; not a configuration" if why.startswith("larger than") else ""
        hint = " (give a JSON file or JSON text)" if why == "not a regular file" else hint
        raise ConfigError(f"--config {text}: {exc}{hint}") from None


def read_config(text: str, parser: argparse.ArgumentParser | None = None) -> BenchmarkConfig:
    """--config: a JSON file, or JSON text (a configuration's whole object, starting with '{'), each value
    checked as its flag would be (`parser`'s types and choices), then by the configuration itself."""
    try:
        data = jsontext.loads(_config_text(text))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--config: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    if parser is not None and isinstance(data, dict) and isinstance(data.get("model"), dict):
        model = _through_flags(parser, data["model"], MODEL_FLAG_OF, "model.")
        data = {**_through_flags(parser, {k: v for k, v in data.items() if k != "model"}, FLAG_OF, ""), "model": model}
    try:
        return BenchmarkConfig.from_dict(data)
    except ConfigError as exc:
        raise ConfigError(f"--config: {exc}") from None


def check_beside_config(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """A configuration flag given beside --config would be silently dropped: refused instead."""
    beside = [action for action in given_flags(parser, argv) if action.dest in CONFIGURATION_DESTS]
    if beside:
        raise ConfigError(
            f"--config holds the whole configuration; {beside[0].option_strings[0]} given beside it would be "
            "ignored: put it in the file, or drop --config"
        )


def config_from_args(
    args,
    parser: argparse.ArgumentParser | None = None,
    table: SizeTableChoice | None = None,
    context_length: int | None = None,
) -> BenchmarkConfig:
    """The configuration the flags describe, or --config's. `table`: the run's size table, where it chose
    one already (size_table_of); `context_length`: instead of --context-length (find_max's first probe)."""
    if args.config:
        return read_config(args.config, parser or configuration_parser())
    table = table or size_table_of(args, [args.model_size])
    context_length = context_length or args.context_length
    model = model_config_from_args(args, table, args.model_size, context_length, args.attention, args.checkpoint_blocks)
    return benchmark_config_from_args(
        args,
        model,
        context_length=context_length,
        batch_size=args.batch_size,
        pass_type=args.pass_type,
        precision=args.precision,
        compile=args.compile or args.compile_mode is not None,
        device=args.device,
    )


def build_parser() -> ArgumentParser:
    """The command's parser: the configuration's flags, and --timeout (a sweep's children get theirs from
    the sweep, child.add_child_arguments)."""
    parser = configuration_parser()
    add_timeout_argument(parser, "per step, model build and import of your code")
    add_all_columns_argument(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    if args.list_sizes:
        print(size_table(args))
        return 0
    parser = build_parser()
    if args.config:
        check_beside_config(parser, args.argv)
    table = None if args.config else size_table_of(args, [args.model_size])  # a --config carries its own
    config = config_from_args(args, parser, table)
    device = resolve_device(config.device)
    try:
        check_runnable(config, device)
    except UsageError as exc:  # the configuration is the file's: say so
        if not args.config:
            raise
        given = "(JSON text)" if args.config.lstrip().startswith("{") else args.config
        raise UsageError(f"--config {given}: {exc}") from None
    if args.memory_snapshot and device.type != "cuda":
        raise DeviceError("--memory-snapshot needs a CUDA device (it records the CUDA allocator's history)")
    sink = ResultSink(check_output_paths(args.output))
    check_monitor_arguments(args)

    if table is not None:  # a configuration file carries its own table (run_benchmarks' children)
        announce_size_table(table)
    if args.nvtx and not nvtx.enable(blocks=args.nvtx == "blocks"):
        print(f"{PROG}: note: --nvtx does nothing on {device.type} (NVTX ranges need CUDA)", file=sys.stderr)
    config = config.replace(device=str(device))
    print("\n".join(describe_measurement([config])), file=sys.stderr, flush=True)
    with monitored(args.monitor, args.monitor_interval):
        record = run_benchmark(config, memory_snapshot=args.memory_snapshot, timeout_s=args.timeout, announce=True)
    try:  # the row first: whatever the user's code did to stdout, the result is kept
        sink.write(record)
    except ResultWriteError as exc:  # a full disk: the row is shown below, the file kept whole
        show(BenchmarkRecord.console([record.to_row()], args.all_columns))
        show(f"{PROG}: error: {exc.strerror}", sys.stderr)
        return EXIT_FAILED
    finally:
        sink.close()
    show(BenchmarkRecord.console([record.to_row()], args.all_columns))
    if record.to_row().get("other_load_cores") is not None:  # measured: how busy the machine was meanwhile
        show(describe_rows([record.to_row()]), sys.stderr)
    for path in [*args.output, *([args.memory_snapshot] if args.memory_snapshot else [])]:
        show(f"wrote {path}", sys.stderr)
    if exit_status([record.status]):
        show(f"{PROG}: error: {record.error}", sys.stderr)
    return exit_status([record.status])


main = Command(build_parser, run)

if __name__ == "__main__":
    main.start()
