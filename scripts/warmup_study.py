"""The handout's warmup experiment: 0, 1, 2 and 5 warmup steps, then 10 measured steps.

    python scripts/warmup_study.py                                  # CPU, small, context 128
    python scripts/warmup_study.py --device cuda --context-length 512

Each warmup count runs in a fresh process (as run_benchmarks does): in one process the
first run would warm the kernels, caches and allocator for the others, and "0 warmup
steps" would not be cold. Every step's time is kept. Writes results/warmup_study_<device>
.csv (every step), .md (mean, std, CV of the measured steps per warmup count) and .png
(step index against time, log scale, so the first steps stay visible).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from tabulate import tabulate  # noqa: E402

from cs336_systems.models import ModelConfig  # noqa: E402
from cs336_systems.results import collect_environment, environment_lines  # noqa: E402
from cs336_systems.runner import BenchmarkConfig, resolve_device  # noqa: E402
from cs336_systems.stats import summarize  # noqa: E402
from cs336_systems.sweep import ChildLimits, run_in_child  # noqa: E402

RESULTS = Path(__file__).resolve().parent.parent / "results"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model-size", default="small")
    parser.add_argument("--context-length", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--pass-type", default="forward-backward")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--warmups", type=int, nargs="+", default=[0, 1, 2, 5])
    parser.add_argument("--measure-steps", type=int, default=10)
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    device = resolve_device(args.device)
    env = collect_environment(device)
    model = ModelConfig.from_size(args.model_size, context_length=args.context_length)

    steps, summary = [], []
    for warmup in args.warmups:
        config = BenchmarkConfig(model=model, context_length=args.context_length, batch_size=args.batch_size,
                                 pass_type=args.pass_type, precision=args.precision, device=str(device),
                                 warmup_steps=warmup, measure_steps=args.measure_steps)  # fmt: skip
        record = run_in_child(config, ChildLimits(), env)
        if record.status != "ok":
            print(f"warmup {warmup}: {record.status}: {record.error}", file=sys.stderr)
            return 1
        times = [*record.warmup_step_ms, *record.step_ms]
        for index, ms in enumerate(times):
            steps.append(dict(warmup_steps=warmup, step_index=index, measured=index >= warmup, step_ms=ms))
        stats = summarize(record.step_ms)
        summary.append(dict(warmup_steps=warmup, mean_ms=stats.mean, std_ms=stats.std, cv_pct=stats.cv_pct,
                            median_ms=stats.median, first_measured_ms=record.step_ms[0],
                            max_over_median=stats.max / stats.median))  # fmt: skip
        print(summary[-1], file=sys.stderr, flush=True)

    args.output_dir.mkdir(parents=True, exist_ok=True)
    stem = args.output_dir / f"warmup_study_{device.type}"
    pd.DataFrame(steps).to_csv(stem.with_suffix(".csv"), index=False)

    fig, ax = plt.subplots(figsize=(8, 4.5))
    frame = pd.DataFrame(steps)
    for warmup, rows in frame.groupby("warmup_steps"):
        line = ax.plot(rows["step_index"], rows["step_ms"], marker="o", label=f"{warmup} warmup steps")[0]
        warm = rows[~rows["measured"]]
        ax.scatter(warm["step_index"], warm["step_ms"], s=80, facecolors="none", edgecolors=line.get_color())
    ax.set(yscale="log", xlabel="step index (hollow markers: warmup steps, not summarised)", ylabel="step time (ms)")
    ax.set_title(f"{args.model_size} {args.pass_type} {args.precision}, context {args.context_length}, "
                 f"batch {args.batch_size} on {env.device_name}", fontsize=9)  # fmt: skip
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(stem.with_suffix(".png"), dpi=110)
    plt.close(fig)

    command = "python scripts/warmup_study.py " + " ".join(sys.argv[1:])
    text = "\n".join([
        f"# Warmup study ({device.type})", "", f"Command: `{command.strip()}`", "",
        f"{args.model_size}, {args.pass_type}, {args.precision}, context {args.context_length}, batch "
        f"{args.batch_size}; each warmup count in a fresh process; statistics over the {args.measure_steps} "
        "measured steps.", "",
        tabulate(summary, headers="keys", tablefmt="github", floatfmt=".2f"), "",
        f"![step time by index]({stem.with_suffix('.png').name})", "",
        "Environment:", "", *environment_lines([env.__dict__]), "",
    ])  # fmt: skip
    stem.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
