"""Is this machine steady enough to benchmark on? The same fixed matmul block, timed over and over.

    python scripts/checks/cpu_stability.py --seconds 60 --output results/checks/cpu_stability.md

A block is 20 fp32 1024^3 matmuls into a preallocated output: no allocation, no page
faults, no I/O, so its time can only change if the CPU itself is taken away (other
tenants of a shared host, throttling). On a dedicated machine nearly every block takes
the same time; the share of slow blocks is the share of the run during which any
benchmark would have been slowed down too. A machine slowed for the whole run shows up
only against its usual speed: compare the GFLOP/s with a quiet run.
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import numpy as np
import torch

from cs336_bench.results.writing import write_whole


def block_times_ms(seconds: float, size: int = 1024, repeats: int = 20) -> list[float]:
    a, b, out = torch.randn(size, size), torch.randn(size, size), torch.empty(size, size)
    torch.mm(a, b, out=out)  # first call outside the timing
    times, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.perf_counter()
        for _ in range(repeats):
            torch.mm(a, b, out=out)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def gflops(block_ms: float, size: int = 1024, repeats: int = 20) -> float:
    return 2 * repeats * size**3 / (block_ms / 1e3) / 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--output", type=Path, help="write the summary (Markdown) here too")
    args = parser.parse_args()
    times = np.array(block_times_ms(args.seconds))
    median = float(np.median(times))
    lines = [
        "# CPU stability",
        "",
        f"Command: `python scripts/checks/cpu_stability.py --seconds {args.seconds:g}`; {platform.node()}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}.",
        "",
        f"- blocks: {len(times)} of 20 fp32 1024^3 matmuls; {gflops(times.min()):.0f} GFLOP/s at the fastest block, "
        f"{gflops(median):.0f} at the median (compare with what this CPU reaches on a quiet day)",
        f"- median {median:.1f} ms, min {times.min():.1f} ms, max {times.max():.1f} ms "
        f"(max/min {times.max() / times.min():.1f}x)",
        f"- blocks slower than 2x the median: {100 * np.mean(times > 2 * median):.0f}%",
        f"- blocks slower than 1.2x the minimum: {100 * np.mean(times > 1.2 * times.min()):.0f}%",
        "",
        "Block times in order (ms): " + " ".join(f"{t:.0f}" for t in times),
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        write_whole(args.output, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
