"""Every measured problem of the CS336 assignment 2 (systems) handout, mapped to this project's tools:
one builder per problem turns the handout's parameters (parameters.py) into the plan's steps, by part:
model.py (benchmarking, mixed precision, checkpointing), profiling.py (nsys, memory), attention.py,
distributed.py, leaderboard.py. Implementation and analytic problems have no builder: nothing runs.
"""

from __future__ import annotations

from ...editions import MEASURED, PROBLEM_KIND, PROBLEMS
from ...errors import UsageError
from ..parameters import Options
from ..plan import Step, fit_verdict, predict
from ..target import Target
from .attention import flash_benchmarking, pytorch_attention, torch_compile
from .distributed import DDP_PROBLEMS, ddp, distributed_communication_single_node
from .leaderboard import leaderboard
from .model import (
    benchmarking_mixed_precision,
    benchmarking_script,
    gradient_checkpointing,
    mixed_precision_accumulation,
)
from .profiling import memory_profiling, nsys_profile


def build_steps(options: Options, target: Target, problems: list[str]) -> list[Step]:
    """The plan: every step of the chosen problems in the handout's order, predicted and judged."""
    steps: list[Step] = []
    for problem in PROBLEMS[options.edition]:
        if problem in problems and PROBLEM_KIND[problem] == MEASURED:
            steps += BUILDERS[problem](options, target)
    for step in steps:
        if step.status == "run":
            try:
                predict(step, target, user_model=options.model_factory is not None)
            except UsageError as exc:  # what the step's tool refuses (its configuration's own words)
                step.skip(str(exc))
                continue
            verdict, why = fit_verdict(step.predicted_peak_bytes, target)
            if verdict == "no" and step.kind in ("benchmark", "warmup", "ddp"):
                step.skip(why)  # a model step predicted not to fit (attention steps run every shape on purpose)
            elif not step.reason:
                step.reason = why
    return steps


BUILDERS = {
    "benchmarking_script": benchmarking_script,
    "nsys_profile": nsys_profile,
    "mixed_precision_accumulation": mixed_precision_accumulation,
    "benchmarking_mixed_precision": benchmarking_mixed_precision,
    "memory_profiling": memory_profiling,
    "gradient_checkpointing": gradient_checkpointing,
    "pytorch_attention": pytorch_attention,
    "torch_compile": torch_compile,
    "flash_benchmarking": flash_benchmarking,
    "distributed_communication_single_node": distributed_communication_single_node,
    **{problem: (lambda options, target, problem=problem: ddp(problem, options, target)) for problem in DDP_PROBLEMS},
    "leaderboard": leaderboard,
}
