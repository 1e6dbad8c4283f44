"""Bandwidth against size, a line per world size."""

from __future__ import annotations

from collections.abc import Sequence


def plot_bandwidth(rows: Sequence[dict], path: str) -> None:
    """Bus bandwidth (solid) and algorithm bandwidth (dashed) against size, a line per world size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [row for row in rows if row.get("status") == "ok"]
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for world_size in sorted({row["world_size"] for row in ok}):
        points = sorted(
            (row["size_bytes"], row["busbw_gbps"], row["algbw_gbps"]) for row in ok if row["world_size"] == world_size
        )
        sizes = [p[0] for p in points]
        line = axis.plot(sizes, [p[1] for p in points], marker="o", label=f"n={world_size} busbw")[0]
        axis.plot(
            sizes,
            [p[2] for p in points],
            linestyle="--",
            color=line.get_color(),
            alpha=0.6,
            label=f"n={world_size} algbw",
        )
    backends = ", ".join(sorted({row["backend"] for row in ok}))
    devices = ", ".join(sorted({str(row.get("device_name")) for row in ok}))
    axis.set_xscale("log")
    axis.set_xlabel("all-reduce size (bytes, float32)")
    axis.set_ylabel("bandwidth (GB/s)")
    axis.set_title(f"all_reduce bandwidth: {backends} on {devices}", fontsize=9)
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
