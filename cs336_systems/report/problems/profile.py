"""The write-up's nsys_profile: Nsight Systems' kernel summary where it ran, else the torch profiler's
operators of each profiled step, labelled as such."""

from __future__ import annotations

import pandas as pd

from ..document import Bullets, Section, Text, sig3
from ..fields import derive, label_text
from ..grid import Value, grid
from ..observe import number, records
from . import Problem, finish, reads, section

TOP_OPERATORS = 6  # per profiled step in the write-up (the rows keep ten)
MATMUL = ("mm", "matmul", "addmm", "bmm", "gemm", "linear", "cutlass", "sm90_xmma", "ampere_")


def kernel_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (profiled row, operator) of the rows' top_kernels lists, with its share of the
    profiled operators' time: the torch profiler's table, as a result-file view (derive)."""
    rows = derive(frame, "kernels")
    return rows[rows["kernel_rank"] <= TOP_OPERATORS] if "kernel_rank" in rows.columns else rows


def nsys_profile(problem: Problem) -> Section:
    out = section(problem)
    rows = problem.rows("benchmark")
    profiled = (
        rows[rows["top_kernels"].map(lambda k: isinstance(k, list) and len(k) > 0)]
        if "top_kernels" in rows
        else rows.iloc[0:0]
    )
    if not profiled.empty:
        device = ", ".join(dict.fromkeys(str(d) for d in profiled.get("device_name", pd.Series(dtype=object)).dropna()))
        out.add(
            Text(
                f"Nsight Systems was not run here; instead each configuration's profiled step under the torch profiler "
                f"(on {device or 'this machine'}): on a CPU its rows are operators by self time, on a GPU CUDA kernels. "
                "Label: torch profiler, not nsys."
            )
        )
        profiled = derive(profiled, "benchmark")
        for (model, context), group in profiled.groupby(["model", "context_length"], sort=False):
            out.add(kernel_table(kernel_rows(group), f"Longest operators: {model}, context {context}"))
        out.add(Bullets(kernel_observations(records(kernel_rows(profiled), "kernels"))))
    for step in problem.steps:  # Nsight Systems' own kernel summary, where nsys ran
        for name in [n for n in reads(step) if n.endswith("cuda_gpu_kern_sum.csv") and n in problem.files]:
            rows = problem.files[name]
            out.add(nsys_kernel_table(rows, f"CUDA kernels by total time: {step['part']}"))
            out.add(Bullets(nsys_observations(records(rows, "nsys_kernels"))))
    return finish(problem, out)


def nsys_kernel_table(rows: pd.DataFrame, title: str):
    top = rows.sort_values("Total Time (ns)", ascending=False).head(10)
    return grid(
        top,
        "nsys_kernels",
        title=title,
        caption="Nsight Systems' CUDA GPU kernel summary (nsys stats), the ten longest kernels",
        labels=[("kernel", "Name")],
        values=[
            Value("time (%)", "Time (%)", "sig3"),
            Value("total (ms)", "Total Time (ns)", "ms_from_ns"),
            Value("instances", "Instances", "int"),
        ],
    )


def nsys_observations(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    top = max(rows, key=lambda r: number(r, "Total Time (ns)") or 0)
    total = sum(number(r, "Total Time (ns)") or 0 for r in rows)
    mm = sum(number(r, "Total Time (ns)") or 0 for r in rows if any(m in str(r["Name"]).lower() for m in MATMUL))
    lines = [
        f"The longest kernel is `{top['Name']}`: {sig3(number(top, 'Time (%)'))}% of kernel time, {label_text('Instances', top)} launches."
    ]
    if total:
        lines.append(f"Matrix-multiply kernels are {100 * mm / total:.0f}% of the kernel time.")
    return lines


def kernel_table(frame: pd.DataFrame, title: str):
    return grid(
        frame,
        "kernels",
        title=title,
        caption="The profiled step's operators (kernels on a GPU), summed by name: calls, total ms per step, and "
        "share of the profiler's ten longest",
        labels=[("pass", "pass_type"), ("rank", "kernel_rank"), ("operator", "kernel")],
        values=[
            Value("calls", "kernel_calls", "int"),
            Value("total (ms)", "kernel_ms", "sig3"),
            Value("share (%)", "kernel_share_pct", "sig3"),
        ],
    )


def kernel_observations(rows: list[dict]) -> list[str]:
    lines = []
    for pass_type in ("forward", "train-step", "forward-backward"):
        mine = [r for r in rows if label_text("pass_type", r) == pass_type and label_text("kernel_rank", r) == "1"]
        for row in mine[:2]:
            lines.append(
                f"{pass_type}, {row.get('model')} context {label_text('context_length', row)}: the longest is "
                f"`{row['kernel']}` ({label_text('kernel_calls', row)} calls, {sig3(number(row, 'kernel_share_pct'))}% of the listed time)."
            )
    for context in dict.fromkeys(label_text("context_length", r) for r in rows):
        forward = [
            r for r in rows if label_text("pass_type", r) == "forward" and label_text("context_length", r) == context
        ]
        softmax = sum(number(r, "kernel_ms") or 0 for r in forward if "softmax" in str(r["kernel"]))
        bmm = sum(number(r, "kernel_ms") or 0 for r in forward if "bmm" in str(r["kernel"]))
        if softmax and bmm:
            lines.append(
                f"(e) Context {context}, forward: softmax takes {sig3(softmax)} ms against {sig3(bmm)} ms for attention's "
                "batched matrix multiplies."
            )
    by_pass: dict[str, list[float]] = {}
    for pass_type in ("forward", "train-step"):
        picked = [r for r in rows if label_text("pass_type", r) == pass_type]
        total = sum(number(r, "kernel_ms") or 0 for r in picked)
        mm = sum(number(r, "kernel_ms") or 0 for r in picked if any(m in str(r["kernel"]).lower() for m in MATMUL))
        if total:
            by_pass[pass_type] = [100 * mm / total]
    if len(by_pass) == 2:
        lines.append(
            f"Matrix multiplies are {by_pass['forward'][0]:.0f}% of the listed operator time in a forward pass and "
            f"{by_pass['train-step'][0]:.0f}% in a training step."
        )
    return lines
