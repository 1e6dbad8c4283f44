"""python -m cs336_systems.memory.timeline: a CUDA memory snapshot as an image and a table.

    cs336-bench memory.timeline --snapshot snapshot.pickle --plot timeline.png --output largest.csv

The snapshot is what `benchmark --memory-snapshot` dumps (torch.cuda.memory._dump_snapshot), the
file pytorch.org/memory_viz opens. This draws its "Active Memory Timeline" (bytes held by live
allocations after each allocator event, as memory_viz draws it) and lists the largest allocations
with the first frame of their stack outside torch (the line of your code that asked for them).
The two functions below are pure: a snapshot dict in, numbers out.
"""

from __future__ import annotations

import pickle
from pathlib import Path

from ..command import Command
from ..errors import UsageError
from ..results.origin import named
from ..tools import prog
from ..units import GIB, MIB

LIBRARY_PATHS = ("/torch/", "/site-packages/", "/dist-packages/", "/lib/python")  # not the user's frames


def _trace(snapshot: dict, device: int) -> list[dict]:
    traces = snapshot.get("device_traces") or []
    return list(traces[device]) if device < len(traces) else []


def active_memory_timeline(snapshot: dict, device: int = 0) -> list[int]:
    """Bytes of live allocations after each alloc / free_completed event of `device`'s trace.
    Blocks allocated before the recording started count from the start: those the trace frees
    without having allocated them, and those still active at the end that it never allocated."""
    events = [e for e in _trace(snapshot, device) if e.get("action") in ("alloc", "free_completed")]
    allocated, before = set(), 0
    for event in events:
        if event["action"] == "alloc":
            allocated.add(event["addr"])
        elif event["addr"] not in allocated:
            before += event["size"]
    for segment in snapshot.get("segments", []):
        if segment.get("device", device) != device:
            continue
        address = segment.get("address", 0)  # a block's address is its segment's plus the blocks before it
        for block in segment.get("blocks", []):
            if block.get("state") == "active_allocated" and address not in allocated:
                before += block["size"]
            address += block["size"]
    active, series = before, []
    for event in events:
        active += event["size"] if event["action"] == "alloc" else -event["size"]
        series.append(active)
    return series


def user_frame(frames: list[dict]) -> str:
    """'file:line in function' of the innermost frame outside torch and the Python libraries."""
    for frame in frames or []:
        filename = str(frame.get("filename", ""))
        if filename and not filename.startswith("<") and not any(part in filename for part in LIBRARY_PATHS):
            return f"{filename}:{frame.get('line')} in {frame.get('name')}"
    return "(no frame outside torch)"


def largest_allocations(snapshot: dict, top: int = 20, device: int = 0) -> list[dict]:
    """The `top` largest allocations of the trace, largest first, with where in the user's code each was made."""
    allocations = [(index, e) for index, e in enumerate(_trace(snapshot, device)) if e.get("action") == "alloc"]
    allocations.sort(key=lambda pair: pair[1]["size"], reverse=True)
    return [
        dict(
            rank=rank,
            size_bytes=event["size"],
            size_mib=round(event["size"] / MIB, 3),
            event_index=index,
            user_frame=user_frame(event.get("frames", [])),
        )
        for rank, (index, event) in enumerate(allocations[:top], 1)
    ]


def plot_timeline(series: list[int], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    gib = [value / GIB for value in series]
    ax.fill_between(range(len(gib)), gib, step="post", alpha=0.6)
    ax.plot(range(len(gib)), gib, drawstyle="steps-post", linewidth=0.8)
    ax.set(xlabel="allocator event (alloc / free)", ylabel="active memory (GiB)", title=title)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def build_parser():
    from ..argtypes import ArgumentParser, positive_int

    parser = ArgumentParser(prog=prog("memory.timeline"), description=__doc__.split("\n")[0])
    parser.add_argument("--snapshot", type=Path, required=True, help="a pickle from benchmark --memory-snapshot")
    parser.add_argument("--plot", type=Path, required=True, help="the active memory timeline (.png)")
    parser.add_argument("--output", help="the largest allocations and their frames (.csv)")
    parser.add_argument("--top", type=positive_int, default=20, help="how many of the largest allocations (20)")
    return parser


def run(args) -> int:
    import pandas as pd

    from ..results import check_output_path, write_whole

    if args.plot.suffix != ".png":
        raise UsageError(f"--plot {args.plot}: give a .png file")
    output = check_output_path(args.output, "--output", (".csv",)) if args.output else None
    try:
        with open(args.snapshot, "rb") as handle:
            snapshot = pickle.load(handle)  # a file benchmark wrote for this run (pickle runs code: ours only)
    except (OSError, pickle.UnpicklingError, EOFError) as exc:
        raise UsageError(f"{args.snapshot}: cannot read a memory snapshot ({exc})") from None
    if not isinstance(snapshot, dict) or "device_traces" not in snapshot:
        raise UsageError(f"{args.snapshot}: not a CUDA memory snapshot (no device_traces)")
    series = active_memory_timeline(snapshot)
    plot_timeline(series, args.plot, f"Active memory timeline: {args.snapshot.name}")
    rows = largest_allocations(snapshot, args.top)
    if output is not None:
        rows = named("memory_allocations", rows)
        write_whole(output, pd.DataFrame(rows, columns=list(rows[0]) if rows else None).to_csv(index=False))
    peak = max(series, default=0)
    print(f"{len(series)} allocator events, peak active {peak / GIB:.3f} GiB; wrote {args.plot}")
    for row in rows[:5]:
        print(f"  {row['size_mib']:.1f} MiB at {row['user_frame']}")
    return 0


main = Command(build_parser, run)

if __name__ == "__main__":
    main.start()
