"""mixed_precision_accumulation (fp32 and fp16 accumulators) and benchmarking_mixed_precision (the toy
model's dtypes under autocast, then bf16 autocast against fp32 per size): both read the rows of the
mixed_precision tool, the second also a bf16 sweep beside benchmarking_script's fp32 one."""

from __future__ import annotations

import pandas as pd

from ...report import benchmark
from ...report.document import Bullets, Heading, Section
from ...report.grid import Value, grid
from ...report.observe import maker, number, observations, ok, pick, say, times, versus
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
        out.add(observations(accumulation_observations, rows, "mixed_precision", {"table": "accumulation"}))
    return finish(problem, out)


@maker
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
        out.add(observations(layernorm_observations, dtypes, "mixed_precision", {"table": "autocast"}))
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
        out.add(observations(precision_observations, both, "benchmark"))
    return finish(problem, out)


@maker
def layernorm_observations(rows: list[dict]) -> list[str]:
    return [
        f"LayerNorm's output is {r['fp16']} under fp16 autocast and {r['bf16']} under bf16 autocast on "
        f"{r.get('device')}; autocast's op lists differ between devices, so on a GPU measure it there."
        for r in [r for r in rows if "LayerNorm" in str(r.get("tensor"))][:1]
    ]


def timing_rows(timing: Results | None) -> pd.DataFrame:
    return timing.rows("benchmark", "-b") if timing else pd.DataFrame()


@maker
def precision_observations(rows: list[dict]) -> list[str]:
    """bf16 against fp32 per pass over the models, each a claim from the two rows' steps (the model where
    the speedup is highest named only where its interval clears every other model's)."""
    rows, lines = ok(rows), []
    for pass_type in ("forward", "forward-backward", "train-step"):
        claims = [
            (versus(*(pick(rows, model=m, pass_type=pass_type, precision=p) for p in ("bf16", "fp32"))), m)
            for m in dict.fromkeys(r["model"] for r in rows)
        ]
        if said := say(claims, f"bf16 autocast ({pass_type})", "fp32", "speed", "models"):
            lines.append(said + ".")
    return lines


ACCUMULATION_PROBLEM = Problem(
    ACCUMULATION, "Mixed-Precision Accumulation", plan=plan_accumulation, write=write_accumulation
)
BENCHMARKING_PROBLEM = Problem(
    BENCHMARKING, "Benchmarking Mixed Precision", plan=plan_benchmarking, write=write_benchmarking
)
