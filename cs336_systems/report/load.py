"""Reading result files and telling each tool's rows apart by their columns."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from ..results import ResultFileError, read_results

# Written by torch as text ("13.0") or an int (91900): read as text so pandas never makes 13.000 of them.
VERSION_COLUMNS = ("cuda_version", "cudnn_version", "torch_version", "python_version", "git_commit")

# The first tool whose columns a file has owns it; ddp_bench before benchmark (both have model_size).
TOOLS = {
    "warmup_study": ("warmup_steps", "step_index", "step_ms"),
    "attention_bench": ("implementation", "head_dim", "seq_len", "status"),
    "allreduce_bench": ("size_bytes", "world_size", "mean_ms", "status"),
    "ddp_bench": ("strategy", "world_size", "mean_ms", "status"),
    "loader_bench": ("storage", "num_workers", "samples_per_s", "status"),
    "benchmark": ("model_size", "pass_type", "mean_ms", "status"),
}


def version_text(value: object) -> str | None:
    """A version as torch wrote it: 91900 stays 91900 even where JSON made it 91900.0."""
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return None
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def read_file(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    if not path.exists():
        raise ResultFileError(f"{path}: no such file")
    try:
        if path.suffix == ".csv":
            frame = pd.read_csv(path, dtype=dict.fromkeys(VERSION_COLUMNS, str))
        else:
            frame = read_results(path)
    except ResultFileError:
        raise
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # pandas' parser errors are ValueErrors
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ResultFileError(f"{path}: cannot be read: {why}") from None
    for column in VERSION_COLUMNS:
        if column in frame.columns:
            frame[column] = frame[column].astype(object).map(version_text)
    return frame


def tool_of(frame: pd.DataFrame) -> str | None:
    return next((tool for tool, columns in TOOLS.items() if set(columns) <= set(frame.columns)), None)


def load(paths: Sequence[str | Path]) -> dict[str, pd.DataFrame]:
    """Rows per tool, in the order given; a file that no tool wrote is refused."""
    per_tool: dict[str, list[pd.DataFrame]] = {}
    for path in paths:
        frame = read_file(path)
        tool = tool_of(frame)
        if tool is None:
            raise ResultFileError(f"{path}: not a benchmark result file of any known tool ({', '.join(TOOLS)})")
        if frame.empty:
            raise ResultFileError(f"{path}: no rows")
        per_tool.setdefault(tool, []).append(frame.assign(source=Path(path).name))
    return {tool: pd.concat(frames, ignore_index=True) for tool, frames in per_tool.items()}
