"""A handout plan is data: steps, each one tool run with its flags, a prediction and a verdict.

A step's flags are a dict (flag -> value, list, True for a bare flag), so the budget can shrink a
step (fewer measured steps, fewer contexts) and the command is rendered again from the same data.
Predictions are rough on purpose and say so: time from FLOPs at a fixed fraction of the device's
peak (flops.py) plus a start-up cost per process; memory from the estimator (memory/estimate.py).
"""

from __future__ import annotations

import itertools
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..benchmark_flags import checkpoint_blocks
from ..errors import UsageError
from ..flops import analytic_flops_per_step, recompute_flops_per_step
from ..memory.estimate import estimate_memory
from ..models import ModelConfig
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
INPUT_FLAGS = ("--snapshot",)  # a file an earlier step wrote: inside the output directory, not an output
SHAPE_FLAGS = ("--d-model", "--d-ff", "--num-layers", "--num-heads", "--vocab-size")


@dataclass
class Step:
    """One tool run. `id` names its outputs and its done marker, so it must not change between runs."""

    id: str
    problem: str
    part: str  # what runs, in words
    tool: str  # a module (cs336_systems.run_benchmarks) or a script path (scripts/warmup_study.py)
    flags: dict = field(default_factory=dict)
    kind: str = "fixed"  # the prediction family: benchmark, attention, allreduce, ddp, warmup, fixed
    reads: tuple[str, ...] = ()  # result files the write-up shows, relative to the output directory
    figures: tuple[str, ...] = ()  # the images the step writes (PNG), relative to the output directory
    capture: str | None = None  # the tool prints its result: stdout is kept in this file
    resumable: bool = False  # the tool's own --resume continues a partial output
    fixed_s: float = 10.0  # prediction for a `fixed` step
    status: str = "run"  # run or skipped
    reason: str = ""
    reductions: list[str] = field(default_factory=list)
    predicted_peak_bytes: int | None = None
    predicted_s: float | None = None

    def outputs(self) -> list[str]:
        names = []
        for flag in PATH_FLAGS:
            if flag == "--output-dir":  # a folder: the tool's own file names are in _writes
                continue
            value = self.flags.get(flag)
            names += [value] if isinstance(value, str) else list(value or [])
        names += list(self.flags.get("_writes", []))  # written by the tool under a name of its own
        return names + ([self.capture] if self.capture else [])

    def argv(self, output_dir: Path) -> list[str]:
        """The tool's flags, output paths inside `output_dir`."""
        out = []
        for flag, value in self.flags.items():
            if value is None or value is False or flag.startswith("_"):  # _name: planning data, not a flag
                continue
            values = value if isinstance(value, (list, tuple)) else [value]
            if flag in PATH_FLAGS or flag in INPUT_FLAGS:
                values = [str(output_dir / v) for v in values]
            if flag == "--output":  # repeatable, one path each
                out += [x for v in values for x in (flag, v)]
            elif value is True:
                out.append(flag)
            else:
                out += [flag, *(str(v) for v in values)]
        return out

    def command(self, output_dir: Path) -> list[str]:
        if self.tool.endswith(".sh"):  # scripts/nsys_profile.sh OUTPUT_STEM [benchmark flags]
            return ["bash", self.tool, str(output_dir / self.flags["_stem"]), *self.argv(output_dir)]
        if self.tool.endswith(".py"):
            return [sys.executable, self.tool, *self.argv(output_dir)]
        return [sys.executable, "-m", self.tool, *self.argv(output_dir)]

    def shell(self, output_dir: Path) -> str:
        command = self.command(output_dir)
        command[0] = "python" if command[0] == sys.executable else command[0]
        text = shlex.join(command)
        return f"{text} > {shlex.quote(str(output_dir / self.capture))}" if self.capture else text

    def skip(self, reason: str) -> None:
        self.status, self.reason = "skipped", reason


# -- predictions ---------------------------------------------------------------------------


def _list(flags: dict, flag: str, default: list) -> list:
    value = flags.get(flag, default)
    return list(value) if isinstance(value, (list, tuple)) else [value]


def model_configs(flags: dict) -> list[tuple[ModelConfig, int, int, str, str, bool]]:
    """Every (model, context, batch, pass, precision, compiled) of a benchmark-like step's grid."""
    overrides = {flag[2:].replace("-", "_"): int(flags[flag]) for flag in SHAPE_FLAGS if flag in flags}
    contexts = [int(t) for t in _list(flags, "--context-lengths", _list(flags, "--context-length", [512]))]
    compiled = {"off": [False], "on": [True], "both": [False, True]}[flags.get("--compile", "off")]
    if flags.get("--compile") is True:
        compiled = [True]
    attention = _list(flags, "--attentions", _list(flags, "--attention", [flags.get("_estimate_attention", "sdpa")]))[0]
    grid = itertools.product(
        _list(flags, "--model-sizes", _list(flags, "--model-size", ["small"])),
        [checkpoint_blocks(str(k)) for k in _list(flags, "--checkpoint-blocks", ["0"])],
        _list(flags, "--precisions", _list(flags, "--precision", ["fp32"])),
        compiled,
        contexts,
        [int(b) for b in _list(flags, "--batch-sizes", _list(flags, "--batch-size", [4]))],
        _list(flags, "--pass-types", _list(flags, "--pass-type", ["forward-backward"])),
    )
    configs = []
    for size, blocks, precision, compile_on, context, batch, pass_type in grid:
        model = ModelConfig.from_size(
            size, flags.get("--size-table"), context_length=max(contexts), attention=attention, **overrides
        ).replace(checkpoint_blocks=blocks)
        configs.append((model, context, batch, pass_type, precision, compile_on))
    return configs


def step_seconds(target: Target, model: ModelConfig, context: int, batch: int, pass_type: str, precision: str) -> float:
    flops = analytic_flops_per_step(model, batch, context, pass_type)
    flops += recompute_flops_per_step(model, batch, context, pass_type)
    peak = target.peak_tflops(precision) or target.peak_tflops("fp32") or 1.0
    passes = 1 if pass_type == "forward" else 3
    launches = LAUNCH_S_PER_LAYER[target.type] * model.num_layers * passes
    return flops / (peak * 1e12 * EFFICIENCY[target.type]) + launches


def predicted_peak(target: Target, model: ModelConfig, context: int, batch: int, pass_type: str, precision: str) -> int:
    return estimate_memory(model, batch, context, pass_type, precision, target.type).total_bytes


def predict(step: Step, target: Target, user_model: bool = False) -> None:
    """Fill in the step's predicted time and peak memory (None where there is no model of it)."""
    flags, kind = step.flags, step.kind
    steps = int(flags.get("--warmup-steps", 5)) + int(flags.get("--measure-steps", 10))
    step.predicted_peak_bytes = None
    if kind in ("benchmark", "warmup", "ddp"):
        # ddp_bench always runs training steps
        configs = model_configs({**flags, "--pass-type": "train-step"} if kind == "ddp" else flags)
        calls = DO_BENCH_CALLS if flags.get("--timer") == "do-bench" else 1
        per_config = [steps * calls * step_seconds(target, *c[:5]) for c in configs]
        if kind == "ddp":
            step.predicted_peak_bytes = data_parallel_peak(flags, configs[0])
        elif not user_model or step.flags.get("_estimate_builtin"):
            step.predicted_peak_bytes = max(predicted_peak(target, *c[:5]) for c in configs)
        processes = len(configs) if flags.get("_child_per_config") else 1
        compiles = sum(1 for c in configs if c[5]) * COMPILE_S[target.type]
        seconds = sum(per_config) + len(configs) * CONFIG_S[target.type] + processes * STARTUP_S[target.type]
        seconds += compiles
        if kind == "warmup":
            warmups = [int(w) for w in _list(flags, "--warmups", [0, 1, 2, 5])]
            one = step_seconds(target, *configs[0][:5])
            seconds = sum((w + int(flags.get("--measure-steps", 10))) * one for w in warmups)
            seconds += len(warmups) * STARTUP_S[target.type]
        if kind == "ddp":  # the single-process baseline, then each strategy (and bucket size) on N ranks
            units = 1 + len(_list(flags, "--strategies", ["ddp"])) * len(_list(flags, "--bucket-cap-mb", [None]))
            seconds = units * (sum(per_config) * 1.5 + CONFIG_S[target.type]) + 3 * STARTUP_S[target.type]
        step.predicted_s = seconds
    elif kind == "attention":
        step.predicted_s, step.predicted_peak_bytes = _attention(flags, target)
    elif kind == "allreduce":
        sizes = [_size_bytes(s) for s in _list(flags, "--sizes", ["1MB"])]
        worlds = [int(w) for w in _list(flags, "--world-sizes", [2])]
        link = LINK[flags.get("--backend", "gloo")]
        per_size = sum(2 * size / link for size in sizes)
        step.predicted_s = sum(steps * per_size + STARTUP_S[target.type] for _ in worlds)
        step.predicted_peak_bytes = 3 * max(sizes)
    else:
        step.predicted_s = step.fixed_s


def data_parallel_peak(flags: dict, config: tuple) -> int | None:
    """A rank's peak over the strategies of a ddp_bench step: a training step with its AdamW state
    (the student's AdamW holds the same two fp32 tensors per parameter as torch's), parameters,
    gradients and state each divided as the strategy divides them (ddp_bench's own accounting).
    The single-process baseline ddp_bench runs first holds everything; where only sharding fits,
    that one row is an oom row and the others still run."""
    from ..config import BenchmarkConfig
    from ..ddp_bench.accounting import predicted_peak_bytes
    from ..ddp_bench.strategies import SHARDING

    model, context, batch, _, precision, _ = config
    world = max(int(w) for w in _list(flags, "--world-sizes", [2]))
    per_rank = BenchmarkConfig(
        model=model,
        context_length=context,
        batch_size=batch,
        pass_type="train-step",
        precision=precision,
        device=str(flags.get("--device", "cuda")),
    )
    peaks = [predicted_peak_bytes(per_rank, SHARDING[s], world, "adamw") for s in _list(flags, "--strategies", ["ddp"])]
    # plus the workspace margin every other prediction of the plan counts (estimate.total_bytes)
    whole = estimate_memory(model, batch, context, "train-step", precision, per_rank.device.split(":")[0])
    return max((peak + whole.workspace_margin for peak in peaks if peak is not None), default=None)


def _size_bytes(text) -> int:
    from ..allreduce_bench.worker import parse_size

    return parse_size(str(text))[1]


def _attention(flags: dict, target: Target) -> tuple[float, int]:
    """Time and the largest peak of an attention_bench grid: naive and compiled hold the T x T scores."""
    from ..attention_bench.config import TENSOR_DTYPES

    steps = int(flags.get("--warmup-steps", 5)) + int(flags.get("--measure-steps", 100))
    batch, heads = int(flags.get("--batch-size", 1)), int(flags.get("--num-heads", 1))
    seconds, peak = STARTUP_S[target.type], 0
    implementations = _list(flags, "--implementations", ["naive"])
    seconds += COMPILE_S[target.type] * sum(1 for i in implementations if i == "compiled") * 0.5
    for precision, d, T, implementation in itertools.product(
        _list(flags, "--precisions", ["fp32"]),
        _list(flags, "--head-dims", [64]),
        _list(flags, "--context-lengths", [256]),
        implementations,
    ):
        d, T = int(d), int(T)
        element = TENSOR_DTYPES[precision].itemsize
        flops = 4 * batch * heads * T * T * d * 3.5  # forward, then backward (2.5x forward)
        vectors = 4 * batch * heads * T * d * element * 3
        materialised = implementation in ("naive", "compiled")
        scores = batch * heads * T * T * (element if materialised else 0)
        rate = (target.peak_tflops(precision) or target.peak_tflops("fp32") or 1.0) * 1e12 * EFFICIENCY[target.type]
        one = max(flops / rate, 10 * scores / BANDWIDTH[target.type])
        seconds += steps * one * 2  # the forward loop, the backward loop and end-to-end
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


# -- budget --------------------------------------------------------------------------------

MEASURE_REDUCTIONS = {"benchmark": 5, "ddp": 5, "attention": 20, "allreduce": 5}


def format_seconds(value: float | None) -> str:
    if value is None:
        return "?"
    if value < 120:
        return f"{value:.0f} s"
    return f"{value / 60:.0f} min" if value < 7200 else f"{value / 3600:.1f} h"


def total_seconds(steps: list[Step]) -> float:
    return sum(s.predicted_s or 0 for s in steps if s.status == "run")


def fit_budget(steps: list[Step], budget_s: float, target: Target, user_model: bool) -> list[str]:
    """Shrink the plan until its predicted time fits `budget_s`, in this order: fewer measured steps,
    fewer contexts (the longest dropped), then the last problems of the handout's order skipped.
    Each step records its own reductions; the plan-level ones are returned."""
    notes = []
    if total_seconds(steps) <= budget_s:
        return notes
    for step in steps:
        fewer = MEASURE_REDUCTIONS.get(step.kind)
        measured = int(step.flags.get("--measure-steps", 0) or 0)
        if step.status == "run" and fewer and measured > fewer:
            step.flags["--measure-steps"] = fewer
            step.reductions.append(f"--measure-steps {measured} -> {fewer} (--budget)")
            predict(step, target, user_model)
    notes.append("fewer measured steps")
    if total_seconds(steps) <= budget_s:
        return notes
    for step in steps:
        contexts = step.flags.get("--context-lengths")
        if step.status == "run" and isinstance(contexts, list) and len(contexts) > 2:
            kept = sorted(contexts, key=int)[: max(2, len(contexts) // 2)]
            dropped = [c for c in contexts if c not in kept]
            step.flags["--context-lengths"] = kept
            step.reductions.append(f"contexts {' '.join(map(str, dropped))} dropped (--budget)")
            predict(step, target, user_model)
    notes.append("fewer contexts")
    used = 0.0
    for step in steps:
        if step.status != "run":
            continue
        if used + (step.predicted_s or 0) > budget_s:
            step.skip(f"over --budget: predicted {step.predicted_s:.0f} s, {max(0.0, budget_s - used):.0f} s left")
        else:
            used += step.predicted_s or 0
    notes.append("later problems skipped")
    return notes


def parse_duration(text: str) -> float:
    """'45m', '2h', '90s', '1h30m', or seconds: seconds, more than zero (a UsageError otherwise)."""
    import re

    value = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", value):
        seconds = float(value)
    else:
        parts = re.findall(r"(\d+(?:\.\d+)?)\s*([hms])", value)
        if not parts or "".join(n + u for n, u in parts) != value.replace(" ", ""):
            raise UsageError(f"--budget {text!r}: expected a duration like 45m, 2h, 1h30m or 90s")
        seconds = sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)
    if seconds <= 0:
        raise UsageError(f"--budget {text!r}: must be more than zero")
    return seconds
