"""gradient_checkpointing (2026): peak memory and step time of a training step per checkpointed group
size (off, 1, 2, 4, sqrt, all blocks), each configuration in a process of its own; a student's model
(--model-factory) has its own repeated blocks checkpointed the same way (checkpointing.py)."""

from __future__ import annotations

from ...report.document import Heading, Section, byte_unit
from ...report.fields import label_text, sort_key
from ...report.grid import Value, grid
from ...report.observe import change, maker, number, observations, ok, pick, say, versus
from ..parameters import Options
from ..plan import Step
from ..target import Target
from .base import Problem, Results, finish, section
from .model_steps import MEMORY_SWEEP, memory_options, sweep

LABEL = "gradient_checkpointing"


def plan(options: Options, target: Target) -> list[Step]:
    options = memory_options(options)
    scale = options.scale
    size = scale.memory_size["2026"] if not scale.sizes else scale.sizes[0]
    flags = {
        "--context-lengths": [scale.checkpoint_context],
        "--pass-types": ["train-step"],
        "--precisions": ["fp32"],
        "--checkpoint-blocks": list(scale.checkpoint_blocks),
    }
    return sweep(
        options,
        target,
        LABEL,
        "blocks",
        "(b) block sizes",
        size,
        flags,
        "--checkpoint-blocks",
        tool=MEMORY_SWEEP,
    )


def write(problem: Results) -> Section:
    out = section(problem)
    rows = problem.rows("benchmark")
    out.add(Heading("(b) Peak memory and step time per checkpointed group size"))
    if not rows.empty:
        unit = byte_unit(rows["peak_memory_bytes"])
        out.add(
            grid(
                rows,
                "benchmark",
                title="Peak memory and step time per checkpointed group size",
                caption="Each run of K consecutive blocks wrapped in one torch.utils.checkpoint (off: none; all: one group)",
                labels=[("checkpoint blocks", "checkpoint_blocks")],
                values=[Value(f"peak ({unit})", "peak_memory_bytes", unit), Value("step (ms)", "median_ms", "ms")],
            )
        )
        out.add(observations(checkpoint_observations, rows, "benchmark"))
    return finish(problem, out)


@maker
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
            f": {change(number(best, 'peak_memory_bytes'), number(base, 'peak_memory_bytes'))} against no checkpointing"
        )
        if claim := versus(best, base):  # the peak is one number; the step time has its noise
            text += "; " + say(claim, "its step time", "no checkpointing's", "change")
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
    return sort_key("checkpoint_blocks", row)


PROBLEM = Problem(LABEL, "Memory-Optimal Gradient Checkpointing", plan=plan, write=write)
