"""The write-up's memory problems: memory_profiling (a-f) and gradient_checkpointing."""

from __future__ import annotations

from .. import benchmark
from ..document import Bullets, Figure, Heading, Section, byte_unit, sig3
from ..fields import label_text
from ..grid import Value, grid
from ..observe import change, number, ok, pick, records, span, times
from . import Problem, finish, reads, section

MIB = 2**20


def memory_profiling(problem: Problem) -> Section:
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
        out.add(Bullets(peak_observations(records(fp32, "benchmark"))))
        if (rows["precision"] != "fp32").any():
            out.add(Heading("(c) Mixed precision"))
            out.add(benchmark.memory_table(rows, "Peak memory, fp32 and bf16 autocast", benchmark.peak_columns(rows)))
            out.add(Bullets(precision_memory_observations(records(rows, "benchmark"))))
        out.add(Heading("(d) One residual-stream activation"))
        out.add(Bullets(residual_stream(records(rows, "benchmark"))))
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
        out.add(Bullets(residual_observations(records(residuals, "residuals"))))
    return finish(problem, out)


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


def residual_stream(rows: list[dict]) -> list[str]:
    """The size of one (batch, context, d_model) fp32 activation, from the rows' configuration."""
    lines = []
    seen = set()
    for row in rows:
        key = (number(row, "batch_size"), number(row, "context_length"), number(row, "d_model"))
        if None in key or key in seen:
            continue
        seen.add(key)
        batch, context, d_model = (int(k) for k in key)
        size = batch * context * d_model * 4
        lines.append(
            f"batch {batch} x context {context} x d_model {d_model} x 4 bytes = {size / MIB:.2f} MiB ({row['model']})."
        )
    return lines


def gradient_checkpointing(problem: Problem) -> Section:
    out = section(problem)
    rows = problem.rows("benchmark")
    if not rows.empty:
        unit = byte_unit(rows["peak_memory_bytes"])
        out.add(
            grid(
                rows,
                "benchmark",
                title="Peak memory and step time per checkpointed group size",
                caption="Each run of K consecutive blocks wrapped in one torch.utils.checkpoint (off: none; all: one group)",
                labels=[("checkpoint blocks", "checkpoint_blocks")],
                values=[Value(f"peak ({unit})", "peak_memory_bytes", unit), Value("step (ms)", "mean_ms", "ms±")],
            )
        )
        out.add(Bullets(checkpoint_observations(records(rows, "benchmark"))))
    return finish(problem, out)


def checkpoint_observations(rows: list[dict]) -> list[str]:
    rows = [r for r in ok(rows) if number(r, "peak_memory_bytes")]
    if not rows:
        return []
    base = pick(rows, checkpoint_blocks="off")
    best = min(rows, key=lambda r: number(r, "peak_memory_bytes"))
    label = label_text("checkpoint_blocks", best)
    text = (
        "The lowest peak is without checkpointing"
        if label == "off"
        else f"The lowest peak is with {label} block{'s' * (label != '1')} per checkpointed group"
    )
    if base is not None and best is not base:
        text += (
            f": {change(number(best, 'peak_memory_bytes'), number(base, 'peak_memory_bytes'))} against no checkpointing, "
            f"for {change(number(best, 'mean_ms'), number(base, 'mean_ms'))} step time"
        )
    lines = [text + "."]
    ordered = sorted(rows, key=lambda r: benchmark_sort(r))
    at = ordered.index(best)
    for neighbour in (ordered[at - 1] if at > 0 else None, ordered[at + 1] if at + 1 < len(ordered) else None):
        if neighbour is not None and neighbour is not base:
            lines.append(
                f"{label_text('checkpoint_blocks', neighbour)} blocks per group: peak "
                f"{change(number(neighbour, 'peak_memory_bytes'), number(best, 'peak_memory_bytes'))} against the lowest."
            )
    return lines


def benchmark_sort(row: dict) -> tuple:
    from ..fields import sort_key

    return sort_key("checkpoint_blocks", row)
