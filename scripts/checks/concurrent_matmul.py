"""Do N processes compute N times as much as one? A CPU check behind ddp_bench's compute_slowdown.

    python scripts/checks/concurrent_matmul.py --processes 2 --trials 3

Each trial: one process alone, then N processes at once, each running single-threaded
float32 2048^3 matmuls for a fixed count; prints GFLOP/s per process. On a machine whose
cores are really independent the concurrent figures equal the lone one; on a shared VM
whose vCPUs share a physical core they drop to 1/N of it, and data-parallel ranks on that
machine cannot scale their compute whatever the communication does.
"""

from __future__ import annotations

import multiprocessing as mp
import time

from cs336_bench.argtypes import ArgumentParser, positive_int

N = 2048
REPEATS = 10


def gflops(start_together, results) -> None:
    import torch

    torch.set_num_threads(1)
    a = torch.randn(N, N)
    for _ in range(2):
        a @ a
    start_together.wait()  # every process is warm before any starts the clock
    start = time.perf_counter()
    for _ in range(REPEATS):
        a @ a
    results.put(2 * N**3 * REPEATS / (time.perf_counter() - start) / 1e9)


def run(processes: int) -> list[float]:
    context = mp.get_context("spawn")
    start_together, results = context.Barrier(processes), context.Queue()
    workers = [context.Process(target=gflops, args=(start_together, results)) for _ in range(processes)]
    for worker in workers:
        worker.start()
    values = [results.get() for _ in workers]
    for worker in workers:
        worker.join()
    return values


def main() -> None:
    parser = ArgumentParser(prog="python scripts/checks/concurrent_matmul.py", description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=positive_int, default=2)
    parser.add_argument("--trials", type=positive_int, default=3)
    args = parser.parse_args()
    for trial in range(1, args.trials + 1):
        [alone] = run(1)
        together = run(args.processes)
        shown = " + ".join(f"{value:.0f}" for value in together)
        print(
            f"trial {trial}: alone {alone:.0f} GFLOP/s; {args.processes} at once {shown} GFLOP/s "
            f"({sum(together) / alone:.2f}x one process)",
            flush=True,
        )


if __name__ == "__main__":
    main()
