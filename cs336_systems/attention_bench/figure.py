"""Forward and backward time against sequence length, out-of-memory points marked."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .config import IMPLEMENTATIONS, PASSES


def plot(rows: Sequence[dict], path: str | Path) -> Path:
    """Draw the figure of `rows` and save it to `path`."""
    import matplotlib.pyplot as plt

    fig = draw(rows)
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def draw(rows: Sequence[dict]):
    """Forward, backward (and end-to-end) mean time vs sequence length (log-log), one column per head dim;
    out-of-memory points are marked with an x along the top edge. Returns the Figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker as ticker
    import matplotlib.transforms as transforms
    import pandas as pd

    frame = pd.DataFrame(list(rows))
    head_dims = sorted(frame["head_dim"].unique())
    seq_lens = sorted(int(n) for n in frame["seq_len"].unique())
    present = list(dict.fromkeys(frame["implementation"]))
    implementations = [name for name in IMPLEMENTATIONS if name in present]
    implementations += [name for name in present if name not in implementations]  # package.module:callable
    palette = ("tab:red", "tab:blue", "tab:green", "tab:purple", "tab:orange", "tab:brown", "tab:pink", "tab:gray")
    colors = {
        name: palette[i % len(palette)]
        for i, name in enumerate(dict.fromkeys(IMPLEMENTATIONS + tuple(implementations)))
    }
    passes = [name for name in PASSES if f"{name}_mean_ms" in frame]
    fig, axes = plt.subplots(
        len(passes),
        len(head_dims),
        figsize=(3.6 * len(head_dims) + 1, 3.25 * len(passes)),
        squeeze=False,
        sharex=True,
        sharey="row",
    )
    for column, head_dim in enumerate(head_dims):
        for row_index, name in enumerate(passes):
            ax = axes[row_index][column]
            edge = transforms.blended_transform_factory(ax.transData, ax.transAxes)
            for implementation in implementations:
                rows_here = frame[(frame["head_dim"] == head_dim) & (frame["implementation"] == implementation)]
                rows_here = rows_here.sort_values("seq_len")
                measured = rows_here[rows_here[f"{name}_mean_ms"].notna()]
                ax.plot(
                    measured["seq_len"],
                    measured[f"{name}_mean_ms"],
                    marker="o",
                    color=colors[implementation],
                    label=implementation,
                )
                failed = rows_here[(rows_here["status"] == "oom") & rows_here[f"{name}_mean_ms"].isna()]
                if len(failed):
                    ax.plot(
                        failed["seq_len"],
                        [0.95] * len(failed),
                        transform=edge,
                        marker="x",
                        markersize=9,
                        linestyle="none",
                        color=colors[implementation],
                        label=f"{implementation} OOM",
                    )
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(seq_lens, [str(n) for n in seq_lens])
            ax.xaxis.set_minor_locator(ticker.NullLocator())
            ax.grid(True, which="major", alpha=0.3)
            ax.set_title(f"{name}, head_dim {head_dim}", fontsize=10)
            if column == 0:
                ax.set_ylabel(f"{name} mean (ms)")
            if row_index == len(passes) - 1:
                ax.set_xlabel("sequence length")
    legend: dict[str, object] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=len(legend), fontsize=9)
    first = frame.iloc[0]
    fig.suptitle(
        f"causal attention, batch {first['batch_size']}, {first['precision']}, {first.get('device_name', '')}",
        fontsize=11,
    )
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig
