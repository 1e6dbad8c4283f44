"""distributed_communication_single_node: all-reduce of 1 MB to 1 GB on 2, 4 and 6 ranks, gloo on the
CPU and NCCL on the GPUs there are; the section shows time and bus bandwidth per size and world size."""

from __future__ import annotations

from ...report import distributed, plots
from ...report.document import Section, sig3
from ...report.fields import label_text
from ...report.observe import maker, number, observations, ok, say, times, versus
from ...tools import module_name
from ..parameters import Options
from ..plan import Step
from ..target import Target
from .base import Problem, Results, finish, section

LABEL = "distributed_communication_single_node"


def plan(options: Options, target: Target) -> list[Step]:
    scale = options.scale
    steps = []
    for backend, device in (("gloo", "cpu"), ("nccl", "cuda")):
        name = f"{LABEL}-{backend}"
        worlds = list(scale.allreduce_worlds)
        flags = {
            "--backend": backend,
            "--device": device,
            "--world-sizes": worlds,
            "--sizes": list(scale.allreduce_sizes),
            "--warmup-steps": 5,
            "--measure-steps": 20,
            "--output": [f"{name}.csv", f"{name}.jsonl", f"{name}.md"],
            "--plot": f"{name}.png",
        }
        step = Step(
            name,
            LABEL,
            f"all-reduce, {backend} on {device}",
            module_name("allreduce_bench"),
            flags,
            kind="allreduce",
            reads=(f"{name}.csv",),
            figures=(f"{name}.png",),
        )
        if backend == "nccl":
            usable = [w for w in worlds if w <= target.gpus]
            if not usable:
                step.skip(f"NCCL all-reduce needs at least 2 GPUs; this plan has {target.gpus}")
            elif usable != worlds:
                flags["--world-sizes"] = usable
                step.reductions.append(
                    f"world sizes {' '.join(str(w) for w in worlds if w > target.gpus)} dropped: {target.gpus} GPUs"
                )
        elif options.device != "cpu" or scale.name == "full":
            step.reason = "gloo ranks on this machine's CPU cores, as the handout's CPU half asks"
        steps.append(step)
    return steps


def write(problem: Results) -> Section:
    out = section(problem)
    rows = problem.rows("allreduce_bench")
    if not rows.empty:
        for backend, group in rows.groupby("backend", sort=False):
            out.add(*distributed.allreduce_tables(group, f", {backend}"))
        out.add(*plots.allreduce_plot(rows, problem.out_dir, problem.stem))
        out.add(observations(allreduce_observations, rows, "allreduce_bench"))
    return finish(problem, out)


@maker
def allreduce_observations(rows: list[dict]) -> list[str]:
    """Bus bandwidth (from the median, as the table's time) from the smallest to the largest size, and
    how the time grows with the data and with the ranks, each a claim from the two rows' steps."""
    lines = []
    for (backend, world), group in _groups(ok(rows), ("backend", "world_size")).items():
        ordered = sorted(group, key=lambda r: number(r, "size_bytes") or 0)
        if len(ordered) < 2:
            continue
        small, large = ordered[0], ordered[-1]
        text = (
            f"{backend}, {world} ranks: bus bandwidth {sig3(number(small, 'busbw_gbps'))} GB/s at "
            f"{label_text('size', small)} and {sig3(number(large, 'busbw_gbps'))} GB/s at {label_text('size', large)}"
        )
        if claim := versus(large, small):
            data = times(number(large, "size_bytes") / number(small, "size_bytes"))
            text += f"; {say(claim, label_text('size', large), label_text('size', small), 'time')}, {data} the data"
        lines.append(text + ".")
    for (backend, size), group in _groups(ok(rows), ("backend", "size")).items():
        if len(group) > 1:
            ordered = sorted(group, key=lambda r: number(r, "world_size"))
            if claim := versus(ordered[-1], ordered[0]):
                a, b = (f"{label_text('world_size', r)} ranks" for r in (ordered[-1], ordered[0]))
                lines.append(f"{backend}, {size}: {say(claim, a, b, 'change')}.")
    return lines


def _groups(rows: list[dict], keys: tuple[str, ...]) -> dict[tuple, list[dict]]:
    found: dict[tuple, list[dict]] = {}
    for row in rows:
        found.setdefault(tuple(label_text(k, row) for k in keys), []).append(row)
    return found


PROBLEM = Problem(LABEL, "Distributed Communication (Single Node)", plan=plan, write=write)
