"""python -m cs336_systems.run_benchmarks: a grid of configurations, each in a fresh process.

An out-of-memory, a segfault or a hang in one configuration cannot touch the next:
each runs `python -m cs336_systems.benchmark` in its own process session; --timeout
kills it and all its children (status 'timeout'); a child that dies without a row gives
status 'error' with the last lines of its stderr. --memory-limit (CPU) emulates a
smaller machine.

Example:
    cs336-bench run_benchmarks --model-sizes small medium large xl 2.7B \
        --context-lengths 128 256 512 1024 --precisions fp32 bf16 --timeout 600 \
        --output results/sweep.csv --output results/sweep.md
"""

from __future__ import annotations

from . import sweep_jobs
from .child import benchmark_command, run_in_child
from .command import Command
from .sweep import sweep_command
from .tools import prog

PROG = prog("run_benchmarks")


def execute(pending, args, env, writer, limits) -> None:
    for config in pending:
        if not writer.start(config):
            return
        record = run_in_child(config, limits, env)
        env = record.environment or env  # for the rows of children that write none
        writer.write(record)
        if record.status != "ok":
            writer.log(f"{record.status}: run it alone with\n  {benchmark_command(config, limits)}")


build_parser, run = sweep_command(PROG, __doc__.split("\n")[0], execute, child_processes=True, run_jobs=sweep_jobs.run)
main = Command(build_parser, run)

if __name__ == "__main__":
    main.start()
