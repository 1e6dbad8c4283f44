"""Every command against a table of bad inputs: each must end as one line on stderr and exit 2,
or, for hostile user code, as the documented row status.

    PYTHONPATH=$PWD python scripts/checks/bad_inputs.py [--jobs 2] [--output results/checks/bad_inputs.md]

A refused case passes when the command exits 2, prints exactly one line on stderr, no traceback,
and that line names the case's own flag (or the file it gave), so a case never passes because
some other flag was refused. (In a case that sets a bad OMP_NUM_THREADS, the OpenMP runtime's
own warning, printed as torch loads and before any of our code runs, is not counted.) Every case
carries the tiny model's flags and --device cpu, so a bad input that is not refused runs a few
seconds of work and fails the case (the point: bad input is refused before any work starts). A `Row` case runs user code that exits, hangs or returns wrong
numbers: it passes when its row in --output has one of the documented statuses and the exit
status follows the one rule (1 for error, timeout, wrong), with no traceback; refusing it before
any work (one line, exit 2) passes too. probe has no command line (it is a library), so it has no
row here.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import runpy
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from cs336_bench.results.writing import write_whole

CASE_TIMEOUT_S = 40.0  # refusing takes an import of torch; more means work started
REPO = Path(__file__).resolve().parents[2]
TINY_RUNS = runpy.run_path(str(REPO / "tests" / "tiny.py"))  # the tests' table of tiny-run flags
TINY, RUN = TINY_RUNS["MODEL"], [*TINY_RUNS["CPU"], *TINY_RUNS["STEPS"]]
BENCH = [*TINY, *RUN, *TINY_RUNS["PEAK"]]  # benchmark-like tools: a given MFU peak, no matmul probe
FIXTURES = REPO / "tests" / "fixtures"  # hostile/ holds user code that exits, hangs or lies
HUGE = str(2**62)
LONG_NAME = "n" * 250 + ".csv"  # fits NAME_MAX (255) alone, not as its lock file .NAME.lock


FAILED_STATUSES = (
    "error",
    "timeout",
    "wrong",
    "cancelled",
    "preempted",
)  # the exit rule: a row of these makes the exit status 1


@dataclass
class Row:
    """Hostile user code: the documented outcome is a row with one of `statuses` (exit 1 for error,
    timeout, wrong; 0 for ok) or a refusal before any work. `env` is added to the case's environment."""

    args: list[str]
    statuses: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Env:
    """A bad environment (a stale torchrun variable, garbage in OMP_NUM_THREADS): refused in one
    line naming `names` (the variable); with no `env`, a case whose refusal names `names`."""

    args: list[str]
    env: dict[str, str]
    names: str


# OMP_NUM_THREADS is read only under torchrun (a spawned rank gets --threads-per-rank): garbage in it,
# in an otherwise consistent one-rank torchrun environment
ONE_RANK_TORCHRUN = {
    "RANK": "0",
    "WORLD_SIZE": "1",
    "LOCAL_RANK": "0",
    "MASTER_ADDR": "127.0.0.1",
    "OMP_NUM_THREADS": "lots",
}
# The OpenMP runtime's own warning of such a value, printed as torch loads, before any of our code runs:
# not the tool's line, so not counted (only in a case whose environment sets OMP_NUM_THREADS)
OPENMP_WARNING = "libgomp: Invalid value for environment variable OMP_NUM_THREADS"

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
    ["--measure-steps", str(2**40)],  # passed the integer bound and ran for ever
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

# Paths (planted links, FIFOs, limits, one file twice); files made by make_files.
PATHS = [
    ["--output", "{tmp}/link.csv"],  # a symlink to victim.txt
    ["--output", "{tmp}/dangling.csv"],  # a symlink to a file that does not exist
    ["--output", "{tmp}/full.csv"],  # a symlink to /dev/full
    ["--output", "{tmp}/fifo.csv"],
    ["--output", "{tmp}/new.csv/"],
    ["--output", "{tmp}/" + LONG_NAME],
    ["--output", "{tmp}/" + "d/" * 2100 + "x.csv"],
    ["--output", "{tmp}/lockdir.csv"],  # its .lockdir.csv.lock is a directory
    ["--output", "{tmp}/locklink.csv"],  # its lock sidecar is a symlink to victim.txt
    ["--output", "{tmp}/held.csv"],  # another process (this script) holds its lock
    ["--output", "{tmp}/hard_a.csv", "--output", "{tmp}/hard_b.csv"],  # hard links to one file
]
PATHS_SHORT = [PATHS[0], PATHS[3], PATHS[4], PATHS[7]]
# Fourth round: a CSV another process writes under another name (a hard link to the file it holds).
HARD_LINKED = ["--output", "{tmp}/held_link.csv"]
# Result files that are not what they claim: repeated header, text in a number, other keys, a rendering.
DAMAGED = [
    "header_twice.csv",
    "text_number.csv",
    "short_row.csv",
    "scalar.jsonl",
    "mixed_keys.jsonl",
    "rows.md",
    "markdown_named.csv",
    "not_utf8.csv",
    "fifo.csv",
]
# Hostile user code (tests/fixtures/hostile): its exit, hang or wrong numbers decide nothing.
MODEL_CODE = [
    Row(["--model-factory", "hostile.models:exits"], ("error",)),
    Row(["--model-factory", "hostile.models:exits_3"], ("error",)),
    Row(["--model-factory", "hostile.models:os_exits"], ("error",)),
    Row(["--model-factory", "hostile.models:interrupts"], ("error",)),
    Row(["--model-factory", "hostile.models:hangs", "--timeout", "3"], ("timeout",)),
    Row(["--model-factory", "hostile.models:exits_in_forward"], ("error",)),
    Row(["--model-factory", "hostile.models:os_exits_in_forward"], ("error",)),
    Row(["--model-factory", "hostile.models:hangs_in_forward", "--timeout", "3"], ("timeout",)),
    Row(["--model-factory", "hostile.models:nan_logits"], ("wrong",)),
    Row(["--model-factory", "hostile.exit_at_import:build"], ("error",)),
    Row(["--model-factory", "hostile.os_exit_at_import:build"], ("error",)),
    Row(["--model-factory", "hostile.interrupt_at_import:build"], ("error",)),
    Row(["--model-factory", "hostile.hang_at_import:build", "--timeout", "3"], ("timeout",)),
    Row(["--optimizer", "hostile.optimizers:exits_in_step", "--pass-type", "train-step"], ("error",)),
    Row(["--optimizer", "hostile.optimizers:os_exits_in_step", "--pass-type", "train-step"], ("error",)),
    Row(
        ["--optimizer", "hostile.optimizers:hangs_in_step", "--pass-type", "train-step", "--timeout", "3"], ("timeout",)
    ),
]
# Third round: user code that raises what is not an Exception, leaves a mess, or is written as assignment 1 is.
MODEL_CODE_3 = [
    Row(["--model-factory", "hostile.models:raises_base_exception"], ("error",)),
    Row(["--model-factory", "hostile.models:raises_generator_exit"], ("error",)),
    Row(["--model-factory", "hostile.models:raises_interrupt_subclass"], ("error",)),
    Row(["--model-factory", "hostile.models:leaves_a_mess"], ("ok",)),  # chdir, fork, signals, threads, helpers
    Row(["--model-factory", "hostile.models:assignment1"], ("ok",)),  # device and dtype required
    Row(["--optimizer", "hostile.optimizers:RequiredAdamW", "--pass-type", "train-step"], ("ok",)),
    Row(["--optimizer", "hostile.optimizers:needs_momentum", "--pass-type", "train-step"], ("error",)),
    Row(["--optimizer", "hostile.optimizers:exits", "--pass-type", "train-step"], ("error",)),  # at construction
]
# Fourth round: a model or optimizer wrong before any step is refused up front, in every tool alike.
MODEL_CONTRACT = [
    ["--model-factory", "hostile.models:raises_in_init"],
    ["--model-factory", "hostile.models:returns_its_class"],
    ["--model-factory", "hostile.models:builds_on_meta"],
    ["--model-factory", "hostile.models:wrong_vocabulary"],
    ["--model-factory", "hostile.models:integer_logits"],
    ["--model-factory", "hostile.models:logits_and_aux"],
]
OPTIMIZER_ELSEWHERE = ["--optimizer", "hostile.optimizers:its_own_parameters", "--pass-type", "train-step"]
FAST_PATH = [
    ["--grad-accum-steps", "0"],
    ["--param-dtype", "fp16"],
    ["--fused-projections", "--model-factory", "hostile.models:assignment1"],
    ["--cuda-graphs", "--optimizer", "hostile.optimizers:RequiredAdamW"],
]
# --config: each value checked as its flag (files made by make_files); no BASE flags beside it
CONFIG = [
    ["--config", "{tmp}/bogus_pass.json"],
    ["--config", "{tmp}/accum0.json"],
    ["--config", "{tmp}/neg_peak.json"],
    ["--config", "{tmp}/compile_yes.json"],
    ["--config", "{tmp}/long_context.json"],
    ["--config", "{tmp}/user_code_checkpointed.json"],
    ["--config", "{tmp}/fifo.json"],
    ["--config", "{tmp}/deep.json"],  # nested 200,000 deep
    ["--config", "{tmp}/context_word.json"],  # "context_length": "eight"
    ["--config", "{tmp}/config.json", "--batch-size", "8"],
    ["--config", "{tmp}/config.json", "--model-factory", "hostile.models:exits"],
]
SIZES = [
    ["--d-model", HUGE],
    ["--d-model", str(2**21)],
    ["--num-layers", str(2**20)],
    ["--vocab-size", HUGE],
    ["--warmup-steps", HUGE],
    ["--timeout", "1e20"],
]

TABLE: dict[str, list[list[str] | Row | Env]] = {
    "benchmark": [
        *BENCHMARK_LIKE,
        ["--context-length", "0"],
        ["--batch-size", "-1"],
        ["--precision", "fp8"],
        ["--memory-snapshot", "{tmp}/s.pickle"],
        *PATHS,
        ["--output", "{tmp}/same.csv", "--monitor", "{tmp}/same.csv"],
        ["--monitor", "{tmp}/link.csv"],
        *SIZES,
        ["--batch-size", HUGE],
        ["--context-length", HUGE],
        *MODEL_CODE,
        *MODEL_CODE_3,
        *FAST_PATH,
        HARD_LINKED,
        *MODEL_CONTRACT,
        OPTIMIZER_ELSEWHERE,
        Row(["--model-factory", "hostile.models:half_precision", "--pass-type", "forward"], ("ok",)),
    ],
    # --peak calibrate with a cache it cannot read or write: the row stands, with a note
    "benchmark_peak": [
        Row(["--peak", "calibrate"], ("ok",), env={"CS336_BENCH_CACHE": "{tmp}/victim.txt"}),
        Row(["--peak", "calibrate"], ("ok",), env={"CS336_BENCH_CACHE": "/proc/self"}),
        Row(["--peak", "calibrate"], ("ok",), env={"CS336_BENCH_CACHE": "{tmp}/deep_cache"}),
    ],
    "benchmark_config": CONFIG,
    "benchmark_direct": [
        *BENCHMARK_LIKE,
        *SWEEP_ONLY,
        *PATHS_SHORT,
        *SIZES[:2],
        ["--output", "{tmp}/bench_twice.csv", "--resume"],
        MODEL_CODE[0],
        MODEL_CODE[4],
        MODEL_CODE[8],
        MODEL_CODE[13],
        MODEL_CODE_3[0],
        MODEL_CODE_3[2],
        HARD_LINKED,
        *MODEL_CONTRACT,
    ],
    "run_benchmarks": [
        *BENCHMARK_LIKE,
        *SWEEP_ONLY,
        *CHILD_ONLY,
        *PATHS_SHORT,
        *SIZES[:2],
        ["--timeout", "1e20"],
        ["--output", "{tmp}/bench_twice.csv", "--resume"],
        MODEL_CODE[0],
        MODEL_CODE[2],
        MODEL_CODE[4],
        MODEL_CODE[9],
        MODEL_CODE_3[1],
        MODEL_CODE_3[6],
        *MODEL_CONTRACT[:3],
    ],
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
        ["--dimension", "batch-size", "--summary", "{tmp}/link.csv"],
        ["--dimension", "batch-size", "--summary", "{tmp}/s.json/"],
        ["--dimension", "batch-size", "--summary", "{tmp}/fifo.csv"],
        ["--dimension", "batch-size", "--summary", "{tmp}/sum.json", "--output", "{tmp}/sum.json"],
        ["--dimension", "batch-size", "--max", HUGE],
        ["--dimension", "batch-size", "--timeout", "1e20"],
        ["--dimension", "batch-size", *MODEL_CONTRACT[5]],
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
        ["--d-model", HUGE],
        ["--d-model", str(2**21)],
        ["--batch-size", HUGE],
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
        *([f"{{tmp}}/{name}"] for name in DAMAGED),
        ["{tmp}/rows.csv", "--output", "{tmp}/link.md"],
        ["{tmp}/rows.csv", "--output", "{tmp}/r.md/"],
        ["{tmp}/rows.csv", "--output", "{tmp}/fifo.md"],
        ["{tmp}/rows.md", "--output", "{tmp}/rows.md"],
    ],
    "compare": [
        [],
        Env(["{tmp}/rows.csv"], {}, "new"),  # NEW is missing
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
        *([f"{{tmp}}/{name}", "{tmp}/rows.csv"] for name in DAMAGED),
        ["{tmp}/rows.csv", "{tmp}/header_twice.csv"],
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
        ["--output", "{tmp}/link.csv"],
        ["--output", "{tmp}/fifo.csv"],
        ["--output", "{tmp}/new.csv/"],
        ["--plot", "{tmp}/link.png"],
        ["--head-dims", HUGE],
        ["--context-lengths", HUGE],
        ["--timeout", "1e20"],
        ["--measure-steps", str(2**40)],
        ["--contxt-lengths", "8"],  # a mistyped flag, told before torch is imported
        ["--adapters", "hostile.hang_at_import", "--timeout", "3"],  # the import cut at --timeout
        Row(["--implementations", "hostile.attention:returns_float64"], ("wrong",)),
        Row(["--implementations", "hostile.attention:returns_nan"], ("wrong",)),
        Row(["--implementations", "hostile.attention:exits"], ("error",)),
        Row(["--implementations", "hostile.attention:os_exits"], ("error",)),
        Row(["--implementations", "hostile.attention:interrupts"], ("error",)),
        Row(["--implementations", "hostile.attention:hangs", "--timeout", "3"], ("timeout",)),
        Row(["--implementations", "flash-pytorch", "--adapters", "hostile.adapters_exit"], ("error",)),
        Row(
            ["--implementations", "flash-pytorch", "--adapters", "hostile.adapters_hang", "--timeout", "3"],
            ("timeout",),
        ),
        Row(["--implementations", "flash-pytorch", "--adapters", "hostile.adapters_nan"], ("wrong",)),
        # forward ignores is_causal, backward applies it: judged non-causal as its official test does
        Row(["--implementations", "flash-pytorch", "--adapters", "adapters_causal_backward"], ("ok",)),
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
        ["--world-sizes", "1000"],
        ["--timeout", "1e20"],
        ["--init-timeout", "1e20"],
        ["--sizes", "1e30"],
        ["--measure-steps", str(2**40)],
        ["--output", "{tmp}/fifo.csv"],
        ["--output", "{tmp}/link.csv"],
        Env(
            [],
            {"RANK": "5", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"},
            "RANK",
        ),
        Env([], {**ONE_RANK_TORCHRUN, "MASTER_PORT": "29514"}, "OMP_NUM_THREADS"),
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
        ["--world-sizes", "1000"],
        ["--timeout", "1e20"],
        ["--init-timeout", "1e20"],
        ["--d-model", HUGE],
        ["--output", "{tmp}/new.csv/"],
        ["--output", "{tmp}/dangling.csv"],
        ["--strategies", "naive", "--bucket-cap-mb", "25"],
        ["--strategies", "ddp", "--fsdp-compute-dtype", "bf16"],
        Env(
            [],
            {"RANK": "3", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29512"},
            "RANK",
        ),
        Env(
            ["--init-timeout", "5"],
            {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29513"},
            "MASTER",
        ),  # a leftover rendezvous with no peer: the answer comes within --init-timeout
        Env([], {**ONE_RANK_TORCHRUN, "MASTER_PORT": "29515"}, "OMP_NUM_THREADS"),
        Row(["--strategies", "adapter-ddp-overlap-individual", "--adapters", "hostile.adapters_nan"], ("wrong",)),
        Row(["--strategies", "adapter-ddp-overlap-individual", "--adapters", "hostile.adapters_exit"], ("error",)),
        Row(["--optimizer", "hostile.optimizers:RequiredAdamW"], ("ok",)),  # the same hyperparameters as benchmark
        Row(["--optimizer", "hostile.optimizers:needs_momentum"], ("error",)),
        ["--measure-steps", str(2**40)],
        ["--adapters", "hostile.hang_at_import", "--timeout", "3"],
        ["--optimizer", "hostile.hang_at_import:make", "--timeout", "3"],
        ["--optimizer", "hostile.optimizers:its_own_parameters"],
        MODEL_CONTRACT[5],  # (logits, aux_losses): one line before any rank starts
        MODEL_CONTRACT[0],
        # a real student's ShardedOptimizer without Optimizer.__init__ (no .state); its get_ddp raises:
        # that strategy's row is an error, every other row stands
        Row(
            [
                "--strategies",
                "adapter-ddp",
                "adapter-sharded-optimizer",
                "ddp",
                "--adapters",
                "adapters_sharded_no_init",
            ],
            ("ok", "error"),
        ),
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
        ["--num-items", HUGE],
        ["--output", "{tmp}/link.csv"],
        ["--output", "{tmp}/new.csv/"],
        ["--storage", "local", "--data-dir", "{tmp}/data_link"],  # an item file there is a planted link
        ["--storage", "local", "--data-dir", "{tmp}/victim.txt"],
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
        ["--output", "{tmp}/link.csv", "--", "true"],
        ["--output", "{tmp}/fifo.csv", "--", "true"],
        ["--output", "{tmp}/new.csv/", "--", "true"],
        ["--output", "{tmp}/" + LONG_NAME, "--", "true"],
    ],
    "residuals": [
        ["--context-length", "64", "--max-context-length", "32"],  # longer than the model's maximum
        ["--context-length", HUGE],
        ["--batch-size", HUGE],
        ["--d-model", str(2**21)],
        ["--model-size", "huge"],
        ["--model-factory", "hostile.models:exits"],
    ],
    "handout": [
        ["--budget", "0"],
        ["--budget", ""],
        ["--assume-device", ""],
        ["--output-dir", "{tmp}/victim.txt"],
        ["--output-dir", "{tmp}/handout_theirs"],  # holds a handout_plan.csv handout did not write
        ["--output-dir", "{tmp}/handout_link"],  # its logs/ is a link
        ["--output-dir", "{tmp}/handout_markers"],  # its .handout is a file
        ["--output-dir", "{tmp}/handout_locked"],  # another handout holds it
        ["--output-dir", "{tmp}/handout_marker_dir"],  # a done marker's name is a directory
        ["--output-dir", "{tmp}/" + "d" * 300],  # a name past the filesystem's limit
        ["--output-dir", "{tmp}/" + "d" * 300, "--dry-run"],
        ["--optimizer", "hostile.optimizers:needs_momentum"],
        ["--model-factory", "hostile.hang_at_import:build", "--dry-run", "--timeout", "3"],
    ],
    "cs336-bench": [
        [],
        ["no_such_tool"],
    ],
    "storage": [
        ["serve", "--root", "{tmp}", "--port", "99999"],
        ["serve", "--root", "{tmp}", "--port", "-1"],
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
    "benchmark": [*BENCH, "--context-length", "8", "--batch-size", "2"],
    "benchmark_peak": [*TINY, *RUN, "--context-length", "8", "--batch-size", "2", "--pass-type", "forward"],
    "benchmark_direct": [*BENCH, "--context-lengths", "8", "--batch-sizes", "2"],
    "run_benchmarks": [*BENCH, "--context-lengths", "8", "--batch-sizes", "2"],
    "find_max": [*BENCH, "--context-length", "8", "--max", "4"],
    "memory": [],
    "report": [],
    "compare": [],
    "attention_bench": [*RUN, "--head-dims", "8", "--context-lengths", "16", "--batch-size", "1"],
    "allreduce_bench": [*RUN, "--world-sizes", "2", "--sizes", "4KB"],
    "ddp_bench": [*TINY, *RUN, "--world-sizes", "2", "--context-length", "8", "--batch-size", "2"],
    "loader_bench": [
        "--num-items",
        "16",
        "--item-bytes",
        "64",
        "--batch-size",
        "4",
        "--epochs",
        "1",
        "--compute-ms",
        "0.1",
        "--device",
        "cpu",
    ],
    "monitor": [],
    "residuals": [*TINY, "--context-length", "8", "--batch-size", "2", "--no-compile", "--no-model"],
    "benchmark_config": [],
    "handout": [
        "--edition",
        "2025",
        "--device",
        "cpu",
        "--scale",
        "small",
        "--problems",
        "mixed_precision_accumulation",
    ],
    "cs336-bench": [],
    "mixed_precision": [],
    "storage": [],
}


# The module a command of the table runs (the command's own name when it is not here).
MODULES = {
    "benchmark_config": "cs336_systems.benchmark",
    "benchmark_peak": "cs336_systems.benchmark",
    "cs336-bench": "cs336_bench",
}


@dataclass
class Outcome:
    command: str
    case: list[str] | Row | Env
    returncode: int | None
    stderr: str
    seconds: float
    statuses: list[str] = field(default_factory=list)  # the rows a Row case wrote

    @property
    def args(self) -> list[str]:
        return self.case if isinstance(self.case, list) else self.case.args

    @property
    def lines(self) -> list[str]:
        lines = self.stderr.strip().splitlines()
        if "OMP_NUM_THREADS" in getattr(self.case, "env", {}):
            lines = [line for line in lines if line.strip() and line.strip() != OPENMP_WARNING]
        return lines

    @property
    def refused(self) -> bool:
        return self.returncode == 2 and len(self.lines) == 1 and "Traceback" not in self.stderr

    @property
    def named(self) -> bool:
        """The one line names the case's own flag, variable or file (not another flag's refusal)."""
        names = expected_names(self.case)
        text = _plain(self.lines[0]) if self.lines else ""
        return not names or any(_plain(name) in text for name in names)

    @property
    def passed(self) -> bool:
        if self.refused:
            return self.named
        if isinstance(self.case, Row) and "Traceback" not in self.stderr:
            failed = any(status in FAILED_STATUSES for status in self.statuses)
            return (
                bool(self.statuses)
                and all(s in self.case.statuses for s in self.statuses)
                and self.returncode == (1 if failed else 0)
            )
        return False

    @property
    def shown(self) -> str:
        """What the table shows of the outcome: the refusal's line, or the rows' statuses."""
        if isinstance(self.case, Row) and not self.refused:
            return f"rows: {', '.join(self.statuses) or '(none)'}; " + (self.lines[-1] if self.lines else "")
        return self.lines[0] if self.lines else ""


def _plain(text: str) -> str:
    """Flags and names compared with -, _ and spaces alike (--d-model names d_model)."""
    return text.lower().replace("-", " ").replace("_", " ").strip()


def expected_names(case: list[str] | Row | Env) -> list[str]:
    """What a refusal of this case must name: one of its flags, a file it gave, or the variable
    (never only a BASE flag, which every case of the command shares)."""
    if isinstance(case, Env):
        return [case.names]
    args = case if isinstance(case, list) else case.args
    names = [arg.lstrip("-") for arg in args if arg.startswith("--") and arg != "--"]
    names += [Path(arg.rstrip("/")).name.replace("{tmp}", "bad-inputs") for arg in args if "{tmp}" in arg]
    names += [arg.split(":")[0].split(".")[-1] for arg in args if ":" in arg and "{" not in arg]  # module:callable
    return names


def make_results_file(tmp: Path) -> None:
    """rows.csv: a real results file of one tiny benchmark row (report and compare read it)."""
    subprocess.run(
        [sys.executable, "-m", "cs336_systems.benchmark", *BASE["benchmark"], "--output", str(tmp / "rows.csv")],
        check=True,
        capture_output=True,
    )


def make_files(tmp: Path) -> None:
    """The inputs the table names besides rows.csv: damaged results files, planted links, a FIFO."""
    (tmp / "few_columns.csv").write_text("model_size,status,mean_ms\nsmall,ok,1.5\n")
    (tmp / "garbage.csv").write_text("this is,not\na results file\n")
    (tmp / "empty.csv").write_text("")
    (tmp / "broken.jsonl").write_text('{"model_size": "small", "status": "ok"}\n{not json\n')
    (tmp / "other_tool.csv").write_text("world_size,backend,size_bytes,status\n2,gloo,4096,ok\n")
    script = tmp / "not_executable.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    (tmp / "victim.txt").write_text("must never be written\n")
    for link, target in (
        ("link.csv", "victim.txt"),
        ("link.md", "victim.txt"),
        ("link.png", "victim.txt"),
        ("dangling.csv", "nowhere.csv"),
        ("full.csv", "/dev/full"),
    ):
        (tmp / link).symlink_to(target)
    os.mkfifo(tmp / "fifo.csv")
    os.mkfifo(tmp / "fifo.md")
    (tmp / ".lockdir.csv.lock").mkdir()
    (tmp / ".locklink.csv.lock").symlink_to(tmp / "victim.txt")
    (tmp / "hard_a.csv").write_text("")
    os.link(tmp / "hard_a.csv", tmp / "hard_b.csv")
    (tmp / "held_file.csv").write_text("")  # hold_lock holds the file itself; held_link.csv is its other name
    os.link(tmp / "held_file.csv", tmp / "held_link.csv")
    (tmp / "deep_cache").mkdir()  # a peak cache nested 200,000 deep
    (tmp / "deep_cache" / "peak_tflops.json").write_text("[" * 200_000 + "]" * 200_000)
    make_config_files(tmp)
    (tmp / "data_link").mkdir()
    (tmp / "data_link" / "item_0000000.bin").symlink_to(tmp / "victim.txt")
    for name in ("handout_theirs", "handout_link", "handout_markers", "handout_locked"):
        (tmp / name).mkdir()
    (tmp / "handout_marker_dir" / ".handout" / "mixed_precision_accumulation.json").mkdir(parents=True)
    (tmp / "handout_theirs" / "handout_plan.csv").write_text("the user's own\n")
    (tmp / "handout_link" / "logs").symlink_to(tmp)
    (tmp / "handout_markers" / ".handout").write_text("")


def make_config_files(tmp: Path) -> None:
    """--config files: a good tiny configuration and ones each bad in one value (as to_dict writes them)."""
    from cs336_systems.config import BenchmarkConfig
    from cs336_systems.models import ModelConfig

    model = ModelConfig(d_model=32, d_ff=64, num_layers=2, num_heads=2, vocab_size=97, context_length=8)
    good = BenchmarkConfig(model=model, context_length=8, batch_size=2, warmup_steps=1, measure_steps=1).to_dict()
    bad = {
        "config": {},
        "bogus_pass": {"pass_type": "bogus"},
        "accum0": {"grad_accum_steps": 0},
        "neg_peak": {"peak_tflops": -1},
        "compile_yes": {"compile": "yes"},
        "long_context": {"context_length": 64},
        "context_word": {"context_length": "eight"},
        "user_code_checkpointed": {
            "model_factory": "hostile.models:assignment1",
            "model": {**good["model"], "checkpoint_blocks": 1},
        },
    }
    for name, changes in bad.items():
        (tmp / f"{name}.json").write_text(json.dumps({**good, **changes}))
    os.mkfifo(tmp / "fifo.json")
    (tmp / "deep.json").write_text('{"model": ' + "[" * 200_000 + "]" * 200_000 + "}")


def make_damaged_files(tmp: Path) -> None:
    """Result files that are not what they claim, from rows.csv: each damaged in one line."""
    rows = (tmp / "rows.csv").read_text()
    header, first = rows.splitlines()[:2]
    (tmp / "header_twice.csv").write_text(f"{rows}{header}\n{first}\n")
    (tmp / "bench_twice.csv").write_text(f"{header}\n{header}\n")
    cells = first.split(",")
    cells[header.split(",").index("median_ms")] = "fast"
    (tmp / "text_number.csv").write_text(f"{header}\n{','.join(cells)}\n")
    (tmp / "short_row.csv").write_text(f"{header}\n{first}\nsmall,ok\n")
    row = {"model_size": "small", "status": "ok", "median_ms": 1.0}
    (tmp / "scalar.jsonl").write_text(json.dumps(row) + "\n3\n")
    (tmp / "mixed_keys.jsonl").write_text(json.dumps(row) + "\n" + json.dumps({"world_size": 2}) + "\n")
    (tmp / "rows.md").write_text("| model_size | median_ms |\n|---|---|\n| small | 1.0 |\n")
    (tmp / "markdown_named.csv").write_text("| model_size | median_ms |\n|---|---|\n| small | 1.0 |\n")
    (tmp / "not_utf8.csv").write_bytes(header.encode() + b"\n\xff\xfe\n")


def hold_lock(tmp: Path) -> list[int]:
    """held.csv is being written by another process, held_file.csv too (its file locked, as a sweep's),
    and handout_locked/ is another handout's (this script holds their locks for the whole run)."""
    fds = []
    for lock in (tmp / ".held.csv.lock", tmp / "handout_locked" / ".handout_plan.csv.lock"):
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, f"{os.getpid()}\n".encode())
        fds.append(fd)
    fd = os.open(tmp / "held_file.csv", os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return [*fds, fd]


def run_case(command: str, case: list[str] | Row | Env, tmp: Path, number: int) -> Outcome:
    """The command split at `--` (monitor), so the base flags go before the command to run."""
    args = case if isinstance(case, list) else case.args
    filled = [arg.replace("{tmp}", str(tmp)) for arg in args]
    rows = tmp / f"rows_{number}.jsonl"
    if isinstance(case, Row):
        filled += ["--output", str(rows)]
    argv = [sys.executable, "-m", MODULES.get(command, f"cs336_systems.{command}"), *BASE[command], *filled]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO), str(FIXTURES), os.environ.get("PYTHONPATH", "")]),
    }
    env.update({name: value.replace("{tmp}", str(tmp)) for name, value in getattr(case, "env", {}).items()})
    start = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=CASE_TIMEOUT_S, cwd=tmp, env=env)
        returncode, stderr = done.returncode, done.stderr
    except subprocess.TimeoutExpired as exc:
        returncode, stderr = None, f"(no answer within {CASE_TIMEOUT_S:g} s) {exc.stderr or ''}"
    statuses = []
    if rows.exists():
        statuses = [json.loads(line).get("status", "?") for line in rows.read_text().splitlines() if line.strip()]
    return Outcome(command, case, returncode, stderr, time.monotonic() - start, statuses)


def cases(commands: list[str] | None = None) -> list[tuple[str, list[str] | Row | Env]]:
    return [
        (command, args) for command, table in TABLE.items() if not commands or command in commands for args in table
    ]


def markdown(outcomes: list[Outcome], seconds: float) -> str:
    passed = sum(o.passed for o in outcomes)
    lines = [
        "# Bad inputs: one line on stderr, exit status 2 (or the documented row status)",
        "",
        f"`PYTHONPATH=$PWD python scripts/checks/bad_inputs.py --output results/checks/bad_inputs.md`: "
        f"**{passed} of {len(outcomes)}** bad inputs end as one line with exit 2 naming the case's own flag, "
        f"variable or file, or as the documented row status ({seconds:.0f} s on this machine). "
        "Each case also carries the command's tiny-model CPU flags (`BASE` in the script); `{tmp}` is a scratch "
        "directory holding the files `make_files` writes; `env` cases set those variables (where that is a bad "
        "OMP_NUM_THREADS, the OpenMP runtime's own warning, printed as torch loads, is not counted); `row` cases run "
        "hostile user code from `tests/fixtures/hostile` and show the statuses of the rows they wrote.",
        "",
        "| command | bad input | exit | stderr lines | first line of stderr (or the rows written) |",
        "|---|---|---|---|---|",
    ]
    for o in outcomes:
        first = o.shown.replace("|", "\\|")[:160]
        mark = "" if o.passed else " **FAIL**"
        args = shlex.join(o.args).replace("|", "\\|") or "(none)"
        if len(args) > 120:
            args = args[:60] + "..." + args[-40:]
        if isinstance(o.case, Env) and o.case.env:
            args = " ".join([*(f"{k}={v}" for k, v in o.case.env.items()), *([args] if o.args else [])])
        kind = " (row)" if isinstance(o.case, Row) else " (env)" if isinstance(o.case, Env) and o.case.env else ""
        lines.append(f"| {o.command}{kind}{mark} | `{args}` | {o.returncode} | {len(o.lines)} | {first} |")
    return "\n".join(lines) + "\n"


def updated(old: str, new: str, commands: list[str]) -> str:
    """The old table with the rows of `commands` replaced by the new run's, in TABLE order, and
    the count in the heading recounted."""

    def rows(text: str) -> dict[str, list[str]]:
        by_command: dict[str, list[str]] = {}
        for line in text.splitlines():
            if line.startswith("| ") and not line.startswith("| command"):
                by_command.setdefault(line[2:].split()[0], []).append(line)
        return by_command

    kept, fresh = rows(old), rows(new)
    body = [line for command in TABLE for line in (fresh if command in commands else kept).get(command, [])]
    total, passed = len(body), sum("**FAIL**" not in line for line in body)
    head = [line for line in new.splitlines() if not line.startswith("| ") or line.startswith("| command")]
    head = [re.sub(r"\*\*\d+ of \d+\*\*", f"**{passed} of {total}**", line) for line in head]
    head = [
        re.sub(r"\(\d+ s on this machine\)", "(run one command at a time, each merged in as it finished)", line)
        for line in head
    ]
    table_at = next(i for i, line in enumerate(head) if line.startswith("|---"))
    return "\n".join([*head[: table_at + 1], *body, *head[table_at + 1 :]]) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="cases run at once (default 2)")
    parser.add_argument("--commands", nargs="+", choices=tuple(TABLE), help="only these commands")
    parser.add_argument("--output", type=Path, help="write the table as Markdown here")
    parser.add_argument(
        "--update",
        action="store_true",
        help="with --commands: replace only those commands' rows of the existing --output table",
    )
    args = parser.parse_args()
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bad-inputs-") as tmp:
        make_files(Path(tmp))
        make_results_file(Path(tmp))
        make_damaged_files(Path(tmp))
        lock = hold_lock(Path(tmp))
        todo = [(command, case, Path(tmp), number) for number, (command, case) in enumerate(cases(args.commands))]
        with ThreadPoolExecutor(args.jobs) as pool:
            outcomes = []
            for outcome in pool.map(lambda case: run_case(*case), todo):
                outcomes.append(outcome)
                print(
                    f"{'ok  ' if outcome.passed else 'FAIL'} {outcome.command} {shlex.join(outcome.args)}",
                    file=sys.stderr,
                    flush=True,
                )
        for fd in lock:
            os.close(fd)
        victim = (Path(tmp) / "victim.txt").read_text()
    seconds = time.monotonic() - start
    if victim != "must never be written\n":
        print("FAIL: a planted link was written through: victim.txt changed", file=sys.stderr)
        return 1
    for o in outcomes:
        if not o.passed:
            print(
                f"FAIL {o.command} {shlex.join(o.args)}: exit {o.returncode}, rows {o.statuses}, {len(o.lines)} lines: "
                f"{' | '.join(o.lines[-3:])[:300]}",
                file=sys.stderr,
            )
    text = markdown(outcomes, seconds)
    if args.output and args.update and args.commands and args.output.exists():
        text = updated(args.output.read_text(), text, args.commands)
    if args.output:
        write_whole(args.output, text)
    passed = sum(o.passed for o in outcomes)
    print(
        f"{passed} of {len(outcomes)} bad inputs end as one line with exit 2 or their documented row ({seconds:.0f} s)"
    )
    return 0 if passed == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
