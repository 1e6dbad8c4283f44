"""Every command against a table of bad inputs: each must end as one line on stderr and exit 2.

    PYTHONPATH=$PWD python scripts/bad_inputs.py [--jobs 2] [--output results/checks/bad_inputs.md]

A case passes when the command exits 2, prints exactly one line on stderr and no traceback. Every
case carries the tiny model's flags and --device cpu, so a bad input that is not refused runs a few
seconds of work and fails the case (the point: bad input is refused before any work starts).
probe has no command line (it is a library), so it has no row here.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

TINY = ["--d-model", "32", "--d-ff", "64", "--num-layers", "2", "--num-heads", "2", "--vocab-size", "97"]
RUN = ["--device", "cpu", "--warmup-steps", "1", "--measure-steps", "1"]
CASE_TIMEOUT_S = 40.0  # refusing takes an import of torch; more means work started

# {tmp} is a scratch directory made per run; it holds the files named below (see make_files)
BENCHMARK_LIKE = [
    ["--model-size", "huge"],
    ["--num-heads", "3"],
    ["--rope-theta", "nan"],
    ["--peak-tflops", "-1"],
    ["--peak-tflops", "nan"],
    ["--device", "tpu"],
    ["--device", "cuda:99"],
    ["--timer", "cuda-event"],
    ["--model-factory", "no_such_module:build"],
    ["--model-factory", "os.path"],
    ["--model-factory", "os:no_such_function"],
    ["--output", "/proc/x.csv"],
    ["--output", "{tmp}"],
    ["--output", "{tmp}/out.txt"],
    ["--output", "{tmp}/rows.csv/y.csv"],
    ["--monitor", "/proc/m.csv"],
    ["--monitor-interval", "0"],
    ["--warmup-steps", "-1"],
    ["--measure-steps", "0"],
    ["--seed", "abc"],
]
SWEEP_ONLY = [
    ["--context-lengths", "0"],
    ["--batch-sizes", "-4"],
    ["--precisions", "fp8"],
    ["--compile", "maybe"],
    ["--pass-types", "sideways"],
    ["--output", "{tmp}/other_tool.csv", "--resume"],
]
CHILD_ONLY = [
    ["--timeout", "nan"],
    ["--timeout", "0"],
    ["--timeout", "-5"],
    ["--memory-limit", "0.5"],
    ["--memory-limit", "lots"],
]

TABLE: dict[str, list[list[str]]] = {
    "benchmark": [
        *BENCHMARK_LIKE,
        ["--context-length", "0"],
        ["--batch-size", "-1"],
        ["--precision", "fp8"],
        ["--memory-snapshot", "{tmp}/s.pickle"],
    ],
    "benchmark_direct": [*BENCHMARK_LIKE, *SWEEP_ONLY],
    "run_benchmarks": [*BENCHMARK_LIKE, *SWEEP_ONLY, *CHILD_ONLY],
    "find_max": [
        *(["--dimension", "batch-size", *case] for case in BENCHMARK_LIKE[:12]),
        *(["--dimension", "batch-size", *case] for case in CHILD_ONLY),
        [],  # --dimension is required
        ["--dimension", "width"],
        ["--dimension", "batch-size", "--start", "0"],
        ["--dimension", "batch-size", "--start", "100", "--max", "10"],
        ["--dimension", "batch-size", "--resolution", "0"],
        ["--dimension", "batch-size", "--summary", "/proc/x.json"],
        ["--dimension", "batch-size", "--summary", "{tmp}"],
    ],
    "memory": [
        ["--model-size", "huge"],
        ["--context-length", "0"],
        ["--batch-size", "nan"],
        ["--precision", "fp8"],
        ["--device-type", "tpu"],
        ["--device-memory", "abc"],
        ["--device-memory", "-1GB"],
        ["--device-memory", "0.5"],
        ["--find-max", "batch-size"],
        ["--num-heads", "5"],  # 768 is not a multiple of 5
        ["--model-factory", "no_such_module:build"],
        ["--rope-theta", "nan"],
    ],
    "report": [
        [],
        ["{tmp}/missing.csv"],
        ["{tmp}"],
        ["{tmp}/garbage.csv"],
        ["{tmp}/empty.csv"],
        ["{tmp}/broken.jsonl"],
        ["{tmp}/few_columns.csv"],
        ["{tmp}/rows.csv", "--output", "/proc/r.md"],
        ["{tmp}/rows.csv", "--output", "{tmp}"],
        ["{tmp}/rows.csv", "--output", "{tmp}/r.xyz"],
        ["{tmp}/rows.csv", "--output", "{tmp}/r.csv"],
        ["{tmp}/rows.csv", "--output", "{tmp}/rows.csv/x.md"],
    ],
    "compare": [
        [],
        ["{tmp}/rows.csv"],
        ["{tmp}/missing.csv", "{tmp}/rows.csv"],
        ["{tmp}/rows.csv", "{tmp}/missing.csv"],
        ["{tmp}", "{tmp}/rows.csv"],
        ["{tmp}/garbage.csv", "{tmp}/rows.csv"],
        ["{tmp}/empty.csv", "{tmp}/rows.csv"],
        ["{tmp}/broken.jsonl", "{tmp}/rows.csv"],
        ["{tmp}/few_columns.csv", "{tmp}/rows.csv"],
        ["{tmp}/rows.csv", "{tmp}/rows.csv", "--fail-above", "-5"],
        ["{tmp}/rows.csv", "{tmp}/rows.csv", "--fail-above", "nan"],
        ["{tmp}/rows.csv", "{tmp}/rows.csv", "--fail-above", "abc"],
    ],
    "attention_bench": [
        ["--head-dims", "0"],
        ["--context-lengths", "-8"],
        ["--batch-size", "0"],
        ["--implementations", "flash"],
        ["--precision", "fp8"],
        ["--warmup-steps", "-1"],
        ["--max-seconds", "nan"],
        ["--max-seconds", "-1"],
        ["--memory-limit", "0.5"],
        ["--memory-limit", "lots"],
        ["--device", "cuda:99"],
        ["--timer", "cuda-event"],
        ["--output", "/proc/x.csv"],
        ["--output", "{tmp}"],
        ["--plot", "/proc/x.png"],
        ["--plot", "{tmp}/plot.txt"],
    ],
    "allreduce_bench": [
        ["--backend", "mpi"],
        ["--world-sizes", "0"],
        ["--sizes", "0"],
        ["--sizes", "abc"],
        ["--sizes", "0.5"],
        ["--timeout", "nan"],
        ["--timeout", "0"],
        ["--init-timeout", "-1"],
        ["--threads-per-rank", "0"],
        ["--backend", "nccl", "--device", "cpu"],
        ["--device", "cuda:99"],
        ["--memory-limit", "0.5"],
        ["--warmup-steps", "-1"],
        ["--output", "/proc/x.csv"],
        ["--output", "{tmp}"],
        ["--plot", "/proc/x.png"],
    ],
    "ddp_bench": [
        ["--strategies", "fsdp"],
        ["--bucket-cap-mb", "0"],
        ["--bucket-cap-mb", "nan"],
        ["--model-size", "huge"],
        ["--optimizer", "lion"],
        ["--base-lr", "nan"],
        ["--base-lr", "-1"],
        ["--base-batch-size", "0"],
        ["--context-length", "0"],
        ["--num-heads", "3"],
        ["--model-factory", "no_such_module:build"],
        ["--world-sizes", "0"],
        ["--timeout", "nan"],
        ["--output", "/proc/x.csv"],
        ["--output", "{tmp}"],
    ],
    "loader_bench": [
        ["--storage", "s3"],
        ["--num-items", "0"],
        ["--item-bytes", "0.5"],
        ["--item-bytes", "abc"],
        ["--batch-size", "0"],
        ["--epochs", "0"],
        ["--latency-ms", "-1"],
        ["--latency-ms", "nan"],
        ["--bandwidth", "0"],
        ["--cache-hit-rates", "1.5"],
        ["--compute-ms", "nan"],
        ["--model", "big"],
        ["--dataset", "no_such_module:build"],
        ["--num-workers", "-1"],
        ["--prefetch-factors", "0"],
        ["--pin-memory", "maybe"],
        ["--processes", "0"],
        ["--ram-budget", "0.5"],
        ["--storage", "local", "--data-dir", "/proc/x"],
        ["--output", "/proc/x.csv"],
        ["--monitor", "/proc/m.csv"],
        ["--device", "cuda:99"],
    ],
    "monitor": [
        [],
        ["--"],
        ["--", "no-such-command-xyz"],
        ["--", "{tmp}/not_executable.sh"],
        ["--", "{tmp}"],
        ["--", "{tmp}/garbage.csv"],
        ["--monitor-interval", "0", "--", "true"],
        ["--monitor-interval", "nan", "--", "true"],
        ["--gpus", "-1", "--", "true"],
        ["--output", "/proc/x.csv", "--", "true"],
        ["--output", "{tmp}", "--", "true"],
        ["--output", "{tmp}/m.txt", "--", "true"],
    ],
    "mixed_precision": [
        ["--device", "tpu"],
        ["--device", "cuda:99"],
        ["--device", ""],
        ["--bogus"],
        ["extra"],
    ],
}

# flags every case of a command carries (the tiny model on the CPU), before the bad ones
BASE: dict[str, list[str]] = {
    "benchmark": [*TINY, *RUN, "--context-length", "8", "--batch-size", "2"],
    "benchmark_direct": [*TINY, *RUN, "--context-lengths", "8", "--batch-sizes", "2"],
    "run_benchmarks": [*TINY, *RUN, "--context-lengths", "8", "--batch-sizes", "2"],
    "find_max": [*TINY, *RUN, "--context-length", "8", "--max", "4"],
    "memory": [],
    "report": [],
    "compare": [],
    "attention_bench": ["--device", "cpu", "--head-dims", "8", "--context-lengths", "16", "--batch-size", "1",
                        "--warmup-steps", "1", "--measure-steps", "1"],  # fmt: skip
    "allreduce_bench": ["--device", "cpu", "--world-sizes", "2", "--sizes", "4KB", "--warmup-steps", "1",
                        "--measure-steps", "1"],  # fmt: skip
    "ddp_bench": [*TINY, "--device", "cpu", "--world-sizes", "2", "--context-length", "8", "--batch-size", "2",
                  "--warmup-steps", "1", "--measure-steps", "1"],  # fmt: skip
    "loader_bench": ["--num-items", "16", "--item-bytes", "64", "--batch-size", "4", "--epochs", "1",
                     "--compute-ms", "0", "--device", "cpu"],  # fmt: skip
    "monitor": [],
    "mixed_precision": [],
}


@dataclass
class Outcome:
    command: str
    args: list[str]
    returncode: int | None
    stderr: str
    seconds: float

    @property
    def lines(self) -> list[str]:
        return self.stderr.strip().splitlines()

    @property
    def passed(self) -> bool:
        return self.returncode == 2 and len(self.lines) == 1 and "Traceback" not in self.stderr


def make_results_file(tmp: Path) -> None:
    """rows.csv: a real results file of one tiny benchmark row (report and compare read it)."""
    subprocess.run([sys.executable, "-m", "cs336_systems.benchmark", *BASE["benchmark"], "--output",
                    str(tmp / "rows.csv")], check=True, capture_output=True)  # fmt: skip


def make_files(tmp: Path) -> None:
    """The inputs the table names besides rows.csv: a damaged results file, an empty one, and so on."""
    (tmp / "few_columns.csv").write_text("model_size,status,mean_ms\nsmall,ok,1.5\n")
    (tmp / "garbage.csv").write_text("this is,not\na results file\n")
    (tmp / "empty.csv").write_text("")
    (tmp / "broken.jsonl").write_text('{"model_size": "small", "status": "ok"}\n{not json\n')
    (tmp / "other_tool.csv").write_text("world_size,backend,size_bytes,status\n2,gloo,4096,ok\n")
    script = tmp / "not_executable.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)


def run_case(command: str, args: list[str], tmp: Path) -> Outcome:
    """The command split at `--` (monitor), so the base flags go before the command to run."""
    filled = [arg.replace("{tmp}", str(tmp)) for arg in args]
    argv = [sys.executable, "-m", f"cs336_systems.{command}", *BASE[command], *filled]
    start = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=CASE_TIMEOUT_S, cwd=tmp,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
        returncode, stderr = done.returncode, done.stderr
    except subprocess.TimeoutExpired as exc:
        returncode, stderr = None, f"(no answer within {CASE_TIMEOUT_S:g} s) {exc.stderr or ''}"
    return Outcome(command, args, returncode, stderr, time.monotonic() - start)


def cases(commands: list[str] | None = None) -> list[tuple[str, list[str]]]:
    return [(command, args) for command, table in TABLE.items() if not commands or command in commands
            for args in table]  # fmt: skip


def markdown(outcomes: list[Outcome], seconds: float) -> str:
    passed = sum(o.passed for o in outcomes)
    lines = [
        "# Bad inputs: one line on stderr, exit status 2",
        "",
        f"`PYTHONPATH=$PWD python scripts/bad_inputs.py --output results/checks/bad_inputs.md`: "
        f"**{passed} of {len(outcomes)}** bad inputs end as one line with exit 2 ({seconds:.0f} s on this machine). "
        "Each case also carries the command's tiny-model CPU flags (`BASE` in the script); `{tmp}` is a scratch "
        "directory holding the files `make_files` writes.",
        "",
        "| command | bad input | exit | stderr lines | first line of stderr |",
        "|---|---|---|---|---|",
    ]
    for o in outcomes:
        first = (o.lines[0] if o.lines else "").replace("|", "\\|")[:140]
        mark = "" if o.passed else " **FAIL**"
        args = shlex.join(o.args).replace("|", "\\|") or "(none)"
        lines.append(f"| {o.command}{mark} | `{args}` | {o.returncode} | {len(o.lines)} | {first} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="cases run at once (default 2)")
    parser.add_argument("--commands", nargs="+", choices=tuple(TABLE), help="only these commands")
    parser.add_argument("--output", type=Path, help="write the table as Markdown here")
    args = parser.parse_args()
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bad-inputs-") as tmp:
        make_files(Path(tmp))
        make_results_file(Path(tmp))
        with ThreadPoolExecutor(args.jobs) as pool:
            outcomes = []
            for outcome in pool.map(lambda case: run_case(*case, Path(tmp)), cases(args.commands)):
                outcomes.append(outcome)
                print(f"{'ok  ' if outcome.passed else 'FAIL'} {outcome.command} {shlex.join(outcome.args)}",
                      file=sys.stderr, flush=True)  # fmt: skip
    seconds = time.monotonic() - start
    for o in outcomes:
        if not o.passed:
            print(f"FAIL {o.command} {shlex.join(o.args)}: exit {o.returncode}, {len(o.lines)} lines: "
                  f"{' | '.join(o.lines[-3:])[:300]}", file=sys.stderr)  # fmt: skip
    text = markdown(outcomes, seconds)
    if args.output:
        args.output.write_text(text)
    passed = sum(o.passed for o in outcomes)
    print(f"{passed} of {len(outcomes)} bad inputs end as one line with exit 2 ({seconds:.0f} s)")
    return 0 if passed == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
