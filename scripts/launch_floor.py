"""Why the H100 sweep's bf16 rows look broken: each step's kernel launches against its time.

    python scripts/launch_floor.py                                   # results/gpu_sweep_h100.csv
    python scripts/launch_floor.py --results results/gpu_sweep_h100.csv --output-dir results

For each size of the sweep, counts the operators one forward and one forward-backward step
dispatches that make a tensor of their own (views excluded: no kernel), in fp32 and under bf16
autocast, with a dispatch mode on this CPU (the forward under no_grad: inference mode would keep
linear and the autocast casts as single composite operators, which a GPU runs as several kernels). The count depends on the model's depth and structure,
not its width, so the model runs at the sweep's depth and a tiny width. Then, per sweep row: the
step's time, the time its FLOPs take at the device's dense peak (the row's own flops_per_step and
peak_tflops), and the step's time per operator. Where a step takes far longer than its FLOPs and
its time per operator is the same across sizes and contexts, the step is bound by launching
operators, not by the GPU. Caveat: CUDA autocast's cast list is not the CPU's, so a bf16 step on
the GPU may dispatch a few more or fewer casts per block than counted here.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import pandas as pd
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cs336_bench.config import BenchmarkConfig
from cs336_bench.factory import build_model
from cs336_bench.models import ModelConfig
from cs336_bench.optimizer import make_optimizer
from cs336_bench.precision import autocast
from cs336_bench.results.markdown import write_page
from cs336_bench.results.writing import write_whole
from cs336_bench.step import make_step

PROG = "python scripts/launch_floor.py"
REPO = Path(__file__).resolve().parent.parent


class CountKernels(TorchDispatchMode):
    """Counts the aten operators that produce new tensors (a view launches no kernel)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not getattr(func, "is_view", False) and func.__name__ not in ("detach.default", "alias.default"):
            self.count += 1
        return func(*args, **(kwargs or {}))


def operators_per_step(row: dict, pass_type: str, precision: str) -> int:
    """Operators of one step of the row's model depth, at a tiny width on this CPU."""
    heads = int(row["num_heads"])
    model = ModelConfig(
        d_model=4 * heads,
        d_ff=8,
        num_layers=int(row["num_layers"]),
        num_heads=heads,
        vocab_size=64,
        context_length=16,
    )
    config = BenchmarkConfig(
        model=model, context_length=16, batch_size=1, pass_type=pass_type, precision=precision, device="cpu"
    )
    net = build_model(model, "cpu")
    optimizer = make_optimizer(net, config) if pass_type == "train-step" else None
    step = make_step(config, net, torch.device("cpu"), optimizer)
    if pass_type == "forward":  # inference mode keeps composite ops (linear, to) whole on the CPU: no_grad
        tokens = torch.zeros(1, 16, dtype=torch.long)  # decomposes them into kernels as a GPU runs them

        def step() -> None:
            with torch.no_grad(), autocast(precision, torch.device("cpu")):
                net(tokens)

    step()  # the first step creates optimizer state and caches; count a steady one
    with CountKernels() as counter:
        step()
    return counter.count


def launch_table(rows: pd.DataFrame) -> pd.DataFrame:
    counts: dict[tuple, int] = {}
    out = []
    for row in rows.to_dict("records"):
        key = (row["num_layers"], row["num_heads"], row["pass_type"], row["precision"])
        if key not in counts:
            counts[key] = operators_per_step(row, row["pass_type"], row["precision"])
        flops_ms = 1e3 * row["flops_per_step"] / (row["peak_tflops"] * 1e12)
        out.append(
            {
                "model_size": row["model_size"],
                "pass_type": row["pass_type"],
                "precision": row["precision"],
                "context_length": row["context_length"],
                "operators_per_step": counts[key],
                "step_ms": row["mean_ms"],
                "cv_pct": row["cv_pct"],
                "flops_at_peak_ms": flops_ms,
                "us_per_operator": 1e3 * row["mean_ms"] / counts[key],
            }
        )
    return pd.DataFrame(out)


def summary(table: pd.DataFrame) -> str:
    """One paragraph of what the table shows, from its numbers (the report beside it quotes it): the
    cost per operator of the steps whose FLOPs at peak take under a third of their time."""
    lines = []
    for precision in ("bf16", "fp32"):
        rows = table[(table["precision"] == precision) & (table["pass_type"] == "forward-backward")]
        light = rows[rows["flops_at_peak_ms"] < rows["step_ms"] / 3]
        if light.empty:
            continue
        per_size = rows.groupby("model_size", sort=False)["operators_per_step"].first()
        counts = ", ".join(f"{n:,} for {size}" for size, n in per_size.items())
        lines.append(
            f"{precision} forward-backward steps whose FLOPs at peak take under a third of their time "
            f"({len(light)} of {len(rows)}) cost {light['us_per_operator'].min():.0f} to "
            f"{light['us_per_operator'].max():.0f} us per dispatched operator ({counts})"
        )
    return (
        f"Launches against step time (operators counted on a CPU at each size's depth, {PROG}): "
        + "; ".join(lines)
        + ". A cost per operator that stays put across sizes and contexts is the host launching operators; "
        "one that grows with the work is the GPU computing."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=Path, default=REPO / "results" / "gpu_sweep_h100.csv")
    parser.add_argument("--output-dir", type=Path, default=REPO / "results")
    parser.add_argument("--summary", type=Path, help="also write the one-paragraph summary here (a report's --note)")
    args = parser.parse_args(argv)
    if not args.results.is_file():
        print(f"{PROG}: error: --results {args.results}: no such file", file=sys.stderr)
        return 2
    rows = pd.read_csv(args.results)
    rows = rows[rows["status"] == "ok"]
    table = launch_table(rows)
    stem = args.output_dir / "launches"
    table.to_csv(stem.with_suffix(".csv"), index=False)
    body = [
        "Operators per step counted on this CPU (views excluded); the step's time and the time its FLOPs "
        "take at the row's dense peak from the sweep's own rows.",
        "",
        table.to_markdown(index=False, floatfmt=".3g"),
        "",
    ]
    for (size, pass_type, precision), group in table.groupby(["model_size", "pass_type", "precision"], sort=False):
        ratio = (group["step_ms"] / group["flops_at_peak_ms"]).min()
        body.append(
            f"- {size} {pass_type} {precision}: {int(group['operators_per_step'].iloc[0])} operators per step; "
            f"{group['us_per_operator'].min():.1f} to {group['us_per_operator'].max():.1f} us per operator; "
            f"the step takes at least {ratio:.1f}x its FLOPs at peak"
        )
    body += ["", summary(table)]
    if args.summary:
        write_whole(args.summary, summary(table) + "\n")
    environment = rows[["device_name", "torch_version", "git_commit"]].drop_duplicates().to_dict("records")
    command = shlex.join([*PROG.split(), *(argv if argv is not None else sys.argv[1:])])
    print(
        write_page(
            stem.with_suffix(".md"),
            title="Launches against step time: the H100 sweep",
            command=command,
            body=body,
            environment=environment,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
