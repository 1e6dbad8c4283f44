"""nsys_profile: (a-c, e) the forward pass and (d) a training step of each profiled configuration under
Nsight Systems where a GPU has nsys (scripts/ has the wrapper), else the torch profiler's top kernels
of a sweep's profiled step, labelled as such. 2025 profiles every size at the handout's contexts; 2026
two sizes at three powers of two above 128, the largest the longest that fits."""

from __future__ import annotations

import pandas as pd

from ...profiling import MATMUL
from ...report.document import Heading, Section, Text, sig3
from ...report.fields import derive, label_text
from ...report.grid import Value, grid
from ...report.observe import maker, number, observations, times
from ...tools import module_name
from ..parameters import Options
from ..plan import SWEEP, Step, fit_verdict, model_configs, predicted_peak
from ..target import Target
from .base import Problem, Results, finish, reads, section
from .model_steps import SCRIPTS, model_flags, sizes, sweep, training_optimizer

LABEL = "nsys_profile"
NSYS_SCRIPT = LABEL + ".sh"  # scripts/: one configuration under Nsight Systems, its measured steps only
NSYS_REPORTS = ("cuda_gpu_kern_sum", "nvtx_sum", "nvtx_kern_sum")  # the CSVs scripts/nsys_profile.sh writes
PROFILED_PASSES = ("forward", "train-step")  # inference for (a)-(c), (e); the training step for (d)


def builtin_train_step_peak(options: Options, target: Target, size: str, context: int) -> int:
    """The estimator's peak of one training step of the built-in model (a student's model is the same
    architecture), naive attention as the handout's model has, at the scale's batch."""
    flags = {
        **model_flags(options, size),
        "--context-lengths": [context],
        "--batch-sizes": [options.scale.batch],
        "--pass-types": ["train-step"],
        "--attentions": ["naive"],
    }
    return max(predicted_peak(target, config) for config in model_configs(SWEEP, flags))


def nsys_configurations(options: Options, target: Target) -> list[tuple[str, list[int], str | None]]:
    """(size, contexts, why not) to profile. 2025: every size at the scale's contexts. 2026: two sizes,
    each at three powers of two above 128 (nsys_above), the largest the longest whose training step the
    estimator says fits; a size where none fits keeps the smallest, with the reason it is skipped."""
    scale = options.scale
    if scale.nsys_sizes[options.edition] is None:
        return [(size, list(scale.contexts), None) for size in sizes(options)]
    configurations = []
    for size in scale.sizes or scale.nsys_sizes[options.edition]:
        candidates, context = [], 2 * scale.nsys_above
        while context <= scale.nsys_max_context:
            candidates.append(context)
            context *= 2
        peaks = {t: builtin_train_step_peak(options, target, size, t) for t in candidates}
        fitting = [t for t in candidates if fit_verdict(peaks[t], target)[0] != "no"]
        if fitting:
            longest = max(fitting)
            contexts = [t for t in (longest // 4, longest // 2, longest) if t > scale.nsys_above]
            configurations.append((size, contexts, None))
        else:
            smallest = candidates[0]
            why = f"no context above {scale.nsys_above} fits: at {smallest}, {fit_verdict(peaks[smallest], target)[1]}"
            configurations.append((size, [smallest], why))
    return configurations


def plan(options: Options, target: Target) -> list[Step]:
    optimizer, optimizer_name, optimizer_note = training_optimizer(options)
    under_nsys = target.type == "cuda" and (target.nsys or target.assumed)
    steps = []
    for size, contexts, why_not in nsys_configurations(options, target):
        if under_nsys:
            new = [
                _nsys_step(options, size, context, pass_type, optimizer, optimizer_name)
                for context in contexts
                for pass_type in PROFILED_PASSES
            ]
        else:
            new = _torch_profiler_sweep(options, target, size, contexts, optimizer, optimizer_name)
        for step in new:
            if why_not:
                step.skip(why_not)
            if optimizer_note and "train-step" in str(step.flags.get("--pass-types", step.flags.get("--pass-type"))):
                step.reductions.append(optimizer_note)
            if options.edition == "2026" and len(contexts) < 3 and not why_not:
                step.reductions.append(f"only {len(contexts)} powers of two above {options.scale.nsys_above} fit")
        steps += new
    return steps


def _nsys_step(options: Options, size: str, context: int, pass_type: str, optimizer, optimizer_name: str) -> Step:
    name = f"{LABEL}-{size}-{context}-{pass_type}".replace(".", "_")
    what = "(a-c, e) forward" if pass_type == "forward" else f"(d) training step with {optimizer_name}"
    flags = {
        **model_flags(options, size),
        "--context-length": context,
        "--batch-size": options.scale.batch,
        "--pass-type": pass_type,
        "--attention": "naive",  # the handout's model: softmax and the two matmuls are kernels of their own (e)
        "--device": options.device,
    }
    flags["--model-size"] = flags.pop("--model-sizes")[0]
    if pass_type == "train-step" and optimizer:
        flags["--optimizer"] = optimizer
    step = Step(
        name,
        LABEL,
        f"{what} under Nsight Systems: {size}, context {context}",
        str(SCRIPTS / NSYS_SCRIPT),
        flags,
        kind="benchmark",
        reads=tuple(f"{name}_{report}.csv" for report in NSYS_REPORTS),
        flags_of=module_name("benchmark"),  # the script runs benchmark with them
        stem=name,
        writes=(f"{name}.nsys-rep", *(f"{name}_{report}.csv" for report in NSYS_REPORTS)),
    )
    return step


def _torch_profiler_sweep(
    options: Options, target: Target, size: str, contexts: list[int], optimizer, optimizer_name: str
) -> list[Step]:
    """Where nsys or a GPU is absent: the same configurations as a sweep whose profiled step (the torch
    profiler, after the measured ones) gives each row its top kernels (JSONL's top_kernels)."""
    why = "no GPU" if target.type != "cuda" else "nsys is not on PATH"
    flags = {
        "--context-lengths": contexts,
        "--pass-types": list(PROFILED_PASSES),
        "--precisions": ["fp32"],
        "--attentions": ["naive"],
    }
    if optimizer:
        flags["--optimizer"] = optimizer
    part = f"(b-e) torch profiler, not Nsight Systems ({why}): forward, and a training step with {optimizer_name}"
    steps = sweep(options, target, LABEL, "torch_profiler", part, size, flags)
    for step in steps:
        if step.status == "run":
            step.reads = tuple(path for path in step.flags["--output"] if path.endswith(".jsonl"))
    return steps


TOP_OPERATORS = 6  # per profiled step in the write-up (the rows keep ten)


def kernel_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (profiled row, operator) of the rows' top_kernels lists, with its share of the
    profiled operators' time: the torch profiler's table, as a result-file view (derive)."""
    rows = derive(frame, "kernels")
    return rows[rows["kernel_rank"] <= TOP_OPERATORS] if "kernel_rank" in rows.columns else rows


def write(problem: Results) -> Section:
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
        out.add(
            Text(
                "(a) Nsight's total forward time against the Python timer: not measured here, since Nsight Systems "
                "did not run (the timer's medians are in benchmarking_script's table; on a GPU with nsys the plan "
                "profiles each configuration under it)."
            )
        )
        out.add(Heading("(b-e) The longest operators of each profiled step (torch profiler)"))
        profiled = derive(profiled, "benchmark")
        for (model, context), group in profiled.groupby(["model", "context_length"], sort=False):
            out.add(kernel_table(kernel_rows(group), f"Longest operators: {model}, context {context}"))
        out.add(observations(profiled_observations, rows, "kernels"))
    for step in problem.steps:  # Nsight Systems' own kernel summary, where nsys ran
        for name in [n for n in reads(step) if n.endswith("cuda_gpu_kern_sum.csv") and n in problem.files]:
            rows = problem.files[name]
            out.add(nsys_kernel_table(rows, f"CUDA kernels by total time: {step['part']}"))
            out.add(observations(nsys_observations, rows, "nsys_kernels"))
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


@maker
def nsys_observations(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    top = max(rows, key=lambda r: number(r, "Total Time (ns)") or 0)
    total = sum(number(r, "Total Time (ns)") or 0 for r in rows)
    mm = sum(number(r, "Total Time (ns)") or 0 for r in rows if _is_matmul(r["Name"]))
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
        caption="The profiled steps' operators (kernels on a GPU), summed by name in each step and ranked by their "
        "median over the steps: calls, ms and share of all the step's operator time; ahead: longer than the next "
        "in every profiled step (no: the steps disagree, the order of the two is not resolved)",
        labels=[("pass", "pass_type"), ("rank", "kernel_rank"), ("operator", "kernel")],
        values=[
            Value("calls", "kernel_calls", "int"),
            Value("total (ms)", "kernel_ms", "sig3"),
            Value("share (%)", "kernel_share_pct", "sig3"),
            Value("ahead", "kernel_ahead", "text"),
        ],
    )


@maker
def profiled_observations(rows: list[dict]) -> list[str]:
    """kernel_observations of each profiled step's TOP_OPERATORS operators (the kernel tables' rows)."""
    return kernel_observations([r for r in rows if (number(r, "kernel_rank") or 0) <= TOP_OPERATORS])


def kernel_observations(rows: list[dict]) -> list[str]:
    lines = []
    for pass_type in ("forward", "train-step", "forward-backward"):
        mine = [r for r in rows if label_text("pass_type", r) == pass_type]
        for i in [i for i, r in enumerate(mine) if label_text("kernel_rank", r) == "1"][:2]:
            row, where = (
                mine[i],
                f"(b) {pass_type}, {mine[i].get('model')} context {label_text('context_length', mine[i])}",
            )
            if row.get("kernel_ahead") == "no" and i + 1 < len(mine):  # rank 2 follows its rank 1
                lines.append(
                    f"{where}: `{row['kernel']}` and `{mine[i + 1]['kernel']}` take the most, and the "
                    "profiled steps disagree which takes longer: not ranked."
                )
            else:
                lines.append(
                    f"{where}: the longest is `{row['kernel']}` ({label_text('kernel_calls', row)} calls, "
                    f"{sig3(number(row, 'kernel_share_pct'))}% of the step's operator time)."
                )
    others = {}
    for row in rows:  # (c) what besides the matrix multiplies takes time in a forward pass
        if label_text("pass_type", row) == "forward" and not _is_matmul(row["kernel"]):
            others[str(row["kernel"])] = max(others.get(str(row["kernel"]), 0.0), number(row, "kernel_share_pct") or 0)
    if others:
        top = sorted(others.items(), key=lambda kv: -kv[1])[:3]
        shown = ", ".join(f"`{name}` (up to {sig3(share)}%)" for name, share in top)
        lines.append(
            f"(c) Besides matrix multiplies, the forward pass spends the most in {shown} of its operator time."
        )
    profiled = {(label_text("pass_type", r), label_text("context_length", r), r.get("model")): r for r in rows}
    lines += [softmax_text(context, row) for (pass_type, context, _), row in profiled.items() if pass_type == "forward"]
    shares: dict[str, list] = {}
    for (pass_type, _, _), row in profiled.items():
        if matmul := _families(row).get("matmul"):
            shares.setdefault(pass_type, []).append(f"{number(matmul, 'share_pct'):.0f}")
    if {"forward", "train-step"} <= set(shares):
        lines.append(
            "(d) Matrix multiplies (mm, bmm, addmm, linear, matmul and einsum, counted together) are "
            f"{'/'.join(shares['forward'])}% of the operator time in a forward pass and "
            f"{'/'.join(shares['train-step'])}% in a training step (median over the profiled steps)."
        )
    return lines


def softmax_text(context: str, row: dict) -> str:
    """(e) softmax against attention's matrix multiplies in one forward, from the families' per-step times."""
    softmax, matmuls = (_families(row).get(name) for name in ("softmax", "attention_matmul"))
    if not softmax or not matmuls:
        return (
            f"(e) Context {context}, forward: softmax and attention's own matrix multiplies cannot be told apart in "
            "this profile (on a GPU its kernels name no Python function), so the two are not compared here."
        )
    head_dim = (number(row, "d_model") or 0) / (number(row, "num_heads") or 1)
    flops = (
        f"; the two matmuls do {4 * head_dim / 5:.0f}x the softmax's FLOPs (4 x head dim {head_dim:.0f} / 5, "
        "counting about five operations per score)"
        if head_dim
        else ""
    )
    steps, a, s = len(softmax["step_ms"]), number(matmuls, "total_ms") or 0, number(softmax, "total_ms") or 0
    longer = {m > t for m, t in zip(matmuls["step_ms"], softmax["step_ms"], strict=True)}
    ratio = f"{times(a / s)} its time in each of the {steps} profiled steps" if len(longer) == 1 and s else ""
    ratio = ratio or f"the {steps} profiled steps disagree which is longer"
    ops = ", ".join(f"`{name}`" for name in softmax["operators"])
    return (
        f"(e) Context {context}, forward: softmax ({ops}) takes {sig3(s)} ms against {sig3(a)} ms for attention's "
        f"matrix multiplies ({ratio}){flops}."
    )


def _families(row: dict) -> dict[str, dict]:
    found = row.get("kernel_families")
    return {f["family"]: f for f in found if isinstance(f, dict)} if isinstance(found, list) else {}


def _is_matmul(kernel: object) -> bool:
    return bool(MATMUL.search(str(kernel).lower()))


PROBLEM = Problem(LABEL, "Nsight Systems Profiling", plan=plan, write=write)
