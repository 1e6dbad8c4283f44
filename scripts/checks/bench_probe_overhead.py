"""The probe's own cost per step on a CPU (target: < 0.1 ms per step).

    python scripts/checks/bench_probe_overhead.py --output results/checks/probe_overhead_cpu.csv \\
        --output results/checks/probe_overhead_cpu.md

An empty loop body, so whatever time the probed loop takes beyond the plain loop is the
probe's: the wrapped loader's two clock reads, each phase's two, step()'s bookkeeping, and per
window the record, the CSV write and the summary line (amortised over the window's steps).
Each repeat times the plain loop and the probed loop back to back; the median of the
repeats' differences is reported, so a burst of load from other processes moves one repeat,
not the figure.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from cs336_bench.device import resolve_device
from cs336_bench.probe import StepProbe
from cs336_bench.results import Record, ResultFileError, ResultSink, collect_environment

TARGET_MS = 0.1
PHASES = ("forward", "backward", "optimizer")


@dataclass
class OverheadRecord(Record):
    case: str
    phases: int
    window: int
    writes_csv: bool
    steps: int
    repeats: int
    plain_us_per_step: float
    probed_us_per_step: float
    overhead_ms_per_step: float  # median over repeats of (probed - plain) / steps
    overhead_max_ms_per_step: float
    target_ms: float
    passed: bool
    load_avg_1min: float  # of the machine, when the case finished: other processes' share of the cores

    title: ClassVar[str] = "probe overhead per step (CPU)"
    markdown_columns: ClassVar[tuple[str, ...]] = (
        "case",
        "phases",
        "window",
        "writes_csv",
        "steps",
        "repeats",
        "plain_us_per_step",
        "probed_us_per_step",
        "overhead_ms_per_step",
        "overhead_max_ms_per_step",
        "target_ms",
        "passed",
        "load_avg_1min",
    )
    label_columns: ClassVar[tuple[str, ...]] = ("case",)
    conventions: ClassVar[str] = (
        "overhead_ms_per_step: median over repeats of (probed loop - plain loop) / steps, an empty loop "
        "body; overhead_max_ms_per_step: the worst repeat."
    )


def plain_loop(steps: int, phases: int) -> float:
    start = time.perf_counter()
    for _ in iter(range(steps)):
        for _ in PHASES[:phases]:
            pass
    return time.perf_counter() - start


def probed_loop(probe: StepProbe, steps: int, phases: int) -> float:
    start = time.perf_counter()
    for _ in probe.loader(range(steps)):
        for name in PHASES[:phases]:
            with probe.phase(name):
                pass
        probe.step()
    return time.perf_counter() - start


def measure(case: str, phases: int, window: int, csv_dir: Path | None, steps: int, repeats: int, env) -> OverheadRecord:
    plain, probed = [], []
    for repeat in range(repeats):
        output = None if csv_dir is None else csv_dir / f"{case}_{repeat}.csv"
        probe = StepProbe(output=output, window=window, print_fn=lambda line: None, environment=env)
        plain.append(plain_loop(steps, phases))
        probed.append(probed_loop(probe, steps, phases))
        probe.close()
    overheads = [1e3 * (p - q) / steps for p, q in zip(probed, plain)]
    median = statistics.median(overheads)
    return OverheadRecord(
        status="ok",
        case=case,
        phases=phases,
        window=window,
        writes_csv=csv_dir is not None,
        steps=steps,
        repeats=repeats,
        plain_us_per_step=1e6 * statistics.median(plain) / steps,
        probed_us_per_step=1e6 * statistics.median(probed) / steps,
        overhead_ms_per_step=median,
        overhead_max_ms_per_step=max(overheads),
        target_ms=TARGET_MS,
        passed=median < TARGET_MS,
        load_avg_1min=os.getloadavg()[0],
        environment=env,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--output", action="append", default=[], help=".csv or .md; repeatable")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.repeats < 1:
        print("bench_probe_overhead: --steps and --repeats must be at least 1", file=sys.stderr)
        return 2
    try:
        sink = ResultSink(args.output, OverheadRecord)
    except ResultFileError as exc:
        print(f"bench_probe_overhead: error: {exc}", file=sys.stderr)
        return 2
    env = collect_environment(resolve_device("cpu"))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cases = [
            ("loader+step", 0, 50, None),
            ("loader+3 phases+step", 3, 50, None),
            ("loader+3 phases+step, CSV every 50 steps", 3, 50, Path(tmp)),
            ("loader+3 phases+step, CSV every 10 steps", 3, 10, Path(tmp)),
        ]
        for case, phases, window, csv_dir in cases:
            record = measure(case, phases, window, csv_dir, args.steps, args.repeats, env)
            sink.write(record)
            rows.append(record.to_row())
            print(
                f"{case}: {1e3 * record.overhead_ms_per_step:.1f} us/step (worst repeat "
                f"{1e3 * record.overhead_max_ms_per_step:.1f})",
                file=sys.stderr,
            )
    print(OverheadRecord.markdown(rows))
    return 0 if all(row["passed"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
