"""memory_profiling: (a, e) memory snapshots drawn as active-memory timelines with their largest
allocations (a GPU's caching allocator), (b, c) peaks per context of a forward and a training step in
fp32 and bf16, (d) one residual-stream activation, (f, 2026) what autograd saves per block."""

from __future__ import annotations

from ...models import size_table
from ...report import benchmark
from ...report.document import Figure, Heading, Section, sig3
from ...report.fields import label_text
from ...report.grid import Value, grid
from ...report.observe import change, maker, number, observations, ok, pick, span, times
from ...tools import module_name
from ...units import MIB
from ..parameters import FULL, Options
from ..plan import Step, fit_verdict
from ..target import Target
from .base import Problem, Results, finish, reads, section
from .model_steps import MEMORY_SWEEP, memory_options, model_flags, sweep, worst_peak

LABEL = "memory_profiling"
EMULATED = "bf16 is emulated on this CPU (no AVX512-BF16 or AMX), tens of times slower than fp32"


def plan(options: Options, target: Target) -> list[Step]:
    options = memory_options(options)
    scale, edition = options.scale, options.edition
    size = scale.memory_size[edition] if not scale.sizes else scale.sizes[0]
    contexts = list(scale.memory_contexts[edition])
    # a CPU that emulates bf16 takes minutes for one such step at this shape: (c) is the GPU's
    precisions = ["fp32"] if "bf16" in target.emulated else ["fp32", "bf16"]
    steps = sweep(
        options,
        target,
        LABEL,
        "peaks",
        "(b, c) peaks",
        size,
        {"--context-lengths": contexts, "--pass-types": ["forward", "train-step"], "--precisions": precisions},
        tool=MEMORY_SWEEP,
    )
    if "bf16" in target.emulated:
        for step in steps:
            step.reductions.append(f"{EMULATED}: the bf16 peaks of (c) are left to a GPU")
    for pass_type in ("forward", "train-step"):
        steps += _snapshot_steps(options, target, size, contexts[0], pass_type)
    if edition == "2026":
        steps.append(_residuals_step(options, size, contexts[0]))
    return steps


def _snapshot_steps(options: Options, target: Target, size: str, context: int, pass_type: str) -> list[Step]:
    """One step recording the CUDA allocator over a measured step, one drawing it (GPU only: the
    snapshot is the CUDA caching allocator's history)."""
    name = f"{LABEL}-snapshot-{pass_type}"
    flags = {
        **model_flags(options, size),
        "--context-length": context,
        "--batch-size": options.scale.batch,
        "--pass-type": pass_type,
        "--warmup-steps": 1,
        "--measure-steps": 1,
        "--device": options.device,
        "--memory-snapshot": f"{name}.pickle",
    }
    flags["--model-size"] = flags.pop("--model-sizes")[0]
    record = Step(
        name,
        LABEL,
        f"(a) memory snapshot of one {pass_type} ({size}, context {context}), for pytorch.org/memory_viz",
        module_name("benchmark"),
        flags,
        kind="benchmark",
    )
    drawn = Step(
        f"{name}-timeline",
        LABEL,
        f"(a, e) active memory timeline of the {pass_type} snapshot, and its largest allocations",
        module_name("memory.timeline"),
        {"--snapshot": f"{name}.pickle", "--plot": f"{name}.png", "--output": f"{name}-largest.csv"},
        reads=(f"{name}-largest.csv",),
        figures=(f"{name}.png",),
        fixed_s=10,
    )
    peak = worst_peak(options, target, flags, module_name("benchmark"))
    verdict, why = fit_verdict(peak, target)
    if target.type != "cuda":
        record.skip("a memory snapshot records the CUDA caching allocator: needs a GPU")
        drawn.skip("draws the memory snapshot, which needs a GPU")
    elif verdict == "no":
        record.predicted_peak_bytes = peak
        record.skip(why)
        drawn.skip(f"draws the {pass_type} snapshot, which is not taken: it does not fit")
    return [record, drawn]


def _residuals_step(options: Options, size: str, context: int) -> Step:
    flags = {
        **model_flags(options, size),
        "--context-length": context,
        "--batch-size": options.scale.batch,
        "--device": options.device,
        "--output": [f"{LABEL}-residuals.csv"],
    }
    flags["--model-size"] = flags.pop("--model-sizes")[0]
    step = Step(
        f"{LABEL}-residuals",
        LABEL,
        f"(f) what autograd saves per block ({size})",
        module_name("residuals"),
        flags,
        reads=(f"{LABEL}-residuals.csv",),
        capture=f"{LABEL}-residuals.txt",
        fixed_s=90,
    )
    if options.model_factory:
        flags.pop("--model-factory")
        step.reductions.append("residuals reads the built-in model's blocks (not your --model-factory)")
    if options.scale.name == "small":
        flags["--no-compile"] = True
        step.fixed_s = 20
        step.reductions.append("small scale: the compiled block is left out (compiling it takes a minute on a CPU)")
    return step


def write(problem: Results) -> Section:
    out = section(problem)
    rows = problem.rows("benchmark", "peaks")
    figures = [s for s in problem.steps if "snapshot" in s["step"]]
    out.add(Heading("(a), (e) Memory timelines and the largest allocations"))
    for step in figures:
        for name in step["figures"].split() if isinstance(step.get("figures"), str) else []:
            if (problem.directory / name).is_file():
                out.add(Figure(f"Active memory timeline: {step['part']}", problem.directory / name))
        for name in [n for n in reads(step) if n in problem.files]:
            allocations = problem.files[name]
            out.add(
                grid(
                    allocations.head(10),
                    "memory_allocations",
                    title=f"Largest allocations: {step['part']}",
                    caption="From the memory snapshot: size and the first stack frame outside torch",
                    labels=[("rank", "rank")],
                    values=[Value("size (MiB)", "size_bytes", "MiB"), Value("allocated by", "user_frame", "text")],
                )
            )
    if not rows.empty:
        fp32 = rows[rows["precision"] == "fp32"]
        out.add(Heading("(b) Peak memory per context: forward and full training step"))
        out.add(benchmark.memory_table(fp32, "Peak memory, fp32", benchmark.peak_columns(fp32), predicted=True))
        out.add(observations(peak_observations, fp32, "benchmark", {"precision": "fp32"}))
        if (rows["precision"] != "fp32").any():
            out.add(Heading("(c) Mixed precision"))
            out.add(benchmark.memory_table(rows, "Peak memory, fp32 and bf16 autocast", benchmark.peak_columns(rows)))
            out.add(observations(precision_memory_observations, rows, "benchmark"))
        out.add(Heading("(d) One residual-stream activation"))
        out.add(observations(residual_stream, rows, "benchmark", edition=problem.edition))
    residuals = problem.rows("residuals")
    if not residuals.empty:
        out.add(Heading("(f) What one block saves for backward"))
        out.add(
            grid(
                residuals[residuals["rank"] <= 5],
                "residuals",
                title="The five largest contributors to one block's saved tensors",
                caption="Each storage counted once, parameters left out; share of all the block saves",
                labels=[("rank", "rank")],
                values=[
                    Value("submodule", "module", "text"),
                    Value("saved by", "op", "text"),
                    Value("tensors", "tensors", "int"),
                    Value("MiB", "bytes", "MiB"),
                    Value("share (%)", "share_pct", "sig3"),
                ],
            )
        )
        out.add(observations(residual_observations, residuals, "residuals"))
    return finish(problem, out)


@maker
def residual_observations(rows: list[dict]) -> list[str]:
    total = sum(number(r, "bytes") or 0 for r in rows)
    top = sorted(rows, key=lambda r: number(r, "rank") or 0)[:5]
    if not total or not top:
        return []
    share = sum(number(r, "bytes") or 0 for r in top) / total
    return [
        f"One block saves {sig3(total / MIB)} MiB for backward (batch {label_text('batch_size', top[0])}, context "
        f"{label_text('context_length', top[0])}, {label_text('precision', top[0])}); the five largest hold {100 * share:.0f}% of it."
    ]


@maker
def peak_observations(rows: list[dict]) -> list[str]:
    lines = []
    ratios = [
        number(r, "peak_memory_bytes") / number(r, "predicted_memory_bytes")
        for r in ok(rows)
        if number(r, "predicted_memory_bytes") and number(r, "peak_memory_bytes")
    ]
    if ratios:
        source = next((str(r.get("memory_source")) for r in rows if r.get("memory_source")), "")
        lines.append(
            f"The measured peaks are {span(ratios)} the estimator's tensor bytes"
            + (
                " (on a CPU the RSS above the baseline also counts the allocator's slack and first-touched pages)"
                if "rss" in source
                else ""
            )
            + "."
        )
    for context in dict.fromkeys(label_text("context_length", r) for r in rows):
        forward = pick(ok(rows), context_length=context, pass_type="forward")
        step = pick(ok(rows), context_length=context, pass_type="train-step")
        if number(forward, "peak_memory_bytes") and number(step, "peak_memory_bytes"):
            ratio = number(step, "peak_memory_bytes") / number(forward, "peak_memory_bytes")
            lines.append(f"Context {context}: a training step peaks at {times(ratio)} the forward pass's peak.")
    return lines


@maker
def precision_memory_observations(rows: list[dict]) -> list[str]:
    lines = []
    for context in dict.fromkeys(label_text("context_length", r) for r in rows):
        for pass_type in ("forward", "train-step"):
            a = pick(ok(rows), context_length=context, pass_type=pass_type, precision="fp32")
            b = pick(ok(rows), context_length=context, pass_type=pass_type, precision="bf16")
            if number(a, "peak_memory_bytes") and number(b, "peak_memory_bytes"):
                lines.append(
                    f"Context {context}, {pass_type}: bf16 autocast changes the peak by "
                    f"{change(number(b, 'peak_memory_bytes'), number(a, 'peak_memory_bytes'))}."
                )
    return lines


@maker
def residual_stream(rows: list[dict], edition: str) -> list[str]:
    """The size of one (batch, context, d_model) fp32 activation: the handout's question, at its reference
    model, batch and contexts (a derivation, whatever scale ran), then at the shapes the rows measured."""
    size = FULL.memory_size[edition]
    d_model = size_table(edition)[size]["d_model"]
    sizes = [
        f"context {context}: {FULL.batch} x {context} x {d_model} x 4 bytes = {FULL.batch * context * d_model * 4 / MIB:.2f} MiB"
        for context in FULL.memory_contexts[edition]
    ]
    lines = [
        f"At the handout's reference hyperparameters ({size}, d_model {d_model}, batch {FULL.batch}), one fp32 "
        f"residual-stream activation (batch x context x d_model x 4 bytes) is, per context: {'; '.join(sizes)}."
    ]
    seen = set()
    for row in rows:
        key = (number(row, "batch_size"), number(row, "context_length"), number(row, "d_model"))
        if None in key or key in seen:
            continue
        seen.add(key)
        batch, context, d_model = (int(k) for k in key)
        size = batch * context * d_model * 4
        lines.append(
            f"At a shape measured here: batch {batch} x context {context} x d_model {d_model} x 4 bytes = "
            f"{size / MIB:.2f} MiB ({row['model']})."
        )
    return lines


PROBLEM = Problem(LABEL, "Memory Profiling", plan=plan, write=write)
