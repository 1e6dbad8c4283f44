"""The handout's warmup experiment: 0, 1, 2 and 5 warmup steps, then 10 measured steps.

    cs336-bench warmup_study                                  # CPU: small, context 128
    cs336-bench warmup_study --device cuda --context-length 512

Takes every flag of `python -m cs336_systems.benchmark` (size, shape, pass type, precision,
compile, device, ...) except --warmup-steps, which --warmups replaces. Each warmup count
runs in a fresh process (as run_benchmarks does): in one process the first run would warm
the kernels, caches and allocator for the others, and "0 warmup steps" would not be cold.
Every step's time is kept. Writes OUTPUT_DIR/warmup_study_<device>.csv (every step), .md
(mean, std, CV of the measured steps per warmup count) and .png (step index against time,
log scale, so the first steps stay visible); --output also keeps each run's full record.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import pandas as pd
from tabulate import tabulate

from .argtypes import ArgumentParser, non_negative_int
from .benchmark import config_from_args, configuration_parser
from .benchmark_flags import announce_size_table, size_table_of
from .child import ChildLimits, check_user_model_in_child, run_in_child
from .command import Command
from .device import resolve_device
from .models import ConfigError
from .results import (
    ENVIRONMENT_FIELDS,
    ResultSink,
    check_output_paths,
)
from .results.markdown import write_page
from .results.origin import named
from .stats import summarize
from .step import describe_config
from .tools import prog

PROG = prog("warmup_study")
RUN_COLUMNS = (
    "model_size",
    "size_table",
    "context_length",
    "batch_size",
    "pass_type",
    "precision",
    "compile",
    "device",
)


def build_parser() -> ArgumentParser:
    parser = configuration_parser()
    parser.prog, parser.description = PROG, __doc__.split("\n")[0]
    parser.add_argument("--warmups", type=non_negative_int, nargs="+", default=[0, 1, 2, 5], metavar="N")
    parser.add_argument("--output-dir", type=Path, default=Path("results"), help="default results/")
    parser.set_defaults(context_length=128, warmup_steps=None)
    return parser


def run(args: argparse.Namespace) -> int:
    if args.warmup_steps is not None:
        raise ConfigError("--warmup-steps is what this study varies: use --warmups N [N ...]")
    device = resolve_device(args.device)
    table = size_table_of(args, [args.model_size])
    base = config_from_args(args, table=table).replace(device=str(device), warmup_steps=0)
    if args.model_factory:  # dry-built and its logits checked, in a child as the study's runs are
        check_user_model_in_child(base)
    sink = ResultSink(check_output_paths(args.output))
    announce_size_table(table)

    steps, summary, records = [], [], []
    for warmup in args.warmups:
        record = run_in_child(base.replace(warmup_steps=warmup), ChildLimits())
        sink.write(record)
        records.append(record.to_row())
        if record.status != "ok":
            print(f"{PROG}: warmup {warmup}: {record.status}: {record.error}", file=sys.stderr)
            return 1
        times = [*record.warmup_step_ms, *record.step_ms]
        # every row says what ran and where, as every other tool's rows do
        context = {column: records[-1][column] for column in (*RUN_COLUMNS, *ENVIRONMENT_FIELDS)}
        for index, ms in enumerate(times):
            steps.append(dict(warmup_steps=warmup, step_index=index, measured=index >= warmup, step_ms=ms, **context))
        stats = summarize(record.step_ms)
        summary.append(
            dict(
                warmup_steps=warmup,
                mean_ms=stats.mean,
                std_ms=stats.std,
                cv_pct=stats.cv_pct,
                median_ms=stats.median,
                first_measured_ms=record.step_ms[0],
                first_over_median=record.step_ms[0] / stats.median,
                max_over_median=stats.max / stats.median,
            )
        )
        print(
            f"{PROG}: {warmup} warmup steps: median {stats.median:.2f} ms over {len(record.step_ms)} measured steps, "
            f"first measured step {summary[-1]['first_over_median']:.2f}x the median",
            file=sys.stderr,
            flush=True,
        )

    args.output_dir.mkdir(parents=True, exist_ok=True)
    stem = args.output_dir / f"warmup_study_{device.type}"
    pd.DataFrame(named("warmup_study", steps)).to_csv(stem.with_suffix(".csv"), index=False)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    frame = pd.DataFrame(steps)
    for warmup, rows in frame.groupby("warmup_steps"):
        line = ax.plot(rows["step_index"], rows["step_ms"], marker="o", label=f"{warmup} warmup steps")[0]
        warm = rows[~rows["measured"]]
        ax.scatter(warm["step_index"], warm["step_ms"], s=80, facecolors="none", edgecolors=line.get_color())
    ax.set(yscale="log", xlabel="step index (hollow markers: warmup steps, not summarised)", ylabel="step time (ms)")
    ax.set_title(f"{describe_config(base)} on {records[0]['device_name']}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(stem.with_suffix(".png"), dpi=110)
    plt.close(fig)

    command = f"{PROG} {shlex.join(args.argv)}".strip()
    text = write_page(
        stem.with_suffix(".md"),
        title=f"Warmup study ({device.type})",
        command=command,
        body=[
            f"{describe_config(base)} (warmup varied); each warmup count in a fresh process; statistics over the "
            f"{args.measure_steps} measured steps; `first_over_median` = first measured step / median.",
            "",
            tabulate(summary, headers="keys", tablefmt="github", floatfmt=".2f"),
            "",
            f"![step time by index]({stem.with_suffix('.png').name})",
        ],
        environment=records,
    )
    print(text)
    return 0


main = Command(build_parser, run)

if __name__ == "__main__":
    main.start()
