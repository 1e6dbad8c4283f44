"""Check the timing engine against known durations and torch.utils.benchmark.

    python scripts/checks/bench_timing.py                 # CPU, writes results/checks/bench_timing_cpu.{csv,md}
    python scripts/checks/bench_timing.py --device cuda   # also: synchronised vs unsynchronised vs CUDA events

Checks, and the accuracy this harness promises for each:
  known-duration error  a sleep / spin of known length, timed by our loop: |median - true| / true < 2%
  engine vs reference   a real model step timed by our loop and by torch.utils.benchmark.Timer,
                        interleaved in rounds to cancel drift: medians within 5%
  harness overhead      wall time per step of our loop around an empty step: < 0.1 ms
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
import torch
import torch.utils.benchmark as torch_benchmark
from tabulate import tabulate

from cs336_bench.config import BenchmarkConfig
from cs336_bench.device import resolve_device
from cs336_bench.factory import build_model
from cs336_bench.models import ModelConfig
from cs336_bench.results import collect_environment
from cs336_bench.results.markdown import write_page
from cs336_bench.results.records import timing_values
from cs336_bench.stats import Summary, summarize
from cs336_bench.step import make_step
from cs336_bench.timing import CudaEventTimer, HostTimer, device_synchronizer, time_steps

RESULTS = Path(__file__).resolve().parents[2] / "results" / "checks"  # the harness checking itself


def spin(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pass


@dataclass
class Check:
    """One row: a check of `workload`, our time against the reference's, and the value judged."""

    check: str
    workload: str
    ours_ms: float
    reference_ms: float | None
    value: float
    unit: str
    target: str
    passed: bool | None
    ours: Summary | None = None  # our samples' statistics, as every result file names them

    def row(self) -> dict:
        row = {k: v for k, v in asdict(self).items() if k != "ours"}
        return {**row, **(timing_values(self.ours) if self.ours else {})}


def percent_off(ours: float, reference: float) -> float:
    return 100 * abs(ours - reference) / reference


def known_duration_rows(measure_steps: int) -> list[Check]:
    rows = []
    workloads = [
        ("sleep 10 ms", 10.0, lambda: time.sleep(0.010)),
        ("sleep 50 ms", 50.0, lambda: time.sleep(0.050)),
        ("spin 5 ms", 5.0, lambda: spin(0.005)),
    ]
    for name, true_ms, step in workloads:
        ours = summarize(time_steps(step, warmup_steps=2, measure_steps=measure_steps, timer=HostTimer()).measured_ms)
        error = percent_off(ours.median, true_ms)
        rows.append(Check("known-duration error", name, ours.median, true_ms, error, "%", "< 2", error < 2, ours))
    return rows


def overhead_row(steps: int) -> Check:
    timer = HostTimer()
    start = time.perf_counter()
    time_steps(lambda: None, warmup_steps=0, measure_steps=steps, timer=timer)
    per_step = (time.perf_counter() - start) * 1e3 / steps
    return Check(
        "harness overhead per step", f"empty step x {steps}", per_step, None, per_step, "ms", "< 0.1", per_step < 0.1
    )


def model_step(device: torch.device, pass_type: str):
    model_config = ModelConfig(d_model=256, d_ff=1024, num_layers=4, num_heads=4, context_length=128)
    config = BenchmarkConfig(
        model=model_config, context_length=128, batch_size=4, pass_type=pass_type, device=str(device)
    )
    model = build_model(model_config, device)
    return make_step(config, model, device), f"d256 L4 ctx128 b4 {pass_type}"


def engine_vs_torch_rows(device: torch.device, rounds: int, steps_per_round: int) -> list[Check]:
    rows = []
    sync = device_synchronizer(device)
    for pass_type in ("forward", "forward-backward"):
        step, label = model_step(device, pass_type)
        ours, theirs = [], []
        # Timer defaults to num_threads=1; give it the threads our loop runs with
        torch_timer = torch_benchmark.Timer(stmt="step()", globals={"step": step}, num_threads=torch.get_num_threads())
        time_steps(step, warmup_steps=3, measure_steps=1, timer=HostTimer(synchronize=sync))
        for _ in range(rounds):  # interleave so slow drift of the machine hits both equally
            ours += time_steps(
                step, warmup_steps=0, measure_steps=steps_per_round, timer=HostTimer(synchronize=sync)
            ).measured_ms
            theirs += [torch_timer.timeit(number=1).median * 1e3 for _ in range(steps_per_round)]
        mine, reference = summarize(ours), summarize(theirs).median
        diff = percent_off(mine.median, reference)
        rows.append(
            Check("median vs torch.utils.benchmark", label, mine.median, reference, diff, "%", "< 5", diff < 5, mine)
        )
    return rows


def cuda_sync_rows(device: torch.device, steps: int) -> list[Check]:
    """Why synchronisation matters: an unsynchronised clock times only the kernel launches."""
    a = torch.randn(8192, 8192, device=device)
    step = lambda: a @ a  # noqa: E731
    for _ in range(3):
        step()
    torch.cuda.synchronize(device)
    synced = summarize(
        time_steps(
            step, warmup_steps=0, measure_steps=steps, timer=HostTimer(synchronize=device_synchronizer(device))
        ).measured_ms
    ).median
    events = summarize(time_steps(step, warmup_steps=0, measure_steps=steps, timer=CudaEventTimer()).measured_ms).median
    unsynced = summarize(time_steps(step, warmup_steps=0, measure_steps=steps, timer=HostTimer()).measured_ms).median
    torch.cuda.synchronize(device)
    diff, workload = percent_off(synced, events), "fp32 8192^3 matmul"
    return [
        Check("host+sync vs CUDA events", workload, synced, events, diff, "%", "< 5", diff < 5),
        Check(
            "unsynchronised host clock (wrong on purpose)",
            *(workload, unsynced, events, 100 * unsynced / events, "% of true", "(shows the bug)", None),
        ),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps-per-round", type=int, default=6)
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    device = resolve_device(args.device)
    torch.manual_seed(0)

    rows = known_duration_rows(measure_steps=20) + [overhead_row(steps=20_000)]
    rows += engine_vs_torch_rows(device, args.rounds, args.steps_per_round)
    if device.type == "cuda":
        rows += cuda_sync_rows(device, steps=20)

    env = collect_environment(device)
    frame = pd.DataFrame([row.row() for row in rows])
    frame.insert(0, "device", str(device))
    frame["device_name"], frame["torch_version"], frame["git_commit"] = (
        env.device_name,
        env.torch_version,
        env.git_commit,
    )
    args.output_dir.mkdir(parents=True, exist_ok=True)
    stem = args.output_dir / f"bench_timing_{device.type}"
    frame.to_csv(stem.with_suffix(".csv"), index=False)
    shown = frame[["check", "workload", "ours_ms", "reference_ms", "value", "unit", "target", "passed"]]
    table = tabulate(shown, headers="keys", tablefmt="github", showindex=False, floatfmt=".4f")
    env_row = {**env.__dict__, "matmul_precision": torch.get_float32_matmul_precision()}
    text = write_page(
        stem.with_suffix(".md"),
        title=f"Timing engine self-benchmark ({device.type})",
        command=f"python scripts/checks/bench_timing.py --device {args.device}",
        body=[table],
        environment=[env_row],
    )
    print(text)
    failed = frame["passed"].eq(False).any()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
