"""Where the results were measured: a column per machine, commit and torch version, each field's
values and the files measured there.

Such a table is not one row per cell, so its spec names the function that rebuilds it from the
result files (REBUILD), and `--verify` compares."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from .document import Table
from .spec import Spec

ENVIRONMENT = (  # row label -> column of the result rows
    ("device", "device_name"),
    ("CPU", "cpu_name"),
    ("device memory", "device_memory_bytes"),
    ("threads", "num_threads"),
    ("torch", "torch_version"),
    ("CUDA", "cuda_version"),
    ("Python", "python_version"),
    ("commit", "git_commit"),
)


def _text(column: str, value: object) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)) or value == "":
        return ""
    if column == "device_memory_bytes":
        return f"{float(value) / 2**30:.1f} GiB"
    if column == "git_commit":
        return str(value)[:10]
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def environment_frame(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One column per (device, commit, torch) found; each field's distinct values, in file order."""
    # each file by the name it is given under (the spec's sources), not its rows' `source`: a CSV and its
    # JSONL twin hold the same rows, and which of the two was read first must not change the table
    rows = [
        f.assign(source=name)
        for name, f in frames.items()
        if "device_name" in f.columns and "torch_version" in f.columns
    ]
    if not rows:
        return pd.DataFrame()
    every = pd.concat(rows, ignore_index=True)
    keys = [k for k in ("device_name", "git_commit", "torch_version") if k in every.columns]
    columns: dict[str, dict[str, str]] = {}
    for number, (_, group) in enumerate(every.groupby(keys, dropna=False, sort=False), 1):
        cells = {}
        for label, column in ENVIRONMENT:
            if column in group.columns:
                cells[label] = ", ".join(dict.fromkeys(t for t in (_text(column, v) for v in group[column]) if t))
        files = list(dict.fromkeys(str(s) for s in group["source"]))
        cells["result files"] = ", ".join(files) if len(files) <= 3 else f"{len(files)} files"
        columns[f"machine {number}"] = cells
    frame = pd.DataFrame(columns).fillna("")
    frame = frame[frame.apply(lambda r: r.ne("").any(), axis=1)]
    frame.index.name = "field"
    return frame


Rebuild = Callable[[dict[str, pd.DataFrame]], pd.DataFrame]
REBUILD: dict[str, Rebuild] = {"environment": environment_frame}


def environment_table(frames: dict[str, pd.DataFrame]) -> Table:
    """Where the rows of `frames` (by file name) were measured: a column per machine, commit and torch."""
    title, caption = "Where the results were measured", "One column per machine, commit and torch version"
    return rebuilt_table("environment", "environment", title, caption, frames)


def rebuilt_table(
    name: str, kind: str, title: str, caption: str, frames: dict[str, pd.DataFrame], make: Rebuild | None = None
) -> Table:
    """A table whose spec names the function that rebuilds it from its source files (`--verify` is
    handed it: REBUILD here, or the maker's own, e.g. a handout write-up's checklist)."""
    frame = (make or REBUILD[kind])(frames)
    spec = Spec(f"rebuild:{kind}", list(frames), {}, [], [], title, caption)
    return Table(name, title, caption, frame, spec=spec)
