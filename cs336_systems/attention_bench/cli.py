"""python -m cs336_systems.attention_bench: the flags and main."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from pathlib import Path

import torch

from ..adapters import AdapterError, Adapters, add_adapters_argument, load_adapters
from ..argtypes import (
    ArgumentParser,
    add_device_argument,
    add_memory_limit_argument,
    add_output_argument,
    exit_status,
    non_negative_float,
    output_path,
    positive_int,
    resolve_memory_limit,
    step_count,
    warmup_count,
)
from ..command import Command, add_argument_with_aliases
from ..device import DeviceError, resolve_device
from ..loading import load_callable
from ..memory_cap import soft_address_space_cap
from ..precision import PRECISIONS
from ..results import (
    ResultFileError,
    ResultSink,
    check_output_path,
    check_output_paths,
    collect_environment,
)
from ..timing import add_timer_argument
from ..tools import prog
from ..units import format_bytes
from ..usercode import add_timeout_argument, import_timeout
from .config import (
    BUILTIN_IMPLEMENTATIONS,
    FLASH_IMPLEMENTATIONS,
    IMPLEMENTATIONS,
    LAYOUTS,
    AttentionConfig,
    is_custom,
)
from .figure import plot
from .measure import run_attention
from .record import AttentionRecord

PROG = prog("attention_bench")


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog=PROG, description="attention alone, forward and backward, per shape")
    add_device_argument(parser)
    add_argument_with_aliases(
        parser, "--head-dims", "--head-dim", type=positive_int, nargs="+", default=[16, 32, 64, 128]
    )
    add_argument_with_aliases(
        parser,
        "--context-lengths",
        "--context-length",
        "--seq-lens",
        type=positive_int,
        nargs="+",
        default=[256, 1024, 4096, 8192, 16384],
        help="sequence lengths (the rows' context_length)",
    )
    parser.add_argument("--batch-size", type=positive_int, default=1)
    parser.add_argument("--num-heads", type=positive_int, default=1, help="heads of (batch, heads, seq, d) inputs (1)")
    parser.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="bhsd",
        help="bhsd: (batch, heads, seq, d); bsd: (batch, seq, d), as the official tests call the adapters (bhsd)",
    )
    parser.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True, help="causal mask (on)")
    add_argument_with_aliases(
        parser,
        "--implementations",
        "--implementation",
        nargs="+",
        type=implementation_name,
        metavar="IMPL",
        help=f"{', '.join(IMPLEMENTATIONS)} or package.module:callable "
        "(called f(q, k, v, is_causal); an autograd.Function class as Fn.apply(q, k, v, "
        "is_causal)) (naive sdpa compiled, and flash-pytorch flash-triton with --adapters)",
    )
    add_adapters_argument(
        parser,
        help="the student's adapters module (dotted name or path to a .py file): flash-pytorch and flash-triton "
        "are its get_flashattention_autograd_function_{pytorch,triton}()",
    )
    add_argument_with_aliases(
        parser,
        "--precisions",
        "--precision",
        nargs="+",
        choices=PRECISIONS,
        default=["fp32"],
        help="dtype of q, k, v: fp32, tf32 (fp32 tensors, TF32 matmuls), bf16 or fp16 (no autocast) (fp32)",
    )
    parser.add_argument("--warmup-steps", type=warmup_count, default=5)
    add_argument_with_aliases(
        parser, "--measure-steps", "--steps", type=step_count, default=100, help="measured steps per pass (100)"
    )
    add_timeout_argument(parser, "per step and per import of your implementation or adapters")
    parser.add_argument(
        "--max-seconds",
        type=non_negative_float,
        default=0.0,
        help="opt-in budget per pass (forward, backward, end-to-end) and per warmup: stop once the steps so far "
        "took this long and at least 3 were measured; the row says how many ran. 0: no limit (0)",
    )
    add_timer_argument(
        parser,
        help="host clock, cuda-event loop, or do-bench: triton.testing.do_bench where Triton and CUDA are there, "
        "else the CUDA-event loop, else host (the row's timer_used says which) (host)",
    )
    add_memory_limit_argument(parser, allow_auto=True)
    parser.add_argument("--seed", type=int, default=0)
    add_output_argument(parser, help="write results to PATH (.csv, .md or .jsonl; repeatable)")
    parser.add_argument(
        "--plot", type=output_path, metavar="PATH.png", help="plot file (default: the first --output with suffix .png)"
    )
    return parser


def implementation_name(text: str) -> str:
    if text in IMPLEMENTATIONS or is_custom(text):
        return text
    raise argparse.ArgumentTypeError(
        f"invalid choice: {text!r} (choose from {', '.join(IMPLEMENTATIONS)} or package.module:callable)"
    )


def default_implementations(adapters: str | None) -> list[str]:
    return list(BUILTIN_IMPLEMENTATIONS) + (list(FLASH_IMPLEMENTATIONS) if adapters else [])


def configs_from_args(args, device: torch.device) -> list[AttentionConfig]:
    """Every configuration of the grid. A flag whose destination is a field's name sets that field (as
    benchmark's do); the grid's values, the resolved device and the flash-only adapters are set per configuration."""
    implementations = args.implementations or default_implementations(args.adapters)
    flags = {
        field.name: getattr(args, field.name) for field in dataclasses.fields(AttentionConfig) if field.name in args
    }
    return [
        AttentionConfig(
            **{
                **flags,
                "implementation": implementation,
                "head_dim": head_dim,
                "context_length": context_length,
                "precision": precision,
                "device": str(device),
                "adapters": args.adapters if implementation in FLASH_IMPLEMENTATIONS else None,
            }
        )
        for precision in args.precisions
        for head_dim in args.head_dims
        for context_length in args.context_lengths
        for implementation in implementations
    ]


def check_implementations(args) -> Adapters | None:
    """Load what the implementations need before any row runs: the adapters module, the callables."""
    implementations = args.implementations or default_implementations(args.adapters)
    for implementation in implementations:
        if is_custom(implementation):
            load_callable(
                implementation, "--implementations", error=AdapterError, timeout_s=import_timeout(args.timeout)
            )
    flash = [name for name in implementations if name in FLASH_IMPLEMENTATIONS]
    if flash and not args.adapters:
        raise AdapterError(f"--implementations {flash[0]} needs --adapters MODULE (the student's adapters module)")
    return load_adapters(args.adapters) if args.adapters else None


def _progress(record: AttentionRecord) -> str:
    label = (
        f"{record.implementation} {record.precision} head_dim={record.head_dim} context_length={record.context_length}"
    )
    if record.forward_mean_ms is None or record.backward_mean_ms is None:
        return f"{label}: {record.status}: {record.error}"
    text = (
        f"{label}: forward {record.forward_mean_ms:.3f} ms, backward {record.backward_mean_ms:.3f} ms, "
        f"before backward {format_bytes(record.memory_before_backward_bytes)}"
    )
    return text if record.status == "ok" else f"{text}; {record.status}: {record.error}"


def run(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    if args.timer == "cuda-event" and device.type != "cuda":
        raise DeviceError("--timer cuda-event needs a CUDA device")
    limit = resolve_memory_limit(args.memory_limit, device.type)
    outputs = check_output_paths(args.output)
    plot_path = Path(args.plot) if args.plot else (outputs[0].with_suffix(".png") if outputs else None)
    if plot_path is not None and plot_path.suffix not in (".png", ".svg", ".pdf"):
        raise ResultFileError(f"--plot {plot_path}: use a .png, .svg or .pdf file")
    if plot_path is not None:
        check_output_path(plot_path, "--plot")
    configs = configs_from_args(args, device)  # each refuses itself
    adapters = check_implementations(args)
    sink = ResultSink(outputs, AttentionRecord)

    env = collect_environment(device)
    if device.type == "cpu" and max(args.context_lengths) >= 4096:
        print(
            f"{PROG}: note: sequence lengths up to {max(args.context_lengths)} take hours on a CPU (the defaults are "
            "sized for a GPU); for a quick look: --context-lengths 256 1024 --measure-steps 10",
            file=sys.stderr,
        )
    rows = []
    with soft_address_space_cap(limit) if limit is not None else contextlib.nullcontext():
        for config in configs:
            record = run_attention(
                config, environment=env, memory_limit_bytes=limit, adapters=adapters, timeout_s=args.timeout
            )
            sink.write(record)
            rows.append(record.to_row())
            print(_progress(record), file=sys.stderr, flush=True)
    print(AttentionRecord.markdown(rows))
    if plot_path is not None:
        print(f"wrote {plot(rows, plot_path)}", file=sys.stderr)
    for path in args.output:
        print(f"wrote {path}", file=sys.stderr)
    return exit_status(row["status"] for row in rows)


main = Command(build_parser, run)
