"""Tables of `allreduce_bench` and `ddp_bench` rows: all-reduce time and bandwidth per world size
and size; a data-parallel step per strategy with its communication; the bytes each rank holds."""

from __future__ import annotations

import pandas as pd

from .document import byte_unit
from .fields import derive, label_text
from .grid import Value, grid, head_of

STRATEGY = [("strategy", "strategy"), ("ranks", "world_size")]
HELD = (  # what a rank holds, counted from its tensors after a step
    ("parameters", "param_bytes_per_rank"),
    ("gradients", "grad_bytes_per_rank"),
    ("optimizer state", "optimizer_state_bytes_per_rank"),
)
PEAKS = (  # the process's peak in each phase of a step, above what it held before the model was built
    ("after building", "peak_model_bytes_above_baseline"),
    ("before optimizer step", "peak_before_optimizer_bytes_above_baseline"),
    ("after optimizer step", "peak_optimizer_bytes_above_baseline"),
    ("predicted", "predicted_peak_bytes"),
)


def sizes(frame: pd.DataFrame) -> list[str]:
    ordered = frame.drop_duplicates("size").sort_values("size_bytes")
    return [label_text("size", r) for r in ordered.to_dict("records")]


def allreduce_tables(frame: pd.DataFrame, heading: str = "") -> list:
    """Time and bus bandwidth per size and world size; `heading` ends both titles (", gloo")."""
    labels = [("ranks", "world_size")]
    time = [Value(f"{s} (ms)", "median_ms", "ms", where={"size": s}) for s in sizes(frame)]
    bandwidth = [Value(f"{s} (GB/s)", "busbw_gbps", "sig3", where={"size": s}) for s in sizes(frame)]
    return [
        grid(
            frame,
            "allreduce_bench",
            title=f"All-reduce time{heading}",
            caption="Median of the measured all-reduces (the statistic the bandwidth below is computed on), ms",
            labels=labels,
            values=time,
        ),
        grid(
            frame,
            "allreduce_bench",
            title=f"All-reduce bus bandwidth{heading}",
            caption="Bus bandwidth = size x 2(n-1)/n / time, GB/s (comparable across world sizes)",
            labels=labels,
            values=bandwidth,
        ),
    ]


def _filled(frame: pd.DataFrame, column: str, numeric: bool = True) -> bool:
    if column not in frame.columns:
        return False
    if not numeric:
        return frame[column].dropna().astype(str).str.strip().ne("").any()
    return pd.to_numeric(frame[column], errors="coerce").notna().any()


def ddp_time_table(frame: pd.DataFrame, title: str) -> pd.DataFrame:
    """A step per strategy: its time, the communication it exposes (each row saying how it was
    measured: a loop timed, a difference of two timings, a profiled step), throughput and scaling. The
    step is the median, the statistic the communication's share divides by."""
    values = [Value("step (ms)", "median_ms", "ms")]
    for header, column, fmt in (
        ("communication (ms)", "comm_ms", "sig3"),
        ("communication (%)", "comm_pct", "sig3"),
        ("communication measured as", "comm_method", "head"),
        ("all-gather (ms)", "fsdp_all_gather_ms", "sig3"),
        ("reduce-scatter (ms)", "fsdp_reduce_scatter_ms", "sig3"),
        ("scaling efficiency (%)", "scaling_efficiency", "x100"),
    ):
        if _filled(frame, column, numeric=fmt != "head"):
            values.append(Value(header, column, fmt))
    caption = (
        "Median of the measured steps (each step the slowest rank's), ms, and the communication's share of it; "
        "communication as each strategy measures it"
    )
    if _filled(frame, "fsdp_all_gather_ms"):
        caption += (
            "; all-gather and reduce-scatter: the time each kind of collective was in flight during one profiled "
            "step, which the profiler slows and in which collectives overlap compute and each other (so they can "
            "add up to more than the median step)"
        )
    methods = frame["comm_method"].dropna().astype(str).unique() if "comm_method" in frame.columns else []
    said = [method for method in methods if head_of(method) != method]  # the column shows their first words
    notes = ["Communication measured as: " + "; ".join(said) + "."] if said else []
    return grid(frame, "ddp_bench", title=title, caption=caption, labels=list(STRATEGY), values=values, footnotes=notes)


def held_table(frame: pd.DataFrame, title: str) -> pd.DataFrame | None:
    """Bytes of parameters, gradients and optimizer state one rank holds, per strategy."""
    present = [(h, c) for h, c in HELD if _filled(frame, c)]
    if not present:
        return None
    unit = byte_unit(pd.concat([frame[c] for _, c in present]))
    values = [Value(f"{h} ({unit})", c, unit) for h, c in present]
    return grid(
        frame,
        "ddp_bench",
        title=title,
        caption="Bytes one rank holds after a step (the largest over ranks), counted from its tensors",
        labels=list(STRATEGY),
        values=values,
    )


def peaks_table(frame: pd.DataFrame, title: str) -> pd.DataFrame | None:
    frame = derive(frame, "ddp_bench")
    present = [(h, c) for h, c in PEAKS if _filled(frame, c)]
    if not present:
        return None
    unit = byte_unit(pd.concat([frame[c] for _, c in present]))
    values = [Value(f"{h} ({unit})", c, unit) for h, c in present]
    source = ", ".join(dict.fromkeys(str(s) for s in frame.get("memory_source", pd.Series(dtype=object)).dropna()))
    return grid(
        frame,
        "ddp_bench",
        title=title,
        caption="Peak memory of one rank (the largest over ranks) in each phase of a step, above what the process "
        "held before the model was built"
        + (f"; measured as {source}" if source else "")
        + "; predicted: the estimator's",
        labels=list(STRATEGY),
        values=values,
    )
