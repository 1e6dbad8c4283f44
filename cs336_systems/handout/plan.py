"""A handout plan is data: steps, each one tool run with its flags, a prediction and a verdict.

A step's flags are a dict (flag -> value, list, True for a bare flag), so the budget can shrink a
step (fewer measured steps, fewer contexts) and the command is rendered again from the same data.
What a step runs is read as its tool reads it: its argv through the tool's own parser and
configuration builder (the sweep's grid, benchmark's configuration, ddp_bench's, the attention
configurations), so a tool's default, and a configuration's refusal, is the plan's too; nothing
here repeats one. Predictions are rough on purpose and say so: time from FLOPs at a fixed fraction
of the device's peak (flops.py) plus a start-up cost per process; memory from the estimator.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..config import BenchmarkConfig
from ..errors import UsageError
from ..flops import analytic_flops_per_step, recompute_flops_per_step
from ..memory.estimate import estimate_config, estimate_memory
from ..precision import PRECISION_TABLE
from ..tools import module_name
from ..units import format_bytes
from .target import Target

# Fractions of the peak a step reaches, and fixed costs, for predictions only (rough by design).
EFFICIENCY = {"cuda": 0.4, "cpu": 0.5}
STARTUP_S = {"cuda": 8.0, "cpu": 4.0}  # one Python process importing torch (and a CUDA context)
COMPILE_S = {"cuda": 60.0, "cpu": 40.0}  # torch.compile of one model or function
LAUNCH_S_PER_LAYER = {"cuda": 1e-3, "cpu": 2e-3}  # eager per-op overheads of one block's step
CONFIG_S = {"cuda": 2.0, "cpu": 3.0}  # one configuration's set-up: model, FLOP count, the profiled step
BANDWIDTH = {"cuda": 2e12, "cpu": 1e10}  # device memory bytes/s (attention's memory-bound passes)
LINK = {"nccl": 1e11, "gloo": 1e9}  # all-reduce bytes/s per rank
DO_BENCH_CALLS = 7  # steps one do_bench sample runs at least: 5 to estimate, 1 warmup, 1 repetition
BORDERLINE = 1.10  # predicted up to 10% over the device still runs (the estimator is within a few %)

PATH_FLAGS = ("--output", "--output-dir", "--plot", "--summary", "--memory-snapshot")
INPUT_FLAGS = ("--snapshot", "--baseline")  # a file an earlier step wrote: inside the output directory, not an output
SWEEP = module_name("benchmark_direct")  # the grid's parser (run_benchmarks' is the same grid)
CHILD_PER_CONFIG = module_name("run_benchmarks")  # the sweep that runs each configuration in a process of its own
SWEEPS = (SWEEP, CHILD_PER_CONFIG)
DDP_BENCH = module_name("ddp_bench")


@dataclass
class Step:
    """One tool run. `id` names its outputs and its done marker, so it must not change between runs."""

    id: str
    problem: str
    part: str  # what runs, in words
    tool: str  # a module (cs336_systems.run_benchmarks) or a script path under scripts/
    flags: dict = field(default_factory=dict)
    kind: str = "fixed"  # the prediction family: benchmark, attention, allreduce, ddp, warmup, fixed
    reads: tuple[str, ...] = ()  # result files the write-up shows, relative to the output directory
    writes: tuple[str, ...] = ()  # files the tool names itself (not given by a path flag)
    stem: str | None = None  # a wrapper script's first argument: its outputs' common stem
    figures: tuple[str, ...] = ()  # the images the step writes (PNG), relative to the output directory
    capture: str | None = None  # the tool prints its result: stdout is kept in this file
    resumable: bool = False  # the tool's own --resume continues a partial output
    fixed_s: float = 10.0  # prediction for a `fixed` step
    status: str = "run"  # run or skipped
    reason: str = ""
    reductions: list[str] = field(default_factory=list)
    predicted_peak_bytes: int | None = None
    predicted_s: float | None = None
    # the tool whose parser reads `flags` where `tool` passes them on (the Nsight Systems wrapper,
    # warmup_study: benchmark's flags, and the tool's own, which the plan always gives)
    flags_of: str | None = None
    # the estimator's stand-in for a student's model (the handout's architecture): predict its memory
    # as the built-in model's, with this attention
    estimate_builtin: bool = False
    estimate_attention: str | None = None

    def outputs(self) -> list[str]:
        names = []
        for flag in PATH_FLAGS:
            if flag == "--output-dir":  # a folder: the tool's own file names are in _writes
                continue
            names += _listed(self.flags.get(flag))
        names += list(self.writes)
        return names + ([self.capture] if self.capture else [])

    def inputs(self) -> list[str]:
        """The files it reads that an earlier step writes (INPUT_FLAGS), relative to the output directory."""
        return [v for flag in INPUT_FLAGS for v in _listed(self.flags.get(flag))]

    def argv(self, output_dir: Path, inputs_dir: Path | None = None) -> list[str]:
        """The tool's flags, output paths inside `output_dir`, inputs inside `inputs_dir` (default: the same)."""
        return argv_of(self.flags, output_dir, inputs_dir)

    def command(self, output_dir: Path, inputs_dir: Path | None = None) -> list[str]:
        """The command line; a job writes its outputs into a directory of its own (`output_dir`) and reads
        an earlier step's from the plan's (`inputs_dir`)."""
        argv = self.argv(output_dir, inputs_dir)
        if self.tool.endswith(".sh"):  # a wrapper script: OUTPUT_STEM [benchmark flags]
            return ["bash", self.tool, str(output_dir / self.stem), *argv]
        if self.tool.endswith(".py"):
            return [sys.executable, self.tool, *argv]
        return [sys.executable, "-m", self.tool, *argv]

    def shell(self, output_dir: Path) -> str:
        """The command as a student types it: `cs336-bench TOOL ...` for a tool, `python SCRIPT ...`."""
        command = self.command(output_dir)
        if command[:2] == [sys.executable, "-m"]:
            command = ["cs336-bench", command[2].split(".", 1)[1], *command[3:]]
        command[0] = "python" if command[0] == sys.executable else command[0]
        text = shlex.join(command)
        return f"{text} > {shlex.quote(str(output_dir / self.capture))}" if self.capture else text

    def skip(self, reason: str) -> None:
        self.status, self.reason = "skipped", reason

    def args(self) -> argparse.Namespace:
        """The step's flags as its tool reads them: parsed by its own parser, its defaults filled in."""
        return tool_args(self.flags_of or self.tool, self.flags, script=self.flags_of is not None)


def _listed(value) -> list[str]:
    return [value] if isinstance(value, str) else list(value or [])


def argv_of(flags: dict, output_dir: Path = Path("."), inputs_dir: Path | None = None) -> list[str]:
    """A step's flags as a command line, output paths inside `output_dir`, inputs inside `inputs_dir`
    (default: `output_dir`)."""
    out = []
    for flag, value in flags.items():
        if value is None or value is False:
            continue
        values = value if isinstance(value, (list, tuple)) else [value]
        if flag in PATH_FLAGS:
            values = [str(output_dir / v) for v in values]
        elif flag in INPUT_FLAGS:
            values = [str((output_dir if inputs_dir is None else inputs_dir) / v) for v in values]
        if flag == "--output":  # repeatable, one path each
            out += [x for v in values for x in (flag, v)]
        elif value is True:
            out.append(flag)
        else:
            out += [flag, *(str(v) for v in values)]
    return out


def tool_parser(tool: str) -> argparse.ArgumentParser:
    """The parser of a tool the plan runs (its module's name, as a step names it)."""
    from .. import (
        allreduce_bench,
        attention_bench,
        benchmark,
        benchmark_direct,
        ddp_bench,
        mixed_precision,
        residuals,
        run_benchmarks,
    )
    from ..memory import timeline

    tools = (allreduce_bench, attention_bench, benchmark, benchmark_direct, ddp_bench)
    tools += (mixed_precision, residuals, run_benchmarks, timeline)
    parsers = {module_name(tool.__name__.split(".", 1)[1]): tool.build_parser for tool in tools}
    if tool not in parsers:
        raise ValueError(f"the plan runs no tool named {tool}")
    return parsers[tool]()


def tool_args(tool: str, flags: dict, script: bool = False) -> argparse.Namespace:
    """`flags` as the tool `tool` (a module) parses them: its build_parser(), so its defaults are the
    plan's. `script`: the flags go to a script that passes the tool's on and keeps its own."""
    parser = tool_parser(tool)
    argv = argv_of(flags)
    return parser.parse_known_args(argv)[0] if script else parser.parse_args(argv)


def benchmark_configs(step: Step) -> list[BenchmarkConfig]:
    """The configurations a model step runs, from its tool's own builder: a sweep's grid, benchmark's
    configuration, ddp_bench's per-rank training step. A UsageError (ConfigError) where the tool
    would refuse them."""
    return configurations(step.flags_of or step.tool, step.args())


def configurations(tool: str, args: argparse.Namespace) -> list[BenchmarkConfig]:
    """The configurations `tool` makes of its parsed flags: a sweep's grid, ddp_bench's per-rank step,
    benchmark's one configuration."""
    if tool in SWEEPS:
        from ..sweep import grid_from_args

        return grid_from_args(args, args.device)
    if tool == DDP_BENCH:
        from ..ddp_bench.cli import config_from_args as ddp_config

        return [ddp_config(args, args.device.split(":")[0])]
    from ..benchmark import config_from_args

    return [config_from_args(args)]


def refusal(tool: str, flags: dict) -> str | None:
    """Why `tool` would refuse `flags` (its configuration's own words), or None."""
    try:
        configurations(tool, tool_args(tool, flags))
    except UsageError as exc:
        return str(exc)
    return None


# -- predictions ---------------------------------------------------------------------------


def model_configs(tool: str, flags: dict) -> list[BenchmarkConfig]:
    """Every configuration of a model step's grid (`flags` as `tool` reads them)."""
    return configurations(tool, tool_args(tool, flags))


def step_seconds(target: Target, config: BenchmarkConfig) -> float:
    model, context, batch = config.model, config.context_length, config.batch_size * config.grad_accum_steps
    flops = analytic_flops_per_step(model, batch, context, config.pass_type)
    flops += recompute_flops_per_step(model, batch, context, config.pass_type)
    peak = target.peak_tflops(config.precision) or target.peak_tflops("fp32") or 1.0
    passes = 1 if config.pass_type == "forward" else 3
    launches = LAUNCH_S_PER_LAYER[target.type] * model.num_layers * passes
    return flops / (peak * 1e12 * EFFICIENCY[target.type]) + launches


def predicted_peak(target: Target, config: BenchmarkConfig) -> int:
    """The estimator's total for `config` on the target's kind of device."""
    return estimate_config(config, target.type).total_bytes


def predict(step: Step, target: Target, user_model: bool = False) -> None:
    """Fill in the step's predicted time and peak memory (None where there is no model of it), by its
    kind's predictor. A UsageError where the step's tool would refuse its flags (the planner skips it)."""
    step.predicted_s, step.predicted_peak_bytes = PREDICTORS[step.kind](step, target, user_model)


def _model_configs(step: Step) -> list[BenchmarkConfig]:
    """The configurations a model step runs; a student's model, where estimated as the built-in one,
    with the attention it stands in with."""
    configs = benchmark_configs(step)
    if step.estimate_attention:
        configs = [c.replace(model=c.model.replace(attention=step.estimate_attention)) for c in configs]
    return configs


def _steps_seconds(target: Target, config: BenchmarkConfig) -> float:
    """A configuration's warmup and measured steps (do_bench runs each sample's step several times)."""
    calls = DO_BENCH_CALLS if config.timer == "do-bench" else 1
    seconds = (config.warmup_steps + config.measure_steps) * calls * step_seconds(target, config)
    if config.target_iqr_pct:  # more steps until resolved: a quiet machine gets there well before the cap
        seconds += 0.25 * config.max_measure_s
    return seconds


def predict_sweep(step: Step, target: Target, user_model: bool) -> tuple[float, int | None]:
    """benchmark and the sweeps: each configuration's steps, set-up and compile, and a process start
    (one per configuration for the sweep that runs each in a child)."""
    configs = _model_configs(step)
    processes = len(configs) if (step.flags_of or step.tool) == CHILD_PER_CONFIG else 1
    seconds = sum(_steps_seconds(target, c) for c in configs) + len(configs) * CONFIG_S[target.type]
    seconds += processes * STARTUP_S[target.type] + sum(1 for c in configs if c.compile) * COMPILE_S[target.type]
    peak = max(predicted_peak(target, c) for c in configs) if not user_model or step.estimate_builtin else None
    return seconds, peak


def predict_warmup(step: Step, target: Target, user_model: bool) -> tuple[float, int | None]:
    """The warmup study: each of its --warmups counts in a process of its own."""
    config = _model_configs(step)[0]
    one = step_seconds(target, config)
    warmups = [int(w) for w in step.flags["--warmups"]]
    seconds = sum((w + config.measure_steps) * one for w in warmups) + len(warmups) * STARTUP_S[target.type]
    return seconds, predicted_peak(target, config) if not user_model or step.estimate_builtin else None


def predict_ddp(step: Step, target: Target, user_model: bool) -> tuple[float, int | None]:
    """ddp_bench: the single-process baseline (unless read, --baseline), then each strategy (and bucket size); a
    rank's memory as each strategy divides it (a student's model estimated as the built-in one)."""
    configs = _model_configs(step)
    args = step.args()
    strategies = [s for s in args.strategies if s != "single"]
    units = (0 if args.baseline else 1) + len(strategies) * len(args.bucket_cap_mb or [None])
    per_unit = sum(_steps_seconds(target, c) for c in configs) * 1.5 + CONFIG_S[target.type]
    seconds = units * per_unit + 3 * STARTUP_S[target.type]
    return seconds, data_parallel_peak(args, configs[0].replace(model_factory=None))


def predict_attention(step: Step, target: Target, user_model: bool) -> tuple[float, int | None]:
    return _attention(step.args(), target)


def predict_allreduce(step: Step, target: Target, user_model: bool) -> tuple[float, int | None]:
    args = step.args()
    steps = args.warmup_steps + args.measure_steps
    per_size = sum(2 * size_bytes / LINK[args.backend] for _, size_bytes in args.sizes)
    seconds = sum(steps * per_size + STARTUP_S[target.type] for _ in _world_sizes(args))
    return seconds, 3 * max(size_bytes for _, size_bytes in args.sizes)


def predict_fixed(step: Step, target: Target, user_model: bool) -> tuple[float, int | None]:
    return step.fixed_s, None


PREDICTORS = {
    "benchmark": predict_sweep,
    "warmup": predict_warmup,
    "ddp": predict_ddp,
    "attention": predict_attention,
    "allreduce": predict_allreduce,
    "fixed": predict_fixed,
}


def _world_sizes(args: argparse.Namespace) -> list[int]:
    from ..distributed.driver import resolve_world_sizes

    return resolve_world_sizes(args.world_sizes, args.backend, args.device, torchrun=False)


def data_parallel_peak(args: argparse.Namespace, per_rank: BenchmarkConfig) -> int | None:
    """A rank's peak over the strategies of a ddp_bench step: a training step with its AdamW state
    (the student's AdamW holds the same two fp32 tensors per parameter as torch's), parameters,
    gradients and state each divided as the strategy divides them (ddp_bench's own accounting).
    The single-process baseline ddp_bench runs first holds everything; where only sharding fits,
    that one row is an oom row and the others still run."""
    from ..ddp_bench.accounting import predicted_peak_bytes
    from ..ddp_bench.strategies import SHARDING

    world = max(_world_sizes(args))
    peaks = [predicted_peak_bytes(per_rank, SHARDING[s], world, "adamw") for s in args.strategies]
    # plus the workspace margin every other prediction of the plan counts (estimate.total_bytes)
    whole = estimate_memory(
        per_rank.model,
        per_rank.batch_size,
        per_rank.context_length,
        "train-step",
        per_rank.precision,
        per_rank.device.split(":")[0],
    )
    return max((peak + whole.workspace_margin for peak in peaks if peak is not None), default=None)


def _attention(args: argparse.Namespace, target: Target) -> tuple[float, int]:
    """Time and the largest peak of an attention_bench grid (its own configurations): naive and
    compiled hold the T x T scores."""
    from ..attention_bench.cli import configs_from_args

    configs = configs_from_args(args, args.device)
    seconds, peak = STARTUP_S[target.type], 0
    seconds += COMPILE_S[target.type] * len({c.implementation for c in configs} & {"compiled"}) * 0.5
    for config in configs:
        element = PRECISION_TABLE[config.precision].compute_dtype.itemsize
        heads = config.batch_size * config.num_heads
        flops = config.forward_flops * 3.5  # forward, then backward (2.5x forward)
        vectors = 4 * heads * config.context_length * config.head_dim * element * 3
        scores = config.scores_bytes if config.implementation in ("naive", "compiled") else 0
        rate = (target.peak_tflops(config.precision) or target.peak_tflops("fp32") or 1.0) * 1e12
        one = max(flops / (rate * EFFICIENCY[target.type]), 10 * scores / BANDWIDTH[target.type])
        seconds += (config.warmup_steps + config.measure_steps) * one * 2  # forward, backward, end-to-end loops
        peak = max(peak, vectors + 3 * scores)
    return seconds, peak


# -- fit -----------------------------------------------------------------------------------


def fit_verdict(peak: int | None, target: Target) -> tuple[str, str]:
    """('fits' | 'borderline' | 'no' | 'unknown', why)."""
    if peak is None:
        return "unknown", "no prediction (a --model-factory model, or a tool the estimator does not model)"
    if not target.memory_bytes:
        return "unknown", f"predicted {format_bytes(peak)}; device memory unknown"
    of = f"predicted {format_bytes(peak)} of {format_bytes(target.memory_bytes)}"
    if peak <= target.memory_bytes:
        return "fits", of
    if peak <= BORDERLINE * target.memory_bytes:
        return "borderline", f"{of}: within {BORDERLINE - 1:.0%} of the device's memory, runs and may be oom"
    return "no", f"{of}: does not fit"
