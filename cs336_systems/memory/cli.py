"""python -m cs336_systems.memory: predict the memory of one step of the built-in model.

    cs336-bench memory --model-size xl --context-length 512 --batch-size 4 \\
        --precision fp32 --pass-type forward-backward --device-memory 16GiB
"""

from __future__ import annotations

import argparse
import json

from tabulate import tabulate

from ..anomalies import fast_path_flags
from ..argtypes import ArgumentParser, byte_size, positive_int
from ..benchmark_flags import (
    add_checkpoint_argument,
    add_model_arguments,
    add_shape_arguments,
    announce_size_table,
    model_config_from_args,
    size_table_of,
)
from ..command import Command
from ..config import PARAM_DTYPES
from ..errors import UsageError
from ..tools import prog
from ..units import format_bytes
from .estimate import FIND_MAX_LIMIT, MemoryEstimate, estimate_memory, find_max_by_prediction


def format_estimate(estimate: MemoryEstimate, title: str, param_dtype: str = "fp32") -> str:
    masters = " + fp32 master weights" if param_dtype != "fp32" else ""
    rows = [
        (f"parameters ({param_dtype})", estimate.parameters),
        (f"gradients ({param_dtype})", estimate.gradients),
        (f"optimizer state (AdamW, fp32{masters})", estimate.optimizer_state),
        *((f"activations saved for backward: {name}", value) for name, value in estimate.activations.items()),
        ("autocast weight copies", estimate.autocast_weight_copies),
        ("logits and loss", estimate.logits_and_loss),
    ]
    body = [(name, format_bytes(value), value) for name, value in rows if value]
    body += [
        (
            f"peak of the step timeline (at: {estimate.peak_phase})",
            format_bytes(estimate.peak_bytes),
            estimate.peak_bytes,
        ),
        (
            "workspace margin (context, workspaces, fragmentation)",
            format_bytes(estimate.workspace_margin),
            estimate.workspace_margin,
        ),
        ("total", format_bytes(estimate.total_bytes), estimate.total_bytes),
    ]
    table = tabulate(body, headers=["component", "size", "bytes"], tablefmt="github", disable_numparse=True)
    lines = [f"# Memory estimate: {title}", "", table, ""]
    lines.append(
        "Components do not simply add up: gradients appear while backward frees activations, "
        "so the peak comes from the step timeline."
    )
    if estimate.fits is not None:
        verdict = "fits" if estimate.fits else "does NOT fit"
        lines.append(
            f"Verdict: {verdict} in {format_bytes(estimate.device_memory_bytes)} "
            f"(needs {format_bytes(estimate.total_bytes)})."
        )
    return "\n".join(lines)


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog=prog("memory"), description="Predict the memory of one step of the built-in model.")
    add_model_arguments(parser)
    parser.add_argument(
        "--device-type",
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="the device the estimate is for (cuda)",
    )
    parser.add_argument("--device-memory", type=byte_size, help="e.g. 16GiB, 80GB: gives a fits / does not fit verdict")
    parser.add_argument("--first-step", action="store_true", help="the first train-step (no optimizer state yet)")
    parser.add_argument(
        "--grad-accum-steps",
        type=positive_int,
        default=1,
        metavar="K",
        help="K micro-batches of --batch-size per optimizer step",
    )
    parser.add_argument(
        "--param-dtype",
        choices=PARAM_DTYPES,
        default="fp32",
        help="bf16: parameters and gradients in bf16, fp32 master weights in the optimizer",
    )
    parser.add_argument("--find-max", choices=("batch-size", "context-length"))
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    add_checkpoint_argument(parser)
    add_shape_arguments(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    device_memory = args.device_memory
    if args.find_max and device_memory is None:
        raise UsageError("--find-max needs --device-memory")
    if args.model_factory:
        raise UsageError("the estimator models the built-in Transformer only; drop --model-factory")

    table = size_table_of(args, [args.model_size])
    # in and after a search over contexts, the model is as long as each context tried (not --max-context-length)
    sized_to_context = args.find_max == "context-length"

    def estimate_for(
        batch: int, context: int, attention: str = args.attention, after_search: bool = False
    ) -> MemoryEstimate:
        model = model_config_from_args(args, table, args.model_size, context, attention, args.checkpoint_blocks)
        if after_search and sized_to_context:
            model = model.replace(context_length=context)
        model.check_context(context)
        return estimate_memory(
            model,
            batch,
            context,
            args.pass_type,
            args.precision,
            args.device_type,
            device_memory,
            first_step=args.first_step,
            grad_accum_steps=args.grad_accum_steps,
            param_dtype=args.param_dtype,
        )

    estimate = estimate_for(args.batch_size, args.context_length)
    announce_size_table(table)

    largest = None
    if args.find_max == "batch-size":
        largest = find_max_by_prediction(
            lambda b: estimate_for(b, args.context_length), "batch-size", args.batch_size, device_memory
        )
    elif sized_to_context:
        largest = find_max_by_prediction(
            lambda t: estimate_for(args.batch_size, t, after_search=True),
            "context-length",
            args.context_length,
            device_memory,
        )
    other = "naive" if args.attention == "sdpa" else "sdpa"
    alternative = estimate_for(args.batch_size, args.context_length, other, after_search=True)
    checkpointing = f" checkpoint-blocks {args.checkpoint_blocks}" if args.checkpoint_blocks else ""
    fast = fast_path_flags(
        dict(
            grad_accum_steps=args.grad_accum_steps,
            param_dtype=args.param_dtype,
            fused_projections=args.fused_projections,
        )
    )
    title = (
        f"{table.edition} {args.model_size}{checkpointing} context {args.context_length} batch {args.batch_size} {args.pass_type} "
        f"{args.precision} {args.attention} on {args.device_type}" + (f" {fast}" if fast else "")
    )
    if args.json:
        out = {
            "config": title,
            "size_table": table.edition,
            **estimate.as_dict(),
            f"total_bytes_with_{other}_attention": alternative.total_bytes,
        }
        if args.find_max:
            out["find_max"] = {"dimension": args.find_max, "largest_that_fits": largest}
        if largest is not None and largest >= FIND_MAX_LIMIT:  # the cap fits: the answer is not the cap
            out["find_max"] = {"dimension": args.find_max, "largest_that_fits": None, "at_least": largest}
        print(json.dumps(out))
    else:
        print(format_estimate(estimate, title, args.param_dtype))
        print(
            f"With --attention {other} instead: {format_bytes(alternative.total_bytes)} "
            f"(activations {format_bytes(sum(alternative.activations.values()))})."
        )
        if args.find_max:
            print(f"Largest {args.find_max} that fits by prediction: {describe_largest(largest)}")
    return 0


main = Command(build_parser, run)


def describe_largest(largest: int | None) -> str:
    if largest is None:
        return "none (the starting value does not fit)"
    if largest >= FIND_MAX_LIMIT:
        return f"more than {FIND_MAX_LIMIT - 1} (the search stops at {FIND_MAX_LIMIT}, which fits too)"
    return str(largest)
