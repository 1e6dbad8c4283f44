"""The write-up's distributed problems: all-reduce on one node, each data-parallel problem under its
own heading, optimizer-state sharding and FSDP accounting (the bytes each rank holds)."""

from __future__ import annotations

import pandas as pd

from .. import distributed, plots
from ..document import Bullets, Heading, Section, sig3
from ..fields import label_text
from ..observe import change, number, ok, pick, records, times
from . import Problem, finish, section

MIB = 2**20


def distributed_communication_single_node(problem: Problem) -> Section:
    out = section(problem)
    rows = problem.rows("allreduce_bench")
    if not rows.empty:
        for backend, group in rows.groupby("backend", sort=False):
            for table in distributed.allreduce_tables(group):
                table.title = f"{table.title}, {backend}"
                out.add(table)
        out.add(*plots.allreduce_plot(rows, problem.out_dir, problem.stem))
        out.add(Bullets(allreduce_observations(records(rows, "allreduce_bench"))))
    return finish(problem, out)


def allreduce_observations(rows: list[dict]) -> list[str]:
    lines = []
    for (backend, world), group in _groups(ok(rows), ("backend", "world_size")).items():
        ordered = sorted(group, key=lambda r: number(r, "size_bytes") or 0)
        if len(ordered) < 2:
            continue
        small, large = ordered[0], ordered[-1]
        lines.append(
            f"{backend}, {world} ranks: bus bandwidth {sig3(number(small, 'busbw_gbps'))} GB/s at "
            f"{label_text('size', small)} and {sig3(number(large, 'busbw_gbps'))} GB/s at {label_text('size', large)}; "
            f"{times(number(large, 'size_bytes') / number(small, 'size_bytes'))} the data takes "
            f"{times(number(large, 'mean_ms') / number(small, 'mean_ms'))} the time."
        )
    worlds = _groups(ok(rows), ("backend", "size"))
    for (backend, size), group in worlds.items():
        if len(group) > 1:
            ordered = sorted(group, key=lambda r: number(r, "world_size"))
            lines.append(
                f"{backend}, {size}: from {label_text('world_size', ordered[0])} to {label_text('world_size', ordered[-1])} "
                f"ranks the time goes from {sig3(number(ordered[0], 'mean_ms'))} to {sig3(number(ordered[-1], 'mean_ms'))} ms."
            )
    return lines


def _groups(rows: list[dict], keys: tuple[str, ...]) -> dict[tuple, list[dict]]:
    found: dict[tuple, list[dict]] = {}
    for row in rows:
        found.setdefault(tuple(label_text(k, row) for k in keys), []).append(row)
    return found


def _step(rows: list[dict], strategy: str, **more) -> dict | None:
    return pick(ok(rows), strategy=strategy, **more)


def ddp_problem(problem: Problem) -> Section:
    """naive_ddp_benchmarking, minimal_ddp_flat_benchmarking, the overlapped and bucketed problems."""
    out = section(problem)
    rows = problem.rows("ddp_bench")
    if not rows.empty:
        out.add(distributed.ddp_time_table(rows, "Time per training step"))
        out.add(Bullets(ddp_observations(records(rows, "ddp_bench"))))
    return finish(problem, out)


def ddp_observations(rows: list[dict]) -> list[str]:
    lines = []
    single = _step(rows, "single")
    for row in ok(rows):
        strategy = label_text("strategy", row)
        if strategy == "single":
            continue
        bucket = label_text("bucket_cap_mb", row)
        text = f"{strategy}{f' ({bucket} MB buckets)' if bucket else ''} on {label_text('world_size', row)} ranks: step {sig3(number(row, 'mean_ms'))} ms"
        if number(row, "comm_ms") is not None:
            comm = number(row, "comm_ms")
            text += f", of which {sig3(comm)} ms communicating ({sig3(number(row, 'comm_pct'))}% of the step)"
            if comm < 0:
                text += ": below zero, i.e. the step without synchronisation was the slower one; within noise"
        if single is not None:
            text += f"; one process: {sig3(number(single, 'mean_ms'))} ms"
        lines.append(text + ".")
    naive, flat = _step(rows, "naive"), _step(rows, "flat")
    if number(naive, "comm_ms") and number(flat, "comm_ms"):
        lines.append(
            f"One flat all-reduce takes {sig3(number(flat, 'comm_ms'))} ms against {sig3(number(naive, 'comm_ms'))} ms for "
            f"one all-reduce per parameter tensor ({change(number(flat, 'comm_ms'), number(naive, 'comm_ms'))})."
        )
    return lines


def accounting(problem: Problem, memory: str, timing: str, compared_with: str, time_observations) -> Section:
    """optimizer_state_sharding_accounting and fsdp_accounting: (a) what each rank holds and its peaks,
    each strategy against `compared_with`; (b) the step's time, read by `time_observations`."""
    out = section(problem)
    rows = problem.rows("ddp_bench")
    if not rows.empty:
        out.add(Heading(f"(a) {memory}"))
        out.add(distributed.held_table(rows, "Bytes each rank holds after a step"))
        out.add(distributed.peaks_table(rows, "Peak memory of a rank"))
        out.add(Bullets(held_observations(records(rows, "ddp_bench"), compared_with)))
        out.add(Heading(f"(b) {timing}"))
        out.add(distributed.ddp_time_table(rows, "Time per training step"))
        out.add(Bullets(time_observations(records(rows, "ddp_bench"))))
    return finish(problem, out)


def optimizer_state_sharding_accounting(problem: Problem) -> Section:
    memory = "Memory per rank: what each strategy holds, and its peaks"
    return accounting(problem, memory, "Time per step, with and without sharding", "ddp", sharding_time)


def fsdp_accounting(problem: Problem) -> Section:
    return accounting(
        problem, "Memory per rank", "The weights' all-gather against the forward", "single", gather_observations
    )


def held_observations(rows: list[dict], base: str) -> list[str]:
    lines = []
    reference = _step(rows, base) or _step(rows, "single")
    for row in ok(rows):
        strategy = label_text("strategy", row)
        if reference is None or row is reference:
            continue
        parts = []
        for header, column in distributed.HELD:
            a, b = number(row, column), number(reference, column)
            if a is not None and b:
                parts.append(f"{header} {sig3(a / MIB)} MiB ({times(a / b)} of {label_text('strategy', reference)}'s)")
        if parts:
            lines.append(f"{strategy}: " + ", ".join(parts) + ".")
    return lines


def sharding_time(rows: list[dict]) -> list[str]:
    base = _step(rows, "ddp")
    lines = []
    for row in ok(rows):
        strategy = label_text("strategy", row)
        if base is not None and strategy not in ("ddp", "single") and number(row, "mean_ms"):
            lines.append(
                f"{strategy}: step {sig3(number(row, 'mean_ms'))} ms, {change(number(row, 'mean_ms'), number(base, 'mean_ms'))} against ddp."
            )
    return lines


def gather_observations(rows: list[dict]) -> list[str]:
    lines = []
    for row in ok(rows):
        gather = number(row, "fsdp_all_gather_ms")
        if gather is None:
            continue
        text = f"{label_text('strategy', row)}: the all-gathers take {sig3(gather)} ms per step"
        forward = number(row, "forward_mean_ms")
        if forward:
            text += f" against a {sig3(forward)} ms forward"
        lines.append(text + f" of a {sig3(number(row, 'mean_ms'))} ms step.")
    return lines


def rates(frames: dict[str, pd.DataFrame]) -> list[str]:
    """What the analytic problems may use: the fastest all-reduce bus bandwidth and the fastest model
    FLOP rate among all the results (one line each)."""
    from ..load import tool_of

    best: dict[str, tuple[float, dict]] = {}
    for frame in frames.values():
        tool = tool_of(frame)
        column = {"allreduce_bench": "busbw_gbps", "benchmark": "achieved_tflops"}.get(tool)
        if column is None or column not in frame.columns:
            continue
        for row in ok(records(frame, tool)):
            value = number(row, column)
            if value is not None and value > best.get(tool, (0.0, {}))[0]:
                best[tool] = (value, row)
    lines = []
    if "allreduce_bench" in best:
        value, row = best["allreduce_bench"]
        lines.append(
            f"all-reduce bus bandwidth {sig3(value)} GB/s ({row['backend']}, {label_text('world_size', row)} ranks, "
            f"{row['size']}; {row['source']})"
        )
    if "benchmark" in best:
        value, row = best["benchmark"]
        lines.append(
            f"model FLOP rate {sig3(value)} TFLOP/s ({row['model']}, {label_text('pass_type', row)}, "
            f"{label_text('precision', row)}; {row['source']})"
        )
        if number(row, "peak_tflops"):
            lines.append(
                f"the {label_text('precision', row)} peak that rate's MFU divides by: {sig3(number(row, 'peak_tflops'))} TFLOP/s ({row.get('peak_source')})"
            )
    return lines
