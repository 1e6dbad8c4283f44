"""python -m cs336_systems.benchmark: time one configuration and print a Markdown table.

Example:
    python -m cs336_systems.benchmark --model-size xl --context-length 512 \
        --pass-type forward-backward --precision bf16 --output results/xl.csv
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tabulate import tabulate

from . import cuda_graphs, nvtx
from .argtypes import EXIT_FAILED, ArgumentParser, exit_status, fail, output_path, positive_int
from .benchmark_flags import (
    add_checkpoint_argument,
    add_execution_arguments,
    add_optimizer_argument,
    add_shape_arguments,
    benchmark_config_from_args,
    model_config_from_args,
)
from .command import run_command
from .config import COMPILE_SCOPES, PASS_TYPES, BenchmarkConfig
from .device import DeviceError, resolve_device
from .lifetime import exit_with
from .models import ATTENTION_KINDS, SIZE_TABLES, ConfigError, count_parameters_for
from .monitor import MonitorPathError, add_monitor_arguments, check_monitor_arguments, monitored
from .optimizer import OptimizerFactoryError, check_user_optimizer
from .precision import PRECISIONS
from .results import BenchmarkRecord, ResultFileError, ResultSink, ResultWriteError, check_output_paths
from .runner import run_benchmark
from .terminal import show
from .user_model import ModelFactoryError, load_model_factory
from .usercode import add_timeout_argument, import_timeout

PROG = "python -m cs336_systems.benchmark"


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument(
        "--model-size", default="small", help="a name in --size-table's table (--list-sizes shows it; default small)"
    )
    parser.add_argument("--context-length", type=positive_int, default=512)
    parser.add_argument("--batch-size", type=positive_int, default=4)
    parser.add_argument("--pass-type", choices=PASS_TYPES, default="forward-backward")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32")
    parser.add_argument("--compile", action="store_true", help="wrap the model in torch.compile")
    parser.add_argument(
        "--compile-scope",
        choices=COMPILE_SCOPES,
        default="model",
        help="with --compile: the whole model, or each block (regional compilation: identical blocks share one "
        "compiled graph, so compiling takes about num_layers times less)",
    )
    parser.add_argument("--attention", choices=ATTENTION_KINDS, default="sdpa")
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
        "scores/softmax/weighted sum as NVTX ranges for nsys (scripts/nsys_profile.sh); `--nvtx blocks` "
        "also marks each Transformer block (block/N); no-op without CUDA",
    )
    add_shape_arguments(parser)
    add_execution_arguments(parser)
    add_monitor_arguments(parser)
    return parser


def size_table(args) -> str:
    rows = []
    for name in SIZE_TABLES[args.size_table]:
        config = model_config_from_args(args, name, args.context_length, args.attention)
        params = count_parameters_for(config)
        rows.append(
            [
                args.size_table,
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


def check_checkpointing(model, model_factory: str | None) -> None:
    if model.checkpoint_group_size and model_factory:
        raise ConfigError(
            "--checkpoint-blocks wraps the built-in model's blocks; it cannot wrap a --model-factory model"
        )


def read_config(text: str) -> BenchmarkConfig:
    """--config: a JSON file, or JSON text (a configuration's whole object, starting with '{')."""
    if not text.lstrip().startswith("{"):
        try:
            text = Path(text).read_text()
        except OSError as exc:
            raise ConfigError(f"--config {text}: cannot read it ({exc.strerror})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--config: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    return BenchmarkConfig.from_dict(data)


def config_from_args(args) -> BenchmarkConfig:
    if args.config:
        config = read_config(args.config)
        config.model.check_context(config.context_length)
        check_checkpointing(config.model, config.model_factory)
        return config
    model = model_config_from_args(args, args.model_size, args.context_length, args.attention)
    model.check_context(args.context_length)
    check_checkpointing(model, args.model_factory)
    return benchmark_config_from_args(
        args,
        model,
        context_length=args.context_length,
        batch_size=args.batch_size,
        pass_type=args.pass_type,
        precision=args.precision,
        compile=args.compile or args.compile_mode is not None,
        device=args.device,
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # the sweeps built on build_parser() have theirs, per configuration in a child (child.add_child_arguments)
    add_timeout_argument(parser, "per step, model build and import of your code")
    args = parser.parse_args(argv)
    try:
        if args.list_sizes:
            print(size_table(args))
            return 0
        config = config_from_args(args)
        device = resolve_device(config.device)
        if config.timer == "cuda-event" and device.type != "cuda":
            raise DeviceError("--timer cuda-event needs a CUDA device")
        if config.cuda_graphs and device.type != "cuda":  # other refusals are 'unsupported' rows, as in sweeps
            raise DeviceError(cuda_graphs.unsupported_reason(device, config.precision, None))
        if args.memory_snapshot and device.type != "cuda":
            raise DeviceError("--memory-snapshot needs a CUDA device (it records the CUDA allocator's history)")
        if config.model_factory:
            load_model_factory(config.model_factory, import_timeout(args.timeout))
        if config.optimizer_factory:
            check_user_optimizer(config.optimizer_factory, import_timeout(args.timeout))
        sink = ResultSink(check_output_paths(args.output))
        check_monitor_arguments(args)
    except (
        ConfigError,
        DeviceError,
        ModelFactoryError,
        OptimizerFactoryError,
        ResultFileError,
        MonitorPathError,
    ) as exc:
        return fail(PROG, str(exc))

    if args.nvtx and not nvtx.enable(blocks=args.nvtx == "blocks"):
        print(f"{PROG}: note: --nvtx does nothing on {device.type} (NVTX ranges need CUDA)", file=sys.stderr)
    with monitored(args.monitor, args.monitor_interval):
        record = run_benchmark(
            config.replace(device=str(device)), memory_snapshot=args.memory_snapshot, timeout_s=args.timeout
        )
    try:  # the row first: whatever the user's code did to stdout, the result is kept
        sink.write(record)
    except ResultWriteError as exc:  # a full disk: the row is shown below, the file kept whole
        show(BenchmarkRecord.console([record.to_row()]))
        show(f"{PROG}: error: {exc.strerror}", sys.stderr)
        return EXIT_FAILED
    finally:
        sink.close()
    show(BenchmarkRecord.console([record.to_row()]))
    for path in [*args.output, *([args.memory_snapshot] if args.memory_snapshot else [])]:
        show(f"wrote {path}", sys.stderr)
    if exit_status([record.status]):
        show(f"{PROG}: error: {record.error}", sys.stderr)
    return exit_status([record.status])


if __name__ == "__main__":
    exit_with(lambda: run_command(PROG, main))  # Ctrl-C 130, SIGTERM 143, one line
