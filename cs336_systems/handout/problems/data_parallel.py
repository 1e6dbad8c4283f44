"""The data-parallel problems, each one ddp_bench run of its strategies, built in and the student's own
(--adapters): naive DDP, flat gradients, overlapped and bucketed DDP, optimizer-state sharding and FSDP
accounting (the bytes each rank holds, step time, the all-gather against the forward)."""

from __future__ import annotations

import functools

from ...report import distributed
from ...report.document import Heading, Section, sig3
from ...report.fields import label_text
from ...report.observe import maker, number, observations, ok, pick, say, times, versus
from ...results import plausibility
from ...tools import module_name
from ...units import MIB
from ..parameters import DDP_CPU_SHAPE, Options
from ..plan import Step, fit_verdict, predict
from ..target import Target
from .base import Problem, Results, finish, section
from .model_steps import STUDENT_MODEL, defined_in_repository

# problem -> (built-in strategies, the student's strategy, what runs): every step is ddp_bench, whose
# rows carry step and communication time, bytes of parameters / gradients / optimizer state per rank,
# each rank's forward and backward ms and (FSDP) the all-gather and reduce-scatter time.
DDP_PROBLEMS = {
    "naive_ddp_benchmarking": (["naive"], None, "individual all-reduce after backward"),
    "minimal_ddp_flat_benchmarking": (["naive", "flat"], None, "one flattened all-reduce"),
    "ddp_overlap_individual_parameters_benchmarking": (["ddp"], "adapter-ddp", "(a) overlapped with backward"),
    "ddp_bucketed_benchmarking": (["ddp"], "adapter-ddp-bucketed", "(a) bucketed, per bucket size"),
    "optimizer_state_sharding_accounting": (
        ["ddp", "zero1"],
        "adapter-sharded-optimizer",
        "(a, b) bytes per rank and step time, optimizer state sharded",
    ),
    "fsdp_accounting": (
        ["fsdp2"],
        "adapter-fsdp",
        "(a, b) bytes per rank, all-gather time against the forward, fully sharded",
    ),
}


# one process, measured once: every data-parallel step reads its row (--baseline) and shows it (the plan keeps
# one step of an id)
BASELINE_STEP, BASELINE_FILE = "ddp_single", "ddp_single.csv"


def plan(problem: str, options: Options, target: Target) -> list[Step]:
    """The one-process baseline, then one ddp_bench step of the problem's strategies. A student's FSDP
    shards their own model's layer classes, so it runs on their model (cs336_basics.model's, when the
    repository has it): in a step of its own (with its own one process), so a model or strategy of theirs
    that fails costs only their rows, never the harness's fsdp2 and single rows that answer (a)."""
    strategies, adapter_strategy, what = DDP_PROBLEMS[problem]
    theirs = [adapter_strategy] if adapter_strategy and options.adapters else []
    baseline = _ddp_step(problem, BASELINE_STEP, ["single"], "one process, the baseline", options, target)
    predict(baseline, target, user_model=options.model_factory is not None)
    # one process that cannot fit is no step: each run then has its own one-process row, out of memory
    planned = [baseline] if fit_verdict(baseline.predicted_peak_bytes, target)[0] != "no" else []
    if theirs == ["adapter-fsdp"] and not options.model_factory and defined_in_repository(STUDENT_MODEL):
        yours = _ddp_step(problem, f"{problem}-yours", theirs, what, options, target, STUDENT_MODEL)
        yours.reductions.insert(0, f"your model ({STUDENT_MODEL}), whose layers your FSDP wraps")
        return [*planned, _ddp_step(problem, problem, strategies, what, options, target, baseline=bool(planned)), yours]
    step = _ddp_step(problem, problem, [*strategies, *theirs], what, options, target, baseline=bool(planned))
    if adapter_strategy and not options.adapters:
        step.reductions.append(f"{adapter_strategy} (your implementation) needs --adapters; built-in strategies only")
    return [*planned, step]


def _ddp_step(
    problem: str,
    step_id: str,
    strategies: list[str],
    what: str,
    options: Options,
    target: Target,
    model_factory: str | None = None,
    baseline: bool = False,
) -> Step:
    model_factory = model_factory or options.model_factory
    scale = options.scale
    flags = {
        "--strategies": strategies,
        "--size-table": options.edition,
        "--model-size": scale.ddp_size,
        "--context-length": scale.ddp_context,
        "--batch-size": scale.batch,
        "--warmup-steps": scale.warmup,
        "--measure-steps": scale.measure,
        "--output": [f"{step_id}.csv", f"{step_id}.jsonl", f"{step_id}.md"],
    }
    if "bucketed" in problem:
        flags["--bucket-cap-mb"] = list(scale.buckets)
    if any(s.startswith("adapter-") for s in strategies):
        flags["--adapters"] = options.adapters
    step = Step(
        step_id,
        problem,
        f"{what}: {' '.join(strategies)}",
        module_name("ddp_bench"),
        flags,
        kind="ddp",
        reads=(f"{step_id}.csv", *([BASELINE_FILE] if baseline else [])),
    )
    if baseline:
        flags["--baseline"] = BASELINE_FILE
    if model_factory:
        flags["--model-factory"] = model_factory
    if options.optimizer:
        flags["--optimizer"] = options.optimizer  # ddp_bench steps it under each strategy
    if target.gpus >= 2:
        flags.update({"--backend": "nccl", "--device": "cuda", "--world-sizes": [2]})
    else:
        flags.update(
            {
                "--backend": "gloo",
                "--device": "cpu",
                "--world-sizes": [2],
                **DDP_CPU_SHAPE,
                "--model-size": "small",
                "--context-length": min(scale.ddp_context, 128),
                "--batch-size": 2,
                "--warmup-steps": 1,
                "--measure-steps": 3,
            }
        )
        step.reductions.append(
            f"{'one GPU' if target.gpus == 1 else 'no GPU'}: 2 gloo ranks on CPU at a small shape "
            "(d_model 128, 2 layers, context up to 128, batch 2, 1 + 3 steps): not the handout's "
            "XL timings"
        )
    return step


def _step(rows: list[dict], strategy: str, **more) -> dict | None:
    return pick(ok(rows), strategy=strategy, **more)


def write_ddp(problem: Results) -> Section:
    """naive_ddp_benchmarking, minimal_ddp_flat_benchmarking, the overlapped and bucketed problems."""
    out = section(problem)
    rows = problem.rows("ddp_bench")
    if any(part.letter == "a" for part in problem.problem.parts_in(problem.edition)):
        out.add(Heading("(a) Time per training step, each strategy against one process and the others"))
    if not rows.empty:
        out.add(distributed.ddp_time_table(rows, "Time per training step"))
        out.add(observations(ddp_observations, rows, "ddp_bench"))
    return finish(problem, out)


@maker
def ddp_observations(rows: list[dict]) -> list[str]:
    """Each strategy's median step and the communication it exposes (only where it is a result:
    results/plausibility.py), against one process; the flat all-reduce against one per tensor from the
    two rows' timed loops, each a claim."""
    lines = []
    single = _step(rows, "single")
    for row in ok(rows):
        strategy = label_text("strategy", row)
        if strategy == "single":
            continue
        bucket = label_text("bucket_cap_mb", row)
        text = f"{strategy}{f' ({bucket} MB buckets)' if bucket else ''} on {label_text('world_size', row)} ranks: "
        text += f"median step {sig3(number(row, 'median_ms'))} ms"
        unusable = plausibility.problems(row)
        if "comm_ms" in unusable:
            text += f"; {unusable['comm_ms']}: not measurable here"
        elif number(row, "comm_ms") is not None:
            text += (
                f", of which {sig3(number(row, 'comm_ms'))} ms communicating ({sig3(number(row, 'comm_pct'))}% of it)"
            )
        if claim := versus(row, single):
            text += f"; {say(claim, 'its step', 'one process', 'change')}"
        lines.append(text + ".")
    naive, flat = _step(rows, "naive"), _step(rows, "flat")
    if all(isinstance((r or {}).get("comm_step_ms"), list) for r in (naive, flat)):
        claim = versus(flat, naive, samples="comm_step_ms")
        lines.append(say(claim, "One flat all-reduce", "one all-reduce per parameter tensor", "change") + ".")
    return lines


def accounting(problem: Results, memory: str, timing: str, compared_with: str, time_observations) -> Section:
    """optimizer_state_sharding_accounting and fsdp_accounting: (a) what each rank holds and its peaks,
    each strategy against `compared_with`; (b) the step's time, read by `time_observations`."""
    out = section(problem)
    rows = problem.rows("ddp_bench")
    if not rows.empty:
        out.add(Heading(f"(a) {memory}"))
        out.add(distributed.held_table(rows, "Bytes each rank holds after a step"))
        out.add(distributed.peaks_table(rows, "Peak memory of a rank"))
        out.add(distributed.breakdown_table(rows, "What a rank's memory holds at each peak"))
        out.add(observations(held_observations, rows, "ddp_bench", base=compared_with))
        out.add(Heading(f"(b) {timing}"))
        out.add(distributed.ddp_time_table(rows, "Time per training step"))
        out.add(observations(time_observations, rows, "ddp_bench"))
    return finish(problem, out)


def against_their_baseline(rows: list[dict]) -> list[list[dict]]:
    """Each file's rows with their one-process row: their own (a student's model), else the plan's one."""
    by_file: dict = {}
    for row in rows:
        by_file.setdefault(row.get("source"), []).append(row)
    shared = [group for group in by_file.values() if {label_text("strategy", row) for row in group} == {"single"}]
    return [
        group + (shared[0] if shared and not _step(group, "single") else [])
        for group in by_file.values()
        if group not in shared
    ]


def write_sharding(problem: Results) -> Section:
    memory = "Memory per rank: what each strategy holds, and its peaks"
    return accounting(problem, memory, "Time per step, with and without sharding", "ddp", sharding_time)


def write_fsdp(problem: Results) -> Section:
    return accounting(
        problem, "Memory per rank", "The weights' all-gather against the forward", "single", gather_observations
    )


@maker
def held_observations(rows: list[dict], base: str) -> list[str]:
    """What each strategy holds against `base` (else one process) of its own file."""
    lines = []
    for group in against_their_baseline(rows):
        reference = _step(group, base) or _step(group, "single")
        for row in ok(group):
            if reference is None or row is reference:
                continue
            parts = []
            for header, column in distributed.HELD:
                a, b = number(row, column), number(reference, column)
                if a is not None and b:
                    parts.append(
                        f"{header} {sig3(a / MIB)} MiB ({times(a / b)} of {label_text('strategy', reference)}'s)"
                    )
            if parts:
                lines.append(f"{label_text('strategy', row)}: " + ", ".join(parts) + ".")
    return lines


@maker
def sharding_time(rows: list[dict]) -> list[str]:
    """Each sharded strategy's step against ddp's of its own file, a claim from their steps."""
    lines = []
    for group in against_their_baseline(rows):
        for row in ok(group):
            strategy = label_text("strategy", row)
            if strategy not in ("ddp", "single") and (claim := versus(row, _step(group, "ddp"))):
                said = say(claim, "its step", "ddp's", "change")
                lines.append(f"{strategy}: median step {sig3(number(row, 'median_ms'))} ms; {said}.")
    return lines


@maker
def gather_observations(rows: list[dict]) -> list[str]:
    lines = []
    for row in ok(rows):
        gather = number(row, "fsdp_all_gather_ms")
        if gather is None:
            continue
        text = f"{label_text('strategy', row)}: the all-gathers were in flight {sig3(gather)} ms of one profiled step"
        forward = number(row, "forward_median_ms")  # medians, as the table's step column
        if forward:
            text += f", against a median forward of {sig3(forward)} ms"
        lines.append(text + f" in a median step of {sig3(number(row, 'median_ms'))} ms.")
    return lines


TITLES = {
    "naive_ddp_benchmarking": "Naive DDP Benchmarking",
    "minimal_ddp_flat_benchmarking": "Minimal DDP with Flat Gradients Benchmarking",
    "ddp_overlap_individual_parameters_benchmarking": "DDP Overlapping Individual Parameters Benchmarking",
    "ddp_bucketed_benchmarking": "Bucketed DDP Benchmarking",
    "optimizer_state_sharding_accounting": "Optimizer State Sharding Accounting",
    "fsdp_accounting": "FSDP Accounting",
}
WRITERS = {"optimizer_state_sharding_accounting": write_sharding, "fsdp_accounting": write_fsdp}
PROBLEMS = tuple(
    Problem(label, TITLES[label], plan=functools.partial(plan, label), write=WRITERS.get(label, write_ddp))
    for label in DDP_PROBLEMS
)
