"""PNG figures saved beside the report. A log axis is labelled at the values measured (and at
1-2-5 steps between decades; context 64, not 64.0), so every panel reads without counting gridlines;
a point's error bar is the ± std its table shows; a series of one point is not drawn (the table shows
it), and a figure with no series of two points is not made."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib import ticker  # noqa: E402
from PIL import Image  # noqa: E402  (installed with matplotlib)

from ..results import ResultWriteError, write_whole  # noqa: E402
from .document import Figure, sig3  # noqa: E402
from .fields import derive, label_text  # noqa: E402

UNWRITTEN: list[str] = []  # why a figure is not in the report (a full disk): the CLI says so and exits 1


def _save(fig, path: Path) -> list[Path]:
    """A 256-colour PNG (a fifth of the bytes of full colour, so the PDF stays small), written whole and
    never through a link planted at its name; [] when it could not be written (UNWRITTEN says why)."""
    fig.tight_layout()
    buffer, png = io.BytesIO(), io.BytesIO()
    fig.savefig(buffer, dpi=90)
    plt.close(fig)
    Image.open(buffer).convert("RGB").quantize(256).save(png, format="PNG", optimize=True)
    try:
        write_whole(path, png.getvalue())
    except ResultWriteError as exc:
        UNWRITTEN.append(f"figure {exc.strerror}; the report goes on without it")
        return []
    return [path]


def log_axis(ax, which: str, values: Sequence[float], exact: bool = False) -> None:
    """Log scale with readable labels: at each measured value (`exact`), else at 1, 2 and 5 of each decade."""
    values = [v for v in values if v and v > 0 and math.isfinite(v)]
    (ax.set_xscale if which == "x" else ax.set_yscale)("log")
    axis = ax.xaxis if which == "x" else ax.yaxis
    if exact and values:
        ticks = sorted(set(values))
        axis.set_major_locator(ticker.FixedLocator(ticks))
        axis.set_major_formatter(ticker.FixedFormatter([_number(v) for v in ticks]))
    else:
        axis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: _number(v)))
    axis.set_minor_locator(ticker.NullLocator())


def _number(value: float) -> str:
    if value >= 1e9 and value % 1e9 == 0:
        return f"{value / 1e9:g}G"
    if value >= 1e6 and value % 1e6 == 0:
        return f"{value / 1e6:g}M"
    if value >= 1e3 and value % 1e3 == 0 and value >= 1e4:
        return f"{value / 1e3:g}k"
    return f"{value:.0f}" if float(value).is_integer() else sig3(value)


def line_figure(
    series: dict[str, list[tuple[float, float, float]]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    path: Path,
    log_y: bool = True,
) -> list[Figure]:
    """One panel, a line per series of (x, y, error bar) points sorted by x; [] when no series has two."""
    series = {name: sorted(points) for name, points in series.items() if len(points) >= 2}
    if not series:
        return []
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for name, points in series.items():
        x, y, spread = zip(*points, strict=True)
        ax.errorbar(x, y, yerr=spread if any(spread) else None, marker="o", capsize=3, label=name or "measured")
    xs = [x for points in series.values() for x, _, _ in points]
    ys = [y for points in series.values() for _, y, _ in points]
    log_axis(ax, "x", xs, exact=len(set(xs)) <= 10)
    if log_y:
        log_axis(ax, "y", ys)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return [Figure(title, saved) for saved in _save(fig, path)]


def _points(
    frame: pd.DataFrame, group: Sequence[str], x: str, y: str, name: str = "{}", spread: str = ""
) -> dict[str, list[tuple[float, float, float]]]:
    """The ok rows' (x, y, `spread` or 0) points, a series per value of `group`, named by `name` (a format)."""
    ok = frame[frame["status"].astype(str) == "ok"] if "status" in frame.columns else frame
    series: dict[str, list[tuple[float, float]]] = {}
    for row in ok.to_dict("records"):
        xv, yv = pd.to_numeric(row.get(x), errors="coerce"), pd.to_numeric(row.get(y), errors="coerce")
        if pd.notna(xv) and pd.notna(yv):
            values = ", ".join(label_text(g, row) for g in group)
            error = pd.to_numeric(row.get(spread), errors="coerce")
            series.setdefault(name.format(values), []).append((float(xv), float(yv), 0.0 if pd.isna(error) else error))
    return series


def attention_plot(frame: pd.DataFrame, directory: Path, stem: str) -> list[Figure]:
    group = [c for c in ("implementation", "precision") if frame[c].nunique() > 1] + ["head_dim"]
    name = "d={}" if group == ["head_dim"] else "{}"
    return line_figure(
        _points(frame, group, "context_length", "forward_mean_ms", name, "forward_std_ms"),
        title="Attention forward time vs sequence length",
        xlabel="sequence length",
        ylabel="forward (ms), mean ± std",
        path=directory / f"{stem}_forward.png",
    )


def allreduce_plot(frame: pd.DataFrame, directory: Path, stem: str) -> list[Figure]:
    return line_figure(
        _points(frame, ["backend", "world_size"], "size_bytes", "busbw_gbps", "{} ranks"),
        title="All-reduce bus bandwidth vs tensor size",
        xlabel="tensor size (bytes)",
        ylabel="bus bandwidth (GB/s)",
        path=directory / f"{stem}_allreduce.png",
    )


def warmup_plot(frame: pd.DataFrame, directory: Path, stem: str) -> list[Figure]:
    """Each step's time in order (warmup steps first), one line per number of warmup steps."""
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for warmup, rows in frame.groupby("warmup_steps"):
        rows = rows.sort_values("step_index")
        ax.plot(rows["step_index"], rows["step_ms"], marker="o", label=f"{int(warmup)} warmup")
    if len(frame) < 2:
        plt.close(fig)
        return []
    ax.set(
        xlabel="step (warmup steps first)", ylabel="step time (ms)", title="Each step's time, by number of warmup steps"
    )
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    ax.set_ylim(bottom=0)  # how much slower the first steps are is a ratio: from zero, not from the fastest
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    title = "Each step's time, by number of warmup steps"
    return [Figure(title, saved) for saved in _save(fig, directory / f"{stem}_warmup.png")]


def context_plot(frame: pd.DataFrame, directory: Path, stem: str, title: str) -> list[Figure]:
    """Step time against context length, a line per model (and whatever else varies)."""
    frame = derive(frame, "benchmark")  # the `model` label, as the tables name each row's model
    group = ["model"] + [
        c for c in ("pass_type", "precision", "compile", "device_name") if c in frame and frame[c].nunique() > 1
    ]
    return line_figure(
        _points(frame, group, "context_length", "mean_ms", spread="std_ms"),
        title=title,
        xlabel="context length",
        ylabel="step time (ms), mean ± std",
        path=directory / f"{stem}.png",
    )
