"""PNG plots saved beside the report: step time, all-reduce bandwidth, warmup."""

from __future__ import annotations

import io
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from PIL import Image  # noqa: E402  (installed with matplotlib)

from ..results import ResultWriteError, write_whole  # noqa: E402
from .benchmark import prepare, size_order, title, varying  # noqa: E402
from .document import Figure  # noqa: E402


def _panels(count: int):
    columns = min(count, 2)
    rows = math.ceil(count / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(6 * columns, 4.3 * rows), squeeze=False)
    for ax in axes.flat[count:]:
        ax.set_visible(False)
    return fig, axes.flat


UNWRITTEN: list[str] = []  # why a figure is not in the report (a full disk): the CLI says so and exits 1


def _save(fig, path: Path) -> list[Path]:
    """A 256-colour PNG (a fifth of the bytes of full colour, so the PDF stays small), written whole and
    never through a link planted at its name; [] when it could not be written (UNWRITTEN says why)."""
    fig.tight_layout()
    buffer, png = io.BytesIO(), io.BytesIO()
    fig.savefig(buffer, dpi=80)
    plt.close(fig)
    Image.open(buffer).convert("RGB").quantize(256).save(png, format="PNG", optimize=True)
    try:
        write_whole(path, png.getvalue())
    except ResultWriteError as exc:
        UNWRITTEN.append(f"figure {exc.strerror}; the report goes on without it")
        return []
    return [path]


def benchmark_plots(frame: pd.DataFrame, directory: Path, stem: str) -> list[Figure]:
    """Step time against context length (a line per model) and against parameter count (a
    line per context), one panel per table; log-log, measured rows only."""
    frame = prepare(frame)
    sizes = size_order(frame)
    ok = frame[frame["status"] == "ok"]
    if ok.empty:
        return []
    keys = varying(frame)
    groups = list(ok.groupby(keys, dropna=False, sort=False))  # the tables' order
    made = []
    for name, heading, x, series, label in (
        ("time_vs_context", "Step time vs context length, per model", "context_length", "model", "{}"),
        (
            "time_vs_params",
            "Step time vs parameter count, per context length",
            "num_params",
            "context_length",
            "ctx {}",
        ),
    ):
        fig, axes = _panels(len(groups))
        for ax, (values, rows) in zip(axes, groups):
            values = values if isinstance(values, tuple) else (values,)
            order = [s for s in sizes if s in set(rows["model"])] if series == "model" else sorted(set(rows[series]))
            for value in order:
                line = rows[rows[series] == value].groupby(x)[["mean_ms", "min_ms", "max_ms"]].last()
                spread = [
                    (line["mean_ms"] - line["min_ms"]).clip(lower=0),  # (rounding can put min a hair above mean)
                    (line["max_ms"] - line["mean_ms"]).clip(lower=0),
                ]  # min..max rather than ± std: never below zero on a log axis
                ax.errorbar(line.index, line["mean_ms"], yerr=spread, marker="o", capsize=3, label=label.format(value))
            ax.set(
                xscale="log",
                yscale="log",
                ylabel="mean step time (ms); bars: min to max step",
                xlabel="context length" if x == "context_length" else "parameters",
            )
            if x == "context_length":  # label the contexts measured, not powers of ten
                ax.set_xticks(sorted(set(rows[x])), [str(c) for c in sorted(set(rows[x]))])
                ax.minorticks_off()
            ax.set_title(title(keys, values), fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        made += [Figure(heading, path) for path in _save(fig, directory / f"{stem}_{name}.png")]
    return made


def allreduce_plot(frame: pd.DataFrame, directory: Path, stem: str) -> list[Figure]:
    ok = frame[frame["status"] == "ok"]
    if ok.empty:
        return []
    fig, ax = plt.subplots(figsize=(6, 4))
    for (backend, world), rows in ok.groupby(["backend", "world_size"]):
        rows = rows.sort_values("size_bytes")
        ax.plot(rows["size_bytes"], rows["busbw_gbps"], marker="o", label=f"{backend}, {world} ranks")
    ax.set(xscale="log", xlabel="tensor size (bytes)", ylabel="bus bandwidth (GB/s)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return [
        Figure("All-reduce bus bandwidth vs tensor size", p) for p in _save(fig, directory / f"{stem}_allreduce.png")
    ]


def warmup_plot(frame: pd.DataFrame, directory: Path, stem: str) -> list[Figure]:
    fig, ax = plt.subplots(figsize=(6, 4))
    for warmup, rows in frame.groupby("warmup_steps"):
        rows = rows.sort_values("step_index")
        ax.plot(rows["step_index"], rows["step_ms"], marker="o", label=f"{warmup} warmup")
    ax.set(xlabel="step (warmup steps first)", ylabel="step time (ms)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    heading = "Step time per step, by number of warmup steps"
    return [Figure(heading, path) for path in _save(fig, directory / f"{stem}_warmup.png")]
