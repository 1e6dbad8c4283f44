"""python -m cs336_systems.attention_bench: the flags and main. The flags are read before torch is
imported (a mistyped one is told at once); the work is run.py's."""

from __future__ import annotations

import argparse

from ..adapters import add_adapters_argument
from ..argtypes import (
    PRECISIONS,
    ArgumentParser,
    add_all_columns_argument,
    add_device_argument,
    add_memory_limit_argument,
    add_output_argument,
    add_timeout_argument,
    add_timer_argument,
    non_negative_float,
    output_path,
    positive_int,
    step_count,
    warmup_count,
)
from ..command import Command, add_argument_with_aliases
from ..tools import prog
from .grid import configs_from_args, default_implementations  # noqa: F401  (the handout's planner reads them here)
from .names import IMPLEMENTATIONS, LAYOUTS, is_custom

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
    add_all_columns_argument(parser)
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


def run(args: argparse.Namespace) -> int:
    from .run import run_grid  # torch, once the flags are read

    return run_grid(args)


main = Command(build_parser, run)
