"""The benchmark flags shared by benchmark, the sweeps, find_max and ddp_bench (model shape,
execution), a BenchmarkConfig from those flags, and what a configuration cannot check of itself
before a run (check_runnable). The argparse types themselves live in argtypes.py.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from . import cuda_graphs
from .argtypes import (
    PRECISIONS,
    add_device_argument,
    add_output_argument,
    positive_float,
    positive_int,
    step_count,
    warmup_count,
)
from .config import COMPILE_MODES, PARAM_DTYPES, PASS_TYPES, PEAK_CHOICES, BenchmarkConfig
from .device import DeviceError
from .factory import check_user_model
from .models import ATTENTION_KINDS, CHECKPOINT_WORDS, ConfigError, ModelConfig
from .optimizer import check_user_optimizer
from .size_tables import AUTO, SIZE_TABLE_CHOICES, SizeTableChoice, choose_size_table
from .timing import add_timer_argument, timer_unsupported_reason


def checkpoint_blocks(text: str) -> int | str | None:
    """--checkpoint-blocks: 0 (off), K blocks per checkpointed group, sqrt or all."""
    if text in CHECKPOINT_WORDS:
        return text
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected 0, a number of blocks, sqrt or all; got {text!r}")
    return int(text) or None


CHECKPOINT_HELP = (
    "activation checkpointing: wrap each run of K consecutive blocks in torch.utils.checkpoint "
    "(0 = off; sqrt = groups of ceil(sqrt(num_layers)); all = one group)"
)


def add_checkpoint_argument(parser: argparse.ArgumentParser, plural: bool = False) -> None:
    if plural:
        parser.add_argument(
            "--checkpoint-blocks",
            nargs="+",
            type=checkpoint_blocks,
            default=[None],
            metavar="K",
            help=CHECKPOINT_HELP + "; a list runs each",
        )
    else:
        parser.add_argument(
            "--checkpoint-blocks", type=checkpoint_blocks, default=None, metavar="K", help=CHECKPOINT_HELP
        )


def add_model_arguments(parser: argparse.ArgumentParser, pass_type: bool = True) -> None:
    """One configuration's model, batch and numerics, with the same defaults in every tool that takes one."""
    parser.add_argument("--model-size", default="small", help="a name in --size-table's table")
    parser.add_argument("--context-length", type=positive_int, default=512)
    parser.add_argument("--batch-size", type=positive_int, default=4)
    if pass_type:
        parser.add_argument("--pass-type", choices=PASS_TYPES, default="forward-backward")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32")
    parser.add_argument("--attention", choices=ATTENTION_KINDS, default="sdpa")


def add_optimizer_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--optimizer",
        metavar="package.module:callable",
        help="train-step: your optimizer instead of torch's fused AdamW, called with the parameters and those of "
        "lr, weight_decay, betas, eps its signature takes (built once before any work)",
    )


def add_shape_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model shape (overrides on top of the named size)")
    group.add_argument(
        "--size-table",
        choices=SIZE_TABLE_CHOICES,
        default=AUTO,
        help="which handout's table of named sizes (2026: xl is d_model 2560, 10B is new). auto: your "
        "repository's edition (the names in --adapters, else tests/adapters.py here), else the one table "
        "with the size's name (2.7B: 2025, 10B: 2026), else 2026",
    )
    group.add_argument("--d-model", type=positive_int)
    group.add_argument("--d-ff", type=positive_int)
    group.add_argument("--num-layers", type=positive_int)
    group.add_argument("--num-heads", type=positive_int)
    group.add_argument("--vocab-size", type=positive_int)
    group.add_argument("--rope-theta", type=positive_float)
    group.add_argument(
        "--max-context-length",
        type=positive_int,
        help="longest sequence the model supports (default: the benchmarked context length)",
    )
    group.add_argument(
        "--fused-projections",
        action="store_true",
        help="fast path: the built-in model with q/k/v as one matmul and SwiGLU's w1/w3 as one (the same function; "
        "default: the handout's separate projections)",
    )
    group.add_argument(
        "--model-factory",
        metavar="package.module:callable",
        help="benchmark your own model: called with those of vocab_size, context_length, d_model, num_layers, "
        "num_heads, d_ff, rope_theta (and device, dtype) its signature names; must return an nn.Module mapping "
        "(B, T) int64 tokens to (B, T, V) logits",
    )


def add_execution_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("execution")
    add_device_argument(group)
    group.add_argument("--warmup-steps", type=warmup_count, default=5)
    group.add_argument("--measure-steps", type=step_count, default=10)
    group.add_argument(
        "--target-iqr",
        dest="target_iqr_pct",
        type=positive_float,
        metavar="PCT",
        help="measure until resolved: after --measure-steps, one more step at a time until IQR/median is at most "
        "PCT or --max-measure-seconds of steps ran (the row's iqr_target_reached says which)",
    )
    group.add_argument(
        "--max-measure-seconds",
        dest="max_measure_s",
        type=positive_float,
        default=60.0,
        metavar="S",
        help="with --target-iqr: the most time the measured steps may take (60)",
    )
    add_timer_argument(
        group,
        help="host: synchronise + host clock around each step; cuda-event: CUDA event pair per step; do-bench: "
        "each sample one triton.testing.do_bench call, as CS336 ranks the fastest training step (CUDA and Triton)",
    )
    group.add_argument("--seed", type=int, default=0)
    group.add_argument(
        "--peak",
        choices=PEAK_CHOICES,
        default="auto",
        help="MFU denominator: auto: the spec sheet for a known GPU, else this machine's calibrated peak (a matmul "
        "probe in the same dtype, measured once at a quiet moment and kept); calibrate: measure and keep it now; "
        "measure: measure for this run only; table: the spec sheet or none",
    )
    group.add_argument("--peak-tflops", type=positive_float, help="your own peak TFLOP/s for MFU (overrides --peak)")
    group.add_argument(
        "--compile-mode",
        choices=COMPILE_MODES,
        help="torch.compile's mode for compiled rows (recorded as compile_mode; on `benchmark` it implies --compile)",
    )
    group.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="CUDA: capture the whole step (forward, loss, backward, AdamW capturable) in a CUDA graph after "
        "warmup and time its replays",
    )
    group.add_argument(
        "--grad-accum-steps",
        type=positive_int,
        default=1,
        metavar="K",
        help="fast path: K forward-backward micro-batches of --batch-size per optimizer step (tokens, FLOPs, "
        "MFU and phase times count all K)",
    )
    group.add_argument(
        "--param-dtype",
        choices=PARAM_DTYPES,
        default="fp32",
        help="fast path: bf16 stores parameters and gradients in bf16, with fp32 master weights and AdamW state "
        "in the optimizer (needs --precision bf16; default fp32 weights under autocast)",
    )
    group.add_argument(
        "--no-profile-step",
        dest="profile_step",
        action="store_false",
        help="skip the extra step under torch.profiler after the measured ones (kernels_per_step, device_busy_pct)",
    )
    add_output_argument(group, help="write results to PATH (.csv, .md or .jsonl; repeatable)")


def size_table_of(args: argparse.Namespace, sizes: Sequence[str], adapters: str | None = None) -> SizeTableChoice:
    """--size-table as an edition (size_tables.choose_size_table), from the flag, the student's adapters
    (a tool's --adapters) and the `sizes` asked for. It may read the student's repository: a run chooses
    it once and hands it to model_config_from_args and announce_size_table."""
    return choose_size_table(args.size_table, sizes, adapters)


def announce_size_table(table: SizeTableChoice) -> None:
    """The run's first line on stderr: which table the size names mean, and why (once the flags are checked)."""
    print(table.line(), file=sys.stderr, flush=True)


def shape_overrides(args: argparse.Namespace) -> dict[str, int | float | None]:
    """The shape flags (add_shape_arguments) by their ModelConfig names; None where not given. The context
    length's flag is --max-context-length: model_config_from_args reads it beside the benchmarked one."""
    return dict(
        d_model=args.d_model,
        d_ff=args.d_ff,
        num_layers=args.num_layers,
        num_heads=args.num_heads,
        vocab_size=args.vocab_size,
        rope_theta=args.rope_theta,
    )


def model_config_from_args(
    args: argparse.Namespace,
    table: SizeTableChoice,
    size: str,
    context_length: int,
    attention: str,
    checkpoint: int | str | None = None,
) -> ModelConfig:
    """The model for one (size, context, attention, checkpointing) in `table` (size_table_of), with the
    shape overrides applied."""
    try:
        return ModelConfig.from_size(
            size,
            table.edition,
            checkpoint_blocks=checkpoint,
            **shape_overrides(args),
            context_length=args.max_context_length or context_length,
            attention=attention,
            fused_projections=args.fused_projections,
        )
    except ConfigError as exc:
        if not str(exc).startswith("unknown model size") or table.why.startswith("--size-table"):
            raise
        raise ConfigError(f"{exc}; {table.line()}") from None  # a table the user did not name: say why


def benchmark_config_from_args(args: argparse.Namespace, model: ModelConfig, **run) -> BenchmarkConfig:
    """One configuration: `model` and this run's values (context_length, batch_size, pass_type,
    precision, compile, device) with the flags every benchmark command shares (add_execution_arguments,
    --compile-scope, --model-factory, --optimizer); a flag left unset (None) keeps the field's default.
    The configuration checks itself (ConfigError): the flags' contradictions are refused there."""
    shared = dict(
        compile_scope=args.compile_scope,
        compile_mode=args.compile_mode,
        cuda_graphs=args.cuda_graphs,
        timer=args.timer,
        warmup_steps=args.warmup_steps,
        measure_steps=args.measure_steps,
        seed=args.seed,
        model_factory=args.model_factory,
        peak=args.peak,
        peak_tflops=args.peak_tflops,
        profile_step=args.profile_step,
        grad_accum_steps=args.grad_accum_steps,
        param_dtype=args.param_dtype,
        target_iqr_pct=args.target_iqr_pct,
        max_measure_s=args.max_measure_s,
    )
    settings = {name: value for name, value in shared.items() if value is not None}
    return BenchmarkConfig(model=model, optimizer_factory=args.optimizer, **{**settings, **run})


def check_runnable(
    config: BenchmarkConfig,
    device,
    check_model_elsewhere: Callable[[BenchmarkConfig], None] | None = None,
) -> None:
    """What a configuration cannot know of itself, checked before any work (the configuration checks
    the rest on construction): its timer and --cuda-graphs on `device`, and the user's code: a
    --model-factory model dry-built and its logits checked (factory.check_user_model in this process,
    or `check_model_elsewhere`: child.check_user_model_in_child for a sweep that keeps the user's code
    out of its own process), an
    --optimizer built and holding what it is given. A UsageError (one line) otherwise; the runner's
    other refusals that depend on the device (a precision, torch.compile) are 'unsupported' rows, as in
    a sweep."""
    if reason := timer_unsupported_reason(config.timer, device):
        raise DeviceError(reason)
    if config.cuda_graphs and (reason := cuda_graphs.unsupported_reason(device)):
        raise DeviceError(reason)
    if config.model_factory and check_model_elsewhere:
        check_model_elsewhere(config)
    elif config.model_factory:
        check_user_model(config.model, config.model_factory, device)
    if config.optimizer_factory:
        check_user_optimizer(config.optimizer_factory)
