"""The problems with nothing to measure: implementations the official tests check (their section points
at the test), and derivations on paper (the student's; their section lists the measured rates a
calculation may use)."""

from __future__ import annotations

import pandas as pd

from ...report.document import Bullets, Section, Text, sig3
from ...report.fields import label_text, model_label
from ...report.load import tool_of
from ...report.observe import maker, number, observations, ok
from .base import ANALYTIC, IMPLEMENTATION, Problem, Results, unanswered

# Each implementation and the official test it passes (`uv run pytest ...`, as the handout says).
OFFICIAL_TESTS = {
    "flash_forward": ("FlashAttention-2 Forward Pass", "-k test_flash_forward_pass"),
    "flash_backward": ("FlashAttention-2 Backward Pass", "-k test_flash_backward"),
    # the handout's pointer: the check is the student's
    "naive_ddp": ("Naive DDP", "tests/test_ddp_individual_parameters.py"),
    "ddp_overlap_individual_parameters": (
        "DDP with Overlapping Individual Parameters",
        "tests/test_ddp_individual_parameters.py",
    ),
    "ddp_overlap_bucketed": ("DDP with Overlapping Bucketed Gradients", "tests/test_ddp.py"),
    "optimizer_state_sharding": ("Optimizer State Sharding", "tests/test_sharded_optimizer.py"),
    "fsdp": ("Fully-Sharded Data Parallel", "tests/test_fsdp.py"),
}
DERIVATIONS = {
    "communication_accounting": "Communication Accounting (4D Parallelism)",
    "alternate_ring_all_reduce": "Alternate Ring All-Reduce",
    "data_parallel_calcs": "Data Parallel Calculations",
    "fsdp_calcs": "Fully Sharded Data Parallel Calculations",
    "tp_calcs": "Tensor Parallel Calculations",
    "fsdp_tp_calcs": "2D Parallelism Calculations",
}


def implementation_section(problem: Results) -> Section:
    tests = problem.problem.official_test
    section = Section(f"{problem.label}: {problem.title}", problem.label).add(
        Text(
            f"Code, not a measurement: the official tests check it (`uv run pytest {tests}`). Its speed and "
            "memory are measured in the benchmarking problems that follow."
        )
    )
    return _with_parts(problem, section)


def _with_parts(problem: Results, section: Section) -> Section:
    """Each lettered sub-question named, as the student's."""
    lines = unanswered(problem, section)
    return section.add(Bullets(lines)) if lines else section


def analytic_section(problem: Results) -> Section:
    section = Section(f"{problem.label}: {problem.title}", problem.label)
    section.add(Text("A derivation, not a measurement: the student's to write. Not measured here."))
    measured = [f for f in problem.files.values() if tool_of(f) in RATES and RATES[tool_of(f)] in f.columns]
    if measured:
        section.add(observations(rates, pd.concat(measured, ignore_index=True)))
    return _with_parts(problem, section)


RATES = {"allreduce_bench": "busbw_gbps", "benchmark": "achieved_tflops"}


@maker
def rates(rows: list[dict]) -> str:
    """What the analytic problems may use: the fastest all-reduce bus bandwidth and the fastest model
    FLOP rate among the results measured on a GPU (none from a CPU)."""
    best: dict[str, tuple[float, dict]] = {}
    for row in ok(rows):
        value = number(row, RATES.get(str(row.get("tool")), ""))
        if not str(row.get("device") or "").startswith("cuda") or value is None:
            continue  # the calculations are posed on the handout's GPUs: a CPU's rates answer none of them
        if value > best.get(row["tool"], (0.0, {}))[0]:
            best[row["tool"]] = (value, row)
    lines = []
    if "allreduce_bench" in best:
        value, row = best["allreduce_bench"]
        lines.append(
            f"all-reduce bus bandwidth {sig3(value)} GB/s ({row['backend']}, {label_text('world_size', row)} ranks, "
            f"{row['size']}; {row['source']})"
        )
    if "benchmark" in best:
        value, row = best["benchmark"]
        lines.append(
            f"model FLOP rate {sig3(value)} TFLOP/s ({model_label(row)}, {label_text('pass_type', row)}, "
            f"{label_text('precision', row)}; {row['source']})"
        )
        if number(row, "peak_tflops"):
            lines.append(
                f"the {label_text('precision', row)} peak that rate's MFU divides by: {sig3(number(row, 'peak_tflops'))} TFLOP/s ({row.get('peak_source')})"
            )
    return f"Measured here, should the calculation want them: {'; '.join(lines)}." if lines else ""


PROBLEMS = (
    *(
        Problem(label, title, IMPLEMENTATION, official_test=test, write=implementation_section)
        for label, (title, test) in OFFICIAL_TESTS.items()
    ),
    *(Problem(label, title, ANALYTIC, write=analytic_section) for label, title in DERIVATIONS.items()),
)
