"""Tables of `allreduce_bench` and `ddp_bench` rows: all-reduce time and bandwidth per world size
and size; a data-parallel step per strategy with its communication; the bytes each rank holds."""

from __future__ import annotations

import pandas as pd

from ..memory.measure import CATEGORIES
from .document import byte_unit
from .fields import derive, label_text
from .grid import Value, grid, head_of

STRATEGY = [("strategy", "strategy"), ("ranks", "world_size")]
HELD = (  # what a rank holds, counted from its tensors after a step
    ("parameters", "param_bytes_per_rank"),
    ("gradients", "grad_bytes_per_rank"),
    ("optimizer state", "optimizer_state_bytes_per_rank"),
)
PEAKS = (  # a rank's tensors at the peak of each phase of a step (torch's MemTracker), then the secondary figures
    ("after building", "peak_model_bytes"),
    ("before optimizer step", "peak_before_optimizer_bytes"),
    ("after optimizer step", "peak_optimizer_bytes"),
    ("process", "process_peak_bytes"),
    ("predicted", "predicted_peak_bytes"),
)
# what a rank's tensors hold at each phase's peak, a column each
BREAKDOWN = [(name.replace("_", " "), f"{name}_bytes") for name in (*CATEGORIES.values(), "total")]


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
            caption="Median (interquartile range) of the measured all-reduces, ms",
            labels=labels,
            values=time,
        ),
        grid(
            frame,
            "allreduce_bench",
            title=f"All-reduce bus bandwidth{heading}",
            caption="Bus bandwidth = size x 2(n-1)/n / median time, GB/s (comparable across world sizes)",
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
        "Median (interquartile range) of the measured steps (each step the slowest rank's), ms, and the "
        "communication's share of the median; "
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
    single, source = (frame.get(name, pd.Series("", index=frame.index)) for name in ("strategy", "source"))
    if apart := set(source[single == "single"]) - set(source[single != "single"]):  # measured once in the plan
        notes.append(f"single: the row of {', '.join(sorted(apart))}, one measurement every section shows.")
    return grid(frame, "ddp_bench", title=title, caption=caption, labels=list(STRATEGY), values=values, footnotes=notes)


def held_table(frame: pd.DataFrame, title: str) -> pd.DataFrame | None:
    """Bytes of parameters, gradients and optimizer state one rank holds, per strategy."""
    caption = "Bytes one rank holds after a step (the largest over ranks), counted from its tensors"
    return _bytes_table(frame, "ddp_bench", title, caption, list(STRATEGY), HELD)


def _bytes_table(frame: pd.DataFrame, tool: str, title: str, caption: str, labels, columns) -> pd.DataFrame | None:
    present = [(h, c) for h, c in columns if _filled(frame, c)]
    if not present:
        return None
    unit = byte_unit(pd.concat([frame[c] for _, c in present]))
    values = [Value(f"{h} ({unit})", c, unit) for h, c in present]
    return grid(frame, tool, title=title, caption=caption, labels=labels, values=values)


def peaks_table(frame: pd.DataFrame, title: str) -> pd.DataFrame | None:
    """A rank's peak in each phase, counted from its tensors, beside the process's own and the estimator's."""
    source = ", ".join(dict.fromkeys(str(s) for s in frame.get("memory_source", pd.Series(dtype=object)).dropna()))
    measured = f" ({source}: allocator slack and torch's own buffers included)" if source else ""
    caption = (
        "Peak bytes of one rank's tensors in each phase of a step (the largest over ranks), counted by torch's "
        "MemTracker from zero: one baseline for one process and every rank; process: the process's own peak over "
        f"the same steps above what it held before building{measured}; predicted: the estimator's"
    )
    return _bytes_table(derive(frame, "ddp_bench"), "ddp_bench", title, caption, list(STRATEGY), PEAKS)


def breakdown_table(frame: pd.DataFrame, title: str) -> pd.DataFrame | None:
    """What a rank's tensors held at each phase's peak, by category (the handout's breakdown)."""
    caption = (
        "Bytes of one rank's tensors at each phase's peak (torch's MemTracker; the rank whose peak is largest): "
        "activations, made outside backward and the optimizer step (communication buffers too); temporaries, in "
        "backward or while building; other, what the model holds besides (DDP's buckets, a copy of the weights)"
    )
    rows = derive(frame, "memory_phases")
    return _bytes_table(rows, "memory_phases", title, caption, [*STRATEGY, ("phase", "phase")], BREAKDOWN)
