"""attention_bench's work, once its flags are read (cli.py): the grid's rows, measured, written and shown."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from ..adapters import AdapterError, Adapters, load_adapters
from ..argtypes import exit_status, resolve_memory_limit
from ..contention import describe_rows
from ..device import DeviceError, resolve_device
from ..loading import load_callable
from ..memory_cap import soft_address_space_cap
from ..results import (
    ResultFileError,
    ResultSink,
    check_output_path,
    check_output_paths,
    collect_environment,
)
from ..tools import prog
from ..units import format_bytes
from .config import FLASH_IMPLEMENTATIONS, is_custom
from .figure import plot
from .grid import configs_from_args, default_implementations
from .measure import run_attention
from .record import AttentionRecord


def check_implementations(args) -> Adapters | None:
    """Load what the implementations need before any row runs: the adapters module, the callables."""
    implementations = args.implementations or default_implementations(args.adapters)
    for implementation in implementations:
        if is_custom(implementation):
            load_callable(implementation, "--implementations", error=AdapterError)
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


def run_grid(args: argparse.Namespace) -> int:
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
            f"{prog('attention_bench')}: note: sequence lengths up to {max(args.context_lengths)} take hours on a CPU (the defaults are "
            "sized for a GPU); for a quick look: --context-lengths 256 1024 --measure-steps 10",
            file=sys.stderr,
        )
    rows = []
    try:
        with soft_address_space_cap(limit) if limit is not None else contextlib.nullcontext():
            for config in configs:
                record = run_attention(
                    config, environment=env, memory_limit_bytes=limit, adapters=adapters, timeout_s=args.timeout
                )
                sink.write(record)
                rows.append(record.to_row())
                print(_progress(record), file=sys.stderr, flush=True)
    except KeyboardInterrupt:  # Ctrl-C: the rows finished so far, where they are kept without --output too
        if rows:
            print(AttentionRecord.markdown(rows), flush=True)
        raise
    print(AttentionRecord.console(rows, args.all_columns))
    if rows:
        print(describe_rows(rows), file=sys.stderr)  # how busy the machine was, as benchmark and the sweeps end
    if plot_path is not None:
        print(f"wrote {plot(rows, plot_path)}", file=sys.stderr)
    for path in args.output:
        print(f"wrote {path}", file=sys.stderr)
    return exit_status(row["status"] for row in rows)
