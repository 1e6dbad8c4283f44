"""benchmarking_script: (a) the timing script, (b) forward, backward and optimizer step of each size,
(c) the effect of warmup. The plan sweeps each size at the timing context (2026 times a training step
too) and runs the warmup study; the section shows each phase's time and what the rows say."""

from __future__ import annotations

import numpy as np

from ...report import benchmark, plots
from ...report.document import Heading, Section, Text, sig3
from ...report.fields import label_text
from ...report.observe import maker, number, observations, ok, say, times, under_load, versus
from ...tools import module_name
from ..parameters import Options
from ..plan import Step
from ..target import Target
from .base import Problem, Results, finish, section
from .model_steps import model_flags, sizes, sweep

LABEL = "benchmarking_script"
# 2026 times the optimizer step too (forward / backward / AdamW columns); 2025 forward and backward
PASSES = {"2025": ["forward", "forward-backward"], "2026": ["forward", "forward-backward", "train-step"]}


def plan(options: Options, target: Target) -> list[Step]:
    scale = options.scale
    passes = PASSES[options.edition]
    steps = []
    for size in sizes(options):
        steps += sweep(
            options,
            target,
            LABEL,
            "b",
            "(b) timing",
            size,
            {"--context-lengths": [scale.timing_context], "--pass-types": passes, "--precisions": ["fp32"]},
        )
    warmup = Step(
        f"{LABEL}-c-warmup",
        LABEL,
        "(c) 0, 1, 2 and 5 warmup steps, each in a fresh process",
        module_name("warmup_study"),
        kind="warmup",
        flags_of=module_name("benchmark"),  # the study's flags are benchmark's, and its own --warmups
    )
    size = sizes(options)[0]
    warmup.flags = {
        **model_flags(options, size),
        "--context-length": scale.timing_context,
        "--batch-size": scale.batch,
        "--measure-steps": scale.measure,
        "--warmups": [0, 1, 2, 5],
        "--device": options.device,
        "--output-dir": ".",
    }
    warmup.flags["--model-size"] = warmup.flags.pop("--model-sizes")[0]
    device_type = "cpu" if options.device == "cpu" else "cuda"
    warmup.reads = (f"warmup_study_{device_type}.csv",)
    warmup.figures = (f"warmup_study_{device_type}.png",)
    warmup.writes = tuple(f"warmup_study_{device_type}.{ext}" for ext in ("csv", "md", "png"))
    return [*steps, warmup]


def _model_rows(rows: list[dict], pass_type: str) -> dict[str, dict]:
    """model label -> its row of `pass_type` (one per model, else none)."""
    found: dict[str, list[dict]] = {}
    for row in rows:
        if label_text("pass_type", row) == pass_type:
            found.setdefault(row["model"], []).append(row)
    return {model: group[0] for model, group in found.items() if len(group) == 1}


@maker
def timing_observations(rows: list[dict]) -> list[str]:
    """The table's statistic (the mean: the handout asks for mean and standard deviation), each ratio a
    claim from the rows' steps."""
    rows = ok(rows)
    lines = []
    forward = _model_rows(rows, "forward")
    if forward:
        ordered = sorted(forward.items(), key=lambda kv: number(kv[1], "num_params") or 0)
        (small, a), (large, b) = ordered[0], ordered[-1]
        text = f"A forward pass takes {sig3(number(a, 'mean_ms'))} ms on average ({small})"
        if small != large:
            params = (number(b, "num_params") or 0) / (number(a, "num_params") or 1)
            text += f" to {sig3(number(b, 'mean_ms'))} ms ({large}), with {times(params)} the parameters"
            if claim := versus(b, a, statistic="mean"):
                text += f"; {say(claim, f'{large}', f'{small}', 'time')}"
        lines.append(text + ".")
    full = _model_rows(rows, "train-step") or _model_rows(rows, "forward-backward")
    where = f" ({next(iter(full.values()))['pass_type']} rows)" if full else ""
    backward = [(versus(r, r, "backward", "forward", "mean"), m) for m, r in full.items()]
    if text := say(backward, f"The backward pass{where}", "the forward pass", "time", "models"):
        lines.append(text + ".")
    steps = [(versus(r, r, "optimizer", "", "mean"), m) for m, r in _model_rows(rows, "train-step").items()]
    if text := say(steps, "The optimizer step", "a training step", "share", "models"):
        lines.append(text + ".")
    cvs = [(number(r, "cv_pct"), r) for r in rows if number(r, "cv_pct") is not None]
    if cvs:
        worst, row = max(cvs, key=lambda x: x[0])
        noisy = sum(1 for cv, _ in cvs if cv > 10)
        text = f"The standard deviation is at most {worst:.1f}% of the mean (coefficient of variation) over the measured steps"
        text += f"; the noisiest row: {row['model']} {label_text('pass_type', row)}" if noisy else ""
        text += f"; {noisy} of {len(cvs)} rows are above 10% (marked †)" if noisy else ", so the variability is small"
        lines.append(text + ".")
    return lines


@maker
def warmup_observations(rows: list[dict]) -> list[str]:
    """What warmup changes, read within each run: its first measured step against its own later steps.
    Each warmup count runs in a fresh process, so two runs' medians differ by the process as much as by
    the count: their range is said, never ranked. A run measured while other processes kept the machine
    busy says so beside its first step."""
    runs: dict[str, list[dict]] = {}
    for row in sorted(rows, key=lambda r: number(r, "step_index") or 0):
        if label_text("measured", row) == "measured" and number(row, "step_ms") is not None:
            runs.setdefault(label_text("warmup_steps", row), []).append(row)
    lines, medians = [], {}
    for key in sorted(runs, key=float):
        steps = [number(row, "step_ms") for row in runs[key]]
        if len(steps) < 3:
            continue
        first, later = steps[0], steps[1:]
        medians[key] = middle = float(np.median(later))
        low, high = min(later), max(later)
        spread = f"that run's later steps ({sig3(low)} to {sig3(high)} ms)"
        if first - high > high - low:  # clear of the later steps by more than their own spread
            where = f"above {spread} by more than their whole spread"
        elif first > high:
            where = f"just above {spread}, by less than their spread: not told apart from them"
        else:
            where = f"within the range of {spread}"
        if busy := under_load(runs[key]):
            where += f"; {busy}, so a slow step may be theirs"
        name = "Without warmup" if key == "0" else f"After {key} warmup step{'s' * (key != '1')}"
        lines.append(
            f"{name} the first measured step took {sig3(first)} ms, {times(first / middle)} the median of the "
            f"run's later steps ({sig3(middle)} ms): {where}."
        )
    if len(medians) > 1:
        low, high = min(medians.values()), max(medians.values())
        lines.append(
            f"The runs' medians of their later steps range from {sig3(low)} to {sig3(high)} ms: each warmup count "
            "ran in a fresh process, so these medians compare processes as much as warmup counts, and are not "
            "ranked here; warmup shows in each run's first steps against its own later ones."
        )
    return lines


def write(problem: Results) -> Section:
    out = section(problem)
    step = problem.step("-b")
    out.add(Heading("(a) The script"))
    out.add(
        Text(
            "This project's `benchmark` tool (and its sweep `benchmark_direct`): it builds the model from the size "
            "table, draws a random batch, runs the warmup steps, then times each measured step (forward, "
            "forward and backward, or a full training step with AdamW), synchronising the device after each "
            "step and timing each phase on its own."
            + (f" The command that made the rows below: `{step['command']}`." if step and step.get("command") else "")
        )
    )
    rows = problem.rows("benchmark", "-b")
    out.add(Heading("(b) Forward, backward and optimizer step"))
    if not rows.empty:
        out.add(benchmark.phase_table(rows, "Time per phase of each model", "mean"))
        out.add(observations(timing_observations, rows, "benchmark"))
        out.add(observations(benchmark.row_notes, rows, "benchmark"))
    warmup = problem.rows("warmup_study")
    out.add(Heading("(c) Without warmup, and with 1 or 2 warmup steps"))
    if not warmup.empty:
        out.add(benchmark.warmup_table(warmup))
        out.add(*plots.warmup_plot(warmup, problem.out_dir, problem.stem))
        out.add(observations(warmup_observations, warmup, "warmup_study"))
    return finish(problem, out)


PROBLEM = Problem(LABEL, "Benchmarking Script", plan=plan, write=write)
