"""The write-up's model problems: benchmarking_script, nsys_profile (the torch profiler's table
where nsys is absent), mixed precision, memory_profiling, gradient_checkpointing."""

from __future__ import annotations

import pandas as pd

from .. import benchmark, plots
from ..document import Bullets, Figure, Heading, Section, Text, byte_unit, sig3
from ..fields import derive, label_text
from ..grid import Value, grid
from ..observe import change, number, ok, pick, records, span, times
from . import Problem, not_measured, reductions

MIB = 2**20


def section(problem: Problem) -> Section:
    return Section(f"{problem.label}: {problem.title}", problem.label)


def finish(problem: Problem, out: Section) -> Section:
    """The lines every section ends with: what was reduced, what was not measured and why."""
    lines = reductions(problem) + not_measured(problem)
    if lines:
        out.add(Bullets(lines))
    return out


def _model_rows(rows: list[dict], pass_type: str) -> dict[str, dict]:
    """model label -> its row of `pass_type` (one per model, else none)."""
    found: dict[str, list[dict]] = {}
    for row in rows:
        if label_text("pass_type", row) == pass_type:
            found.setdefault(row["model"], []).append(row)
    return {model: group[0] for model, group in found.items() if len(group) == 1}


def timing_observations(rows: list[dict]) -> list[str]:
    rows = ok(rows)
    lines = []
    forward = _model_rows(rows, "forward")
    if forward:
        ordered = sorted(forward.items(), key=lambda kv: number(kv[1], "num_params") or 0)
        (small, a), (large, b) = ordered[0], ordered[-1]
        text = f"A forward pass takes {sig3(number(a, 'mean_ms'))} ms ({small})"
        if small != large:
            growth = number(b, "mean_ms") / number(a, "mean_ms")
            params = (number(b, "num_params") or 0) / (number(a, "num_params") or 1)
            text += f" to {sig3(number(b, 'mean_ms'))} ms ({large}): {times(growth)} the time for {times(params)} the parameters"
        lines.append(text + ".")
    full = _model_rows(rows, "train-step") or _model_rows(rows, "forward-backward")
    ratios = {
        m: number(r, "backward_mean_ms") / number(r, "forward_mean_ms")
        for m, r in full.items()
        if number(r, "forward_mean_ms") and number(r, "backward_mean_ms")
    }
    if ratios:
        where = next(iter(full.values()))["pass_type"]
        lines.append(f"The backward pass takes {span(list(ratios.values()))} the forward pass ({where} rows).")
    shares = {
        m: number(r, "optimizer_mean_ms") / number(r, "mean_ms")
        for m, r in _model_rows(rows, "train-step").items()
        if number(r, "optimizer_mean_ms")
    }
    if shares:
        lines.append(f"The optimizer step is {span([100 * s for s in shares.values()], '%')} of a training step.")
    cvs = [(number(r, "cv_pct"), r) for r in rows if number(r, "cv_pct") is not None]
    if cvs:
        worst, row = max(cvs, key=lambda x: x[0])
        noisy = sum(1 for cv, _ in cvs if cv > 10)
        text = f"The standard deviation is at most {worst:.1f}% of the mean (coefficient of variation) over the measured steps"
        text += f"; the noisiest row: {row['model']} {label_text('pass_type', row)}" if noisy else ""
        text += f"; {noisy} of {len(cvs)} rows are above 10% (marked †)" if noisy else ", so the variability is small"
        lines.append(text + ".")
    return lines


def warmup_observations(rows: list[dict]) -> list[str]:
    runs: dict[str, list[float]] = {}
    for row in sorted(rows, key=lambda r: number(r, "step_index") or 0):
        if label_text("measured", row) == "measured" and number(row, "step_ms") is not None:
            runs.setdefault(label_text("warmup_steps", row), []).append(number(row, "step_ms"))
    if not runs:
        return []
    steady_key = max(runs, key=lambda k: float(k))
    steady = sum(runs[steady_key]) / len(runs[steady_key])
    lines = []
    if "0" in runs and steady_key != "0":
        first, mean = runs["0"][0], sum(runs["0"]) / len(runs["0"])
        lines.append(
            f"Without warmup the first measured step took {sig3(first)} ms, {times(first / steady)} the mean after "
            f"{steady_key} warmup steps ({sig3(steady)} ms), and lifts the mean of the measured steps by {change(mean, steady)}."
        )
    for key in ("1", "2"):
        if key in runs and key != steady_key:
            mean = sum(runs[key]) / len(runs[key])
            lines.append(
                f"After {key} warmup step{'s' * (key != '1')} the mean is {change(mean, steady)} off the {steady_key}-warmup mean."
            )
    return lines


def benchmarking_script(problem: Problem) -> Section:
    out = section(problem)
    step = problem.step("-b")
    out.add(Heading("(a) The script"))
    out.add(
        Text(
            "This project's `benchmark` tool (and its sweep `benchmark_direct`): it builds the model from the size "
            "table, draws a random batch, runs the warmup steps, then times each measured step (forward, "
            "forward and backward, or a full training step with AdamW), synchronising the device after each "
            "step and timing each phase on its own."
            + (f" The command that made the rows below: `{step['command']}`." if step and step.get("command") else "")
        )
    )
    rows = problem.rows("benchmark", "-b")
    out.add(Heading("(b) Forward, backward and optimizer step"))
    if not rows.empty:
        problem.used.update(rows["source"])
        out.add(benchmark.phase_table(rows, "Time per phase of each model"))
        out.add(Bullets(timing_observations(records(rows, "benchmark"))))
        notes = benchmark.row_notes(rows)
        if notes:
            out.add(Text("Notes on these rows: " + "; ".join(notes) + "."))
    warmup = problem.rows("warmup_study")
    out.add(Heading("(c) Without warmup, and with 1 or 2 warmup steps"))
    if not warmup.empty:
        out.add(benchmark.warmup_table(warmup))
        out.add(*plots.warmup_plot(warmup, problem.out_dir, problem.stem))
        out.add(Bullets(warmup_observations(records(warmup, "warmup_study"))))
    return finish(problem, out)


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
        problem.used.update(profiled["source"])
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
        for name in [n for n in _reads(step) if n.endswith("cuda_gpu_kern_sum.csv") and n in problem.files]:
            rows = problem.files[name]
            problem.used.add(name)
            out.add(nsys_kernel_table(rows, f"CUDA kernels by total time: {step['part']}"))
            out.add(Bullets(nsys_observations(records(rows, "nsys_kernels"))))
    return finish(problem, out)


def _reads(step: dict) -> list[str]:
    from . import reads

    return reads(step)


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


TOP_OPERATORS = 6  # per profiled step in the write-up (the rows keep ten)
MATMUL = ("mm", "matmul", "addmm", "bmm", "gemm", "linear", "cutlass", "sm90_xmma", "ampere_")


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


def mixed_precision_accumulation(problem: Problem) -> Section:
    out = section(problem)
    rows = problem.rows("mixed_precision")
    rows = rows[rows["table"] == "accumulation"] if not rows.empty else rows
    if not rows.empty:
        problem.used.update(rows["source"])
        out.add(
            grid(
                rows,
                "mixed_precision",
                title="0.01 added 1000 times (exact sum 10)",
                caption="The sum as printed, and its error against 10",
                labels=[("experiment", "experiment")],
                values=[
                    Value("accumulator", "accumulator", "text"),
                    Value("addend", "addend", "text"),
                    Value("sum", "result", "text"),
                    Value("error", "error", "sci±"),
                ],
            )
        )
        out.add(Bullets(accumulation_observations(records(rows, "mixed_precision"))))
    return finish(problem, out)


def accumulation_observations(rows: list[dict]) -> list[str]:
    by = {(str(r.get("accumulator")), str(r.get("addend"))): r for r in rows}
    lines = []
    exact, half = by.get(("fp32", "fp32")), by.get(("fp16", "fp16"))
    if number(exact, "error") and number(half, "error"):
        lines.append(
            f"An fp16 accumulator ends {number(half, 'error'):+.1e} off, {times(abs(number(half, 'error') / number(exact, 'error')))} "
            f"the error of an fp32 one ({number(exact, 'error'):+.1e})."
        )
    mixed = [r for (acc, add), r in by.items() if acc == "fp32" and add.startswith("fp16")]
    if len(mixed) >= 2 and len({str(r.get("result")) for r in mixed}) == 1:
        lines.append(
            f"fp16 addends into an fp32 accumulator end at {mixed[0]['result']} with or without the explicit "
            f"cast ({number(mixed[0], 'error'):+.1e})."
        )
    return lines


def benchmarking_mixed_precision(problem: Problem, timing: Problem | None) -> Section:
    out = section(problem)
    dtypes = problem.rows("mixed_precision")
    dtypes = dtypes[dtypes["table"] == "autocast"] if not dtypes.empty else dtypes
    out.add(Heading("(a), (b) The toy model's dtypes under autocast"))
    if not dtypes.empty:
        problem.used.update(dtypes["source"])
        out.add(
            grid(
                dtypes,
                "mixed_precision",
                title="dtype of each tensor of the toy model under autocast",
                caption="fc1, ReLU, LayerNorm, fc2, then cross-entropy and backward, parameters in fp32",
                labels=[("tensor", "tensor")],
                values=[Value("fp16 autocast", "fp16", "text"), Value("bf16 autocast", "bf16", "text")],
            )
        )
        norm = [r for r in records(dtypes, "mixed_precision") if "LayerNorm" in str(r.get("tensor"))]
        if norm:
            out.add(
                Bullets(
                    [
                        f"LayerNorm's output is {norm[0]['fp16']} under fp16 autocast and {norm[0]['bf16']} under bf16 "
                        f"autocast on {norm[0].get('device')}; autocast's op lists differ between devices, so on a GPU "
                        "measure it there."
                    ]
                )
            )
    bf16 = problem.rows("benchmark")
    fp32 = timing_rows(timing)
    out.add(Heading("(c) bf16 autocast against fp32, per size"))
    if not bf16.empty:
        both = pd.concat([fp32, bf16], ignore_index=True) if not fp32.empty else bf16
        both = both[both["pass_type"].isin(set(bf16["pass_type"]))]
        problem.used.update(both["source"])
        out.add(benchmark.speedup_table(both, "precision", "fp32", "bf16", "fp32 and bf16 autocast"))
        out.add(Bullets(precision_observations(records(both, "benchmark"))))
    return finish(problem, out)


def timing_rows(timing: Problem | None) -> pd.DataFrame:
    return timing.rows("benchmark", "-b") if timing else pd.DataFrame()


def precision_observations(rows: list[dict]) -> list[str]:
    rows = ok(rows)
    speedups = []
    for model in dict.fromkeys(r["model"] for r in rows):
        for pass_type in ("forward", "forward-backward", "train-step"):
            a = pick(rows, model=model, pass_type=pass_type, precision="fp32")
            b = pick(rows, model=model, pass_type=pass_type, precision="bf16")
            if number(a, "mean_ms") and number(b, "mean_ms"):
                speedups.append(
                    (number(a, "num_params") or 0, model, pass_type, number(a, "mean_ms") / number(b, "mean_ms"))
                )
    if not speedups:
        return []
    low, high = min(speedups, key=lambda s: s[3]), max(speedups, key=lambda s: s[3])
    lines = [
        f"bf16 autocast runs {times(low[3])} ({low[1]}, {low[2]}) to {times(high[3])} ({high[1]}, {high[2]}) as fast as fp32."
    ]
    ordered = sorted(speedups)
    smallest, largest = ordered[0], ordered[-1]
    if smallest[1] != largest[1]:
        trend = "grows" if largest[3] > smallest[3] else "shrinks"
        lines.append(
            f"The speedup {trend} with model size: {times(smallest[3])} for {smallest[1]}, {times(largest[3])} for {largest[1]} ({largest[2]})."
        )
    return lines


def memory_profiling(problem: Problem) -> Section:
    out = section(problem)
    rows = problem.rows("benchmark", "peaks")
    figures = [s for s in problem.steps if "snapshot" in s["step"]]
    out.add(Heading("(a), (e) Memory timelines and the largest allocations"))
    for step in figures:
        for name in step["figures"].split() if isinstance(step.get("figures"), str) else []:
            if (problem.directory / name).is_file():
                out.add(Figure(f"Active memory timeline: {step['part']}", problem.directory / name))
        for name in [n for n in _reads(step) if n in problem.files]:
            allocations = problem.files[name]
            problem.used.add(name)
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
        problem.used.update(rows["source"])
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
        problem.used.update(residuals["source"])
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
        problem.used.update(rows["source"])
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


def compiled_model(problem: Problem, out: Section) -> None:
    """torch_compile (b): the whole model eager and compiled."""
    rows = problem.rows("benchmark")
    out.add(Heading("(b) The whole model compiled"))
    if rows.empty:
        return
    problem.used.update(rows["source"])
    out.add(benchmark.speedup_table(rows, "compile", "eager", "compiled", "Eager and compiled model"))
    lines = []
    for r in records(rows, "benchmark"):
        if label_text("compile", r) != "eager":
            continue
        other = pick(
            ok(records(rows, "benchmark")), model=r["model"], pass_type=label_text("pass_type", r), compile="compiled"
        )
        if r.get("status") == "ok" and number(other, "mean_ms"):
            lines.append(
                f"{r['model']}, {label_text('pass_type', r)}: compiled runs {times(number(r, 'mean_ms') / number(other, 'mean_ms'))} as fast as eager."
            )
    first = [number(r, "compile_s") for r in records(rows, "benchmark") if number(r, "compile_s")]
    if first:
        lines.append(f"Compiling took {span(first, ' s')} before the first step.")
    out.add(Bullets(lines))


def leaderboard(problem: Problem) -> Section:
    """2026: one full training step of the leaderboard's model (the 2025 leaderboard times
    FlashAttention-2 alone: attention.leaderboard_2025)."""
    out = section(problem)
    rows = problem.rows("benchmark")
    if not rows.empty:
        problem.used.update(rows["source"])
        out.add(
            grid(
                rows,
                "benchmark",
                title="A full training step: zero_grad, forward, cross-entropy, backward, AdamW step",
                caption="Mean ± std of the measured steps, ms",
                labels=[("model", "model"), ("context", "context_length"), ("batch", "batch_size")],
                values=[Value("step (ms)", "mean_ms", "ms±"), Value("tokens/s", "tokens_per_s", "sig3")],
            )
        )
        lines = []
        for row in ok(records(rows, "benchmark")):
            lines.append(
                f"{row['model']}, context {label_text('context_length', row)}, batch {label_text('batch_size', row)}, "
                f"{label_text('precision', row)}: {sig3(number(row, 'mean_ms'))} ms per training step "
                f"({label_text('timer', row)} timer)."
            )
        out.add(Bullets(lines))
    return finish(problem, out)
