"""The write-up of a handout plan (handout_plan.csv of `cs336-bench handout`): a first page saying
what was measured where and a checklist of every problem, then one section per problem of the
edition in the handout's order, then the plan itself with every step's command."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd

from ..editions import IMPLEMENTATION, MEASURED, PROBLEM_KIND, PROBLEMS
from .document import Bullets, Document, Section, Text
from .grid import Value, grid
from .problems import Problem, analytic_section, implementation_section, load_files
from .problems import attention as attention_problems
from .problems import distributed as distributed_problems
from .problems import memory as memory_problems
from .problems import precision as precision_problems
from .problems import profile as profile_problems
from .problems import timing as timing_problems
from .summary import first_page


def _measured_builders(problems: dict[str, Problem]) -> dict[str, Callable[[Problem], Section]]:
    get = problems.get
    return {
        "benchmarking_script": timing_problems.benchmarking_script,
        "nsys_profile": profile_problems.nsys_profile,
        "mixed_precision_accumulation": precision_problems.mixed_precision_accumulation,
        "benchmarking_mixed_precision": lambda p: precision_problems.benchmarking_mixed_precision(
            p, get("benchmarking_script")
        ),
        "memory_profiling": memory_problems.memory_profiling,
        "gradient_checkpointing": memory_problems.gradient_checkpointing,
        "pytorch_attention": attention_problems.pytorch_attention,
        "torch_compile": lambda p: attention_problems.torch_compile(p, get("pytorch_attention")),
        "flash_benchmarking": attention_problems.flash_benchmarking,
        "distributed_communication_single_node": distributed_problems.distributed_communication_single_node,
        "naive_ddp_benchmarking": distributed_problems.ddp_problem,
        "minimal_ddp_flat_benchmarking": distributed_problems.ddp_problem,
        "ddp_overlap_individual_parameters_benchmarking": distributed_problems.ddp_problem,
        "ddp_bucketed_benchmarking": distributed_problems.ddp_problem,
        "optimizer_state_sharding_accounting": distributed_problems.optimizer_state_sharding_accounting,
        "fsdp_accounting": distributed_problems.fsdp_accounting,
        "leaderboard": lambda p: (
            attention_problems.leaderboard_2025(p)
            if not p.rows("attention_bench").empty
            else timing_problems.leaderboard(p)
        ),
    }


def build_writeup(
    plan: pd.DataFrame, plan_path: Path, out_dir: Path, stem: str, paragraphs: list[str]
) -> tuple[Document, list[str]]:
    """The write-up's document, and one line per expected result file that is missing."""
    plan = plan.sort_values("order") if "order" in plan.columns else plan
    edition = str(plan["edition"].iloc[0]).split(".")[0]
    directory = plan_path.parent
    files, missing = load_files(plan, directory)
    files[plan_path.name] = plan.assign(source=plan_path.name)
    problems: dict[str, Problem] = {}
    for label in PROBLEMS.get(edition, ()):
        steps = [s for s in plan.to_dict("records") if s["problem"] == label]
        problems[label] = Problem(label, edition, steps, directory, out_dir, stem, files)
    builders = _measured_builders(problems)
    sections = []
    for label, problem in problems.items():
        kind = PROBLEM_KIND[label]
        if kind == IMPLEMENTATION:
            sections.append(implementation_section(problem))
        elif kind != MEASURED:
            sections.append(analytic_section(problem, distributed_problems.rates(files)))
        elif not problem.steps:
            sections.append(left_out(problem))
        else:
            sections.append(builders[label](problem))
    title = f"CS336 assignment 2 (systems): write-up, {edition} edition"
    front = first_page(plan, files, problems, plan_path.name)
    sections = [front, *sections, plan_appendix(plan, plan_path.name)]
    return Document(title, paragraphs, sections), missing


def left_out(problem: Problem) -> Section:
    return Section(f"{problem.label}: {problem.title}", problem.label).add(
        Text(
            "Not measured: this plan left it out (--problems). "
            f"`cs336-bench handout --edition {problem.edition} --problems {problem.label}` measures it."
        )
    )


def plan_appendix(plan: pd.DataFrame, source: str) -> Section:
    """Every step of the plan: outcome, prediction against what it took, and its command."""
    frame = plan.assign(source=source)
    table = grid(
        frame,
        "handout",
        title="Every step of the plan",
        caption="Predictions are rough (time from FLOPs at a fixed share of the device's peak, memory from the "
        "estimator); outcomes and times are measured",
        labels=[("problem", "problem"), ("step", "step")],
        values=[
            Value("outcome", "outcome", "text"),
            Value("predicted peak", "predicted_peak_bytes", "bytes"),
            Value("predicted time", "predicted_s", "s"),
            Value("took", "elapsed_s", "s"),
        ],
    )
    commands = [
        f"{row['step']}: `{row['command']}`"
        for row in plan.to_dict("records")
        if isinstance(row.get("command"), str) and row["command"]
    ]
    section = Section("The plan and its commands", None, [table])
    section.add(
        Text("Each step's command, as run (outputs in this directory; `--resume` continues a sweep):"),
        Bullets(commands),
    )
    return section
