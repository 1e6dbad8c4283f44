"""python -m cs336_systems.ddp_bench: the flags and main."""

from __future__ import annotations

import argparse
import sys

from .. import benchmark_flags
from ..adapters import AdapterError, Adapters, add_adapters_argument, load_adapters
from ..argtypes import (
    ArgumentParser,
    exit_status,
    positive_float,
    positive_int,
    step_count,
    warmup_count,
)
from ..benchmark_flags import add_shape_arguments, announce_size_table, model_config_from_args
from ..command import Command, add_argument_with_aliases
from ..config import BenchmarkConfig
from ..distributed.driver import launch_from_args, launch_parser, run_rows
from ..factory import check_user_model
from ..identity import row_key
from ..models import ATTENTION_KINDS, ConfigError
from ..optimizer import check_user_optimizer
from ..precision import PRECISIONS, unsupported_reason
from ..results import ResultSink, check_output_paths, read_results
from ..size_tables import SizeTableChoice
from .record import (
    DdpRecord,
    attach_baseline,
    describe,
    record_for,
    scaled_learning_rates,
)
from .strategies import ADAPTER_STRATEGIES, COMPUTE_DTYPES, STRATEGIES, missing_adapter
from .trainer import DDP_DEFAULT_BUCKET_CAP_MB, OPTIMIZERS, DdpUnit, ddp_worker


def build_parser() -> ArgumentParser:
    parser = launch_parser(
        "ddp_bench", "our training step under data parallelism, and what it scales to", default_timeout_s=600.0
    )
    add_argument_with_aliases(
        parser,
        "--strategies",
        "--strategy",
        nargs="+",
        choices=("single", *STRATEGIES),
        default=["ddp"],
        help="ddp, naive, flat, zero1, fsdp2; adapter-* need --adapters; single: the one-process baseline alone "
        "(default ddp)",
    )
    parser.add_argument(
        "--baseline",
        metavar="FILE",
        help="an earlier run's .csv or .jsonl whose one-process row this run scales against (not measured again)",
    )
    parser.add_argument(
        "--bucket-cap-mb",
        nargs="+",
        type=positive_float,
        metavar="MB",
        help=f"DDP / zero1 / adapter-ddp-bucketed bucket sizes to try (default {DDP_DEFAULT_BUCKET_CAP_MB:g})",
    )
    add_adapters_argument(
        parser,
        help="a student's adapters (tests/adapters.py or a dotted name) for the adapter-* strategies",
    )
    parser.add_argument(
        "--fsdp-compute-dtype",
        choices=tuple(COMPUTE_DTYPES),
        help="fsdp2 / adapter-fsdp: forward and backward in this dtype (MixedPrecisionPolicy; fp32)",
    )
    parser.add_argument(
        "--no-check",
        dest="check",
        action="store_false",
        help="skip comparing one step of each strategy with a single process",
    )
    parser.add_argument("--model-size", default="small", help="a name in --size-table's table (default small)")
    parser.add_argument("--context-length", type=positive_int, default=512)
    parser.add_argument("--batch-size", type=positive_int, default=4, help="per device (rank); global = N x this")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32")
    parser.add_argument("--attention", choices=ATTENTION_KINDS, default="sdpa")
    add_shape_arguments(parser)
    group = parser.add_argument_group("training")
    group.add_argument(
        "--optimizer",
        type=optimizer_spec,
        default="adamw",
        metavar="OPTIMIZER",
        help=f"{' or '.join(OPTIMIZERS)}, or your own as package.module:callable, called with the parameters and "
        "those of lr (scaled), weight_decay, betas, eps its signature takes, as benchmark calls it (default adamw)",
    )
    group.add_argument("--base-lr", type=positive_float, default=1e-4, help="learning rate tuned at --base-batch-size")
    group.add_argument(
        "--base-batch-size", type=positive_int, help="batch --base-lr was tuned at (default: per-device)"
    )
    group.add_argument("--warmup-steps", type=warmup_count, default=5)
    group.add_argument("--measure-steps", type=step_count, default=10)
    group.add_argument("--seed", type=int, default=0)
    return parser


def optimizer_spec(text: str) -> str:
    if text in OPTIMIZERS or ":" in text:
        return text
    raise argparse.ArgumentTypeError(f"must be {', '.join(OPTIMIZERS)} or package.module:callable, got {text!r}")


def units_for(
    args: argparse.Namespace, config: BenchmarkConfig, world_size: int, first: bool, loaded: Adapters | None = None
) -> list[DdpUnit]:
    """The runs of one process group: the baseline (in the first group only), then each strategy
    (`loaded`: the student's adapters, check_adapters)."""
    base_batch = args.base_batch_size or config.batch_size
    units = []
    if first and not args.baseline:
        units.append(DdpUnit("single", config, ranks=1, optimizer=args.optimizer, lr=args.base_lr))
    lr = scaled_learning_rates(args.base_lr, base_batch, config.batch_size * world_size)[0]
    for strategy in [s for s in args.strategies if s != "single"]:
        if not first and loaded and missing_adapter(strategy, loaded):
            continue  # the other edition's strategy: its one skipped row is the first group's
        for bucket in (args.bucket_cap_mb or [None]) if strategy in BUCKETED else [None]:
            units.append(
                DdpUnit(
                    strategy,
                    config,
                    ranks=world_size,
                    optimizer=args.optimizer,
                    lr=lr,
                    bucket_cap_mb=bucket,
                    compute_dtype=args.fsdp_compute_dtype or "fp32",
                    adapters=args.adapters,
                    check=args.check,
                )
            )
    return units


def size_table_of(args: argparse.Namespace) -> SizeTableChoice:
    """The table --model-size is a name in, the student's --adapters read first (benchmark_flags.size_table_of)."""
    return benchmark_flags.size_table_of(args, [args.model_size], args.adapters)


def config_from_args(
    args: argparse.Namespace, device_type: str, table: SizeTableChoice | None = None
) -> BenchmarkConfig:
    """The per-device train-step (it refuses itself: ConfigError), as the handout's planner reads it too.
    `table`: the run's size table, where it chose one already."""
    table = table or size_table_of(args)
    model = model_config_from_args(args, table, args.model_size, args.context_length, args.attention)
    return BenchmarkConfig(
        model=model,
        context_length=args.context_length,
        batch_size=args.batch_size,
        pass_type="train-step",
        precision=args.precision,
        device=device_type,
        warmup_steps=args.warmup_steps,
        measure_steps=args.measure_steps,
        seed=args.seed,
        model_factory=args.model_factory,
    )


BUCKETED = ("ddp", "zero1", "adapter-ddp-bucketed")  # the strategies --bucket-cap-mb applies to
FSDP = ("fsdp2", "adapter-fsdp")  # the strategies --fsdp-compute-dtype applies to


def check_flags_apply(args: argparse.Namespace) -> None:
    """A flag none of the chosen strategies uses is refused, not silently ignored."""
    if args.baseline and "single" in args.strategies:
        raise ConfigError("--baseline stands for measuring one process: it does not go with --strategies single")
    for flag, given, applies in (
        ("--bucket-cap-mb", args.bucket_cap_mb, BUCKETED),
        ("--fsdp-compute-dtype", args.fsdp_compute_dtype, FSDP),
    ):
        if given is not None and not any(strategy in applies for strategy in args.strategies):
            raise ConfigError(
                f"{flag} applies only to --strategies {', '.join(applies)}; none of {' '.join(args.strategies)} uses it"
            )


# what a one-process row of another run must share with this run's to stand for it (the rest is the strategy's)
NOT_THE_BASELINES = ("strategy", "world_size", "bucket_cap_mb", "compute_dtype", "adapters")


def read_baseline(path: str, expected: dict) -> dict:
    """The one-process row of `path` measured as this run would (`expected`: its identity), else a UsageError."""
    fields = [name for name in DdpRecord.identity_fields() if name not in NOT_THE_BASELINES]
    singles = [row for row in read_results(path).to_dict("records") if row.get("strategy") == "single"]
    found = next((row for row in singles if row_key(row, fields) == row_key(expected, fields)), None)
    if found is None:
        differs = [name for name in fields if singles and row_key(singles[0], [name]) != row_key(expected, [name])]
        why = f"its one-process row was measured otherwise ({', '.join(differs)})" if singles else "no one-process row"
        raise ConfigError(f"--baseline {path}: {why}")
    return found


def check_adapters(args: argparse.Namespace) -> Adapters | None:
    """A user error before any rank starts: adapter-* without --adapters, or a module that cannot load."""
    wanted = [strategy for strategy in args.strategies if strategy in ADAPTER_STRATEGIES]
    if wanted and not args.adapters:
        raise AdapterError(f"--strategies {' '.join(wanted)} need --adapters MODULE (e.g. tests/adapters.py)")
    return load_adapters(args.adapters) if args.adapters else None


def run(args: argparse.Namespace) -> int:
    launch = launch_from_args(args, unique_sorted=True)
    device = launch.first_device
    if reason := unsupported_reason(args.precision, device):
        raise ConfigError(f"--precision {args.precision}: {reason}")
    check_flags_apply(args)
    table = size_table_of(args)
    config = config_from_args(args, device.type, table)
    if args.model_factory:  # before any rank starts: a model every rank would fail on is one line
        check_user_model(config.model, args.model_factory, device)
    loaded = check_adapters(args)
    if ":" in args.optimizer:
        check_user_optimizer(args.optimizer)
    sink = ResultSink(check_output_paths(args.output) if launch.rank0 else [], DdpRecord)
    if launch.rank0:
        announce_size_table(table)

    lr_fields = dict(base_lr=args.base_lr, base_batch_size=args.base_batch_size or args.batch_size)
    baseline: list[dict] = []  # the single-process row, once it has run (or read, measured once elsewhere)
    if args.baseline:
        single = {**config.identity(), **launch.base_fields(1), **lr_fields, "optimizer": args.optimizer}
        baseline.append(read_baseline(args.baseline, single))

    def row(unit: DdpUnit, result, base: dict, environment) -> DdpRecord:
        record = record_for(unit, result, {**base, **lr_fields}, environment)
        if unit.strategy == "single":
            baseline[:] = [record.to_row()]
        attach_baseline(record, baseline[0] if baseline else None)
        return record

    records = run_rows(
        launch,
        ddp_worker,
        lambda world_size, first: units_for(args, config, world_size, first, loaded),
        row,
        sink.write,
        describe,
        DdpRecord,
    )
    if not records:  # a torchrun rank other than 0
        return 0
    print(DdpRecord.markdown([record.to_row() for record in records]))
    for path in args.output:
        print(f"wrote {path}", file=sys.stderr)
    return exit_status([record.status for record in records])


main = Command(build_parser, run)
