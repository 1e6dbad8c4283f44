"""mixed_precision_accumulation (fp32 and fp16 accumulators) and benchmarking_mixed_precision (the toy
model's dtypes under autocast, then bf16 autocast against fp32 per size): both read the rows of the
mixed_precision tool, the second also a bf16 sweep beside benchmarking_script's fp32 one."""

from __future__ import annotations

import pandas as pd

from ...report import benchmark
from ...report.document import Bullets, Heading, Section
from ...report.grid import Value, grid
from ...report.observe import number, ok, pick, records, speed_text, times, versus
from ...tools import module_name
from ..parameters import Options
from ..plan import Step
from ..target import Target
from . import benchmarking
from .base import Problem, Results, finish, section
from .model_steps import sizes, sweep

ACCUMULATION = "mixed_precision_accumulation"
BENCHMARKING = "benchmarking_mixed_precision"


def _mixed_precision_step(options: Options, name: str, problem: str, part: str) -> Step:
    """The mixed_precision tool: it prints both tables (accumulation, the toy model's dtypes) and
    writes them as rows; each problem's step reads its own table (the `table` column)."""
    return Step(
        name,
        problem,
        part,
        module_name("mixed_precision"),
        {"--device": options.device, "--output": [f"{name}.csv"]},
        reads=(f"{name}.csv",),
        capture=f"{name}.txt",
        fixed_s=15,
    )


def plan_accumulation(options: Options, target: Target) -> list[Step]:
    name = ACCUMULATION
    return [_mixed_precision_step(options, name, name, "0.01 added 1000 times, fp32 and fp16 accumulators")]


def plan_benchmarking(options: Options, target: Target) -> list[Step]:
    steps = [
        _mixed_precision_step(
            options,
            f"{BENCHMARKING}-a-dtypes",
            BENCHMARKING,
            "(a, b) the toy model's dtypes under fp16 and bf16 autocast",
        )
    ]
    for size in sizes(options):
        steps += sweep(
            options,
            target,
            BENCHMARKING,
            "bf16",
            "(c) bf16 autocast",
            size,
            {
                "--context-lengths": [options.scale.timing_context],
                "--pass-types": ["forward", "forward-backward"],
                "--precisions": ["bf16"],
            },
        )
    if "bf16" in target.emulated:  # measured anyway at this shape, and said so beside its numbers
        for step in steps[1:]:
            step.reductions.append(
                "bf16 is emulated on this CPU (no AVX512-BF16 or AMX): its times are the emulation's, "
                "slower than fp32 by construction, not what bf16 does on a GPU"
            )
    return steps


def mixed_precision_table(problem: Results, table: str) -> pd.DataFrame:
    """The rows of one of mixed_precision's two tables (`table`: accumulation or autocast)."""
    rows = problem.rows("mixed_precision")
    return rows[rows["table"] == table] if not rows.empty else rows


def write_accumulation(problem: Results) -> Section:
    out = section(problem)
    rows = mixed_precision_table(problem, "accumulation")
    if not rows.empty:
        out.add(
            grid(
                rows,
                "mixed_precision",
                title="0.01 added 1000 times (exact sum 10)",
                caption="The sum as printed, and its error against 10",
                labels=[("experiment", "experiment")],
                values=[
                    Value("accumulator", "accumulator", "text"),
                    Value("addend", "addend", "text"),
                    Value("sum", "result", "text"),
                    Value("error", "error", "sci±"),
                ],
            )
        )
        out.add(Bullets(accumulation_observations(records(rows, "mixed_precision"))))
    return finish(problem, out)


def accumulation_observations(rows: list[dict]) -> list[str]:
    by = {(str(r.get("accumulator")), str(r.get("addend"))): r for r in rows}
    lines = []
    exact, half = by.get(("fp32", "fp32")), by.get(("fp16", "fp16"))
    if number(exact, "error") and number(half, "error"):
        lines.append(
            f"An fp16 accumulator ends {number(half, 'error'):+.1e} off, {times(abs(number(half, 'error') / number(exact, 'error')))} "
            f"the error of an fp32 one ({number(exact, 'error'):+.1e})."
        )
    mixed = [r for (acc, add), r in by.items() if acc == "fp32" and add.startswith("fp16")]
    if len(mixed) >= 2 and len({str(r.get("result")) for r in mixed}) == 1:
        lines.append(
            f"fp16 addends into an fp32 accumulator end at {mixed[0]['result']} with or without the explicit "
            f"cast ({number(mixed[0], 'error'):+.1e})."
        )
    return lines


def write_benchmarking(problem: Results) -> Section:
    out = section(problem)
    timing = problem.other(benchmarking.LABEL)
    dtypes = mixed_precision_table(problem, "autocast")
    out.add(Heading("(a), (b) The toy model's dtypes under autocast"))
    if not dtypes.empty:
        out.add(
            grid(
                dtypes,
                "mixed_precision",
                title="dtype of each tensor of the toy model under autocast",
                caption="fc1, ReLU, LayerNorm, fc2, then cross-entropy and backward, parameters in fp32",
                labels=[("tensor", "tensor")],
                values=[Value("fp16 autocast", "fp16", "text"), Value("bf16 autocast", "bf16", "text")],
            )
        )
        norm = [r for r in records(dtypes, "mixed_precision") if "LayerNorm" in str(r.get("tensor"))]
        if norm:
            out.add(
                Bullets(
                    [
                        f"LayerNorm's output is {norm[0]['fp16']} under fp16 autocast and {norm[0]['bf16']} under bf16 "
                        f"autocast on {norm[0].get('device')}; autocast's op lists differ between devices, so on a GPU "
                        "measure it there."
                    ]
                )
            )
    bf16 = problem.rows("benchmark")
    fp32 = timing_rows(timing)
    out.add(Heading("(c) bf16 autocast against fp32, per size"))
    if not bf16.empty and fp32.empty:  # the fp32 rows are benchmarking_script's, not in this plan
        out.add(benchmark.phase_table(bf16, "bf16 autocast"))
        out.add(Bullets(["The fp32 rows to compare with are benchmarking_script's, which this plan did not run."]))
    elif not bf16.empty:
        both = pd.concat([fp32, bf16], ignore_index=True)
        both = both[both["pass_type"].isin(set(bf16["pass_type"]))]
        out.add(benchmark.speedup_table(both, "precision", "fp32", "bf16", "fp32 and bf16 autocast"))
        out.add(Bullets(precision_observations(records(both, "benchmark"))))
    return finish(problem, out)


def timing_rows(timing: Results | None) -> pd.DataFrame:
    return timing.rows("benchmark", "-b") if timing else pd.DataFrame()


def precision_observations(rows: list[dict]) -> list[str]:
    """bf16 against fp32 per model and pass, each from the two rows' steps (stats.compare); the trend
    with model size only where the smallest and the largest model's speedups are resolved apart."""
    rows = ok(rows)
    found = []
    for model in dict.fromkeys(r["model"] for r in rows):
        for pass_type in ("forward", "forward-backward", "train-step"):
            fp32 = pick(rows, model=model, pass_type=pass_type, precision="fp32")
            bf16 = pick(rows, model=model, pass_type=pass_type, precision="bf16")
            if (comparison := versus(bf16, fp32)) is not None:
                found.append((number(fp32, "num_params") or 0, model, pass_type, comparison))
    if not found:
        return []
    lines = [
        f"{model}, {pass_type}: bf16 autocast runs {speed_text(c)} against fp32." for _, model, pass_type, c in found
    ]
    ordered = sorted(found, key=lambda f: f[0])
    (_, small, _, a), (_, large, pass_type, b) = ordered[0], ordered[-1]
    # the speedup is fp32 / bf16 = 1 / ratio: apart when one's interval lies wholly beyond the other's
    if small != large and a.resolved and b.resolved and (b.high < a.low or b.low > a.high):
        trend = "grows" if b.ratio < a.ratio else "shrinks"
        lines.append(
            f"The speedup {trend} with model size: {times(1 / a.ratio)} for {small}, {times(1 / b.ratio)} for {large} "
            f"({pass_type}); their intervals do not overlap."
        )
    return lines


ACCUMULATION_PROBLEM = Problem(
    ACCUMULATION, "Mixed-Precision Accumulation", plan=plan_accumulation, write=write_accumulation
)
BENCHMARKING_PROBLEM = Problem(
    BENCHMARKING, "Benchmarking Mixed Precision", plan=plan_benchmarking, write=write_benchmarking
)
