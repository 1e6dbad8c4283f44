"""Reading result files: each row names the tool that wrote it (its `tool` column; a file written
before that column gets it from its columns when it is read, results/readers.as_todays_rows)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from .. import jsontext
from ..results import ENVIRONMENT_FIELDS, ResultFileError, read_results, validate
from ..results.origin import TOOL, TOOL_NAMES
from ..results.readers import CUT, as_todays_rows

# Written by torch as text ("13.0") or an int (91900): read as text so pandas never makes 13.000 of them.
VERSION_COLUMNS = ("cuda_version", "cudnn_version", "torch_version", "python_version", "git_commit")


def version_text(value: object) -> str | None:
    """A version as torch wrote it: 91900 stays 91900 even where JSON made it 91900.0."""
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return None
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def read_file(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    validate.check_not_rendering(path)
    try:
        if path.suffix == ".csv":  # damaged lines named as file:LINE
            frame = read_results(path, dtype=dict.fromkeys(VERSION_COLUMNS, str))
        elif path.suffix == ".json":
            frame = as_todays_rows(_summary_frame(jsontext.loads(path.read_text())))
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


def _summary_frame(summary: object) -> pd.DataFrame:
    """A JSON object (find_max's answer, monitor's run record) as one row; its lists as text."""
    if not isinstance(summary, dict):
        raise ValueError("not a JSON object")
    flat = {k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in summary.items()}
    return pd.DataFrame([flat])


def tool_of(frame: pd.DataFrame) -> str | None:
    """The tool whose rows these are (one file's rows name one tool), None for a file of no tool of ours."""
    if TOOL not in frame.columns or frame.empty:
        return None
    names = frame[TOOL].dropna().unique()
    return str(names[0]) if len(names) == 1 and str(names[0]) in TOOL_NAMES else None


# Numbers a row is given rather than measures (its settings, the machine's)
GIVEN_NUMBERS = {"peak_tflops", "predicted_memory_bytes", "memory_limit_bytes", "bucket_cap_mb", "size_bytes"}


def measured_nothing(frame: pd.DataFrame) -> pd.Series:
    """Which rows say ok yet hold no measured number: every time, byte count, rate and share NaN or empty."""
    names = [c for c in frame.columns if c.endswith(validate.NUMERIC_SUFFIXES) and c not in GIVEN_NUMBERS]
    names = [c for c in names if c not in ENVIRONMENT_FIELDS and c != "target_iqr_pct"]
    numbers = frame[names].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float)
    return frame.get("status", pd.Series(index=frame.index)).eq("ok") & bool(names) & ~np.isfinite(numbers).any(axis=1)


def load_each(paths: Sequence[str | Path]) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """Rows per tool, in the order given, and one line for each file left out (unreadable, empty,
    or written by no tool of this project), so one stray file never costs the rest."""
    per_tool: dict[str, list[pd.DataFrame]] = {}
    problems: list[str] = []
    for path in paths:
        try:
            frame = read_file(path)
        except ResultFileError as exc:
            problems.append(str(exc))
            continue
        problems += [frame.attrs[CUT]] if frame.attrs.get(CUT) else []
        if (nothing := measured_nothing(frame)).any():
            problems.append(f"{path}: {nothing.sum()} of {len(frame)} rows say ok and hold no measured number (NaN)")
            if (frame := frame[~nothing]).empty:
                continue
        tool = tool_of(frame)
        if tool is None:
            problems.append(f"{path}: not the output of any tool of this project ({', '.join(TOOL_NAMES)})")
        elif frame.empty:
            problems.append(f"{path}: no rows")
        else:
            per_tool.setdefault(tool, []).append(frame.assign(source=Path(path).name))
    return {tool: pd.concat(frames, ignore_index=True) for tool, frames in per_tool.items()}, problems


def load(paths: Sequence[str | Path]) -> dict[str, pd.DataFrame]:
    """Rows per tool; the first file left out is an error."""
    frames, problems = load_each(paths)
    if problems:
        raise ResultFileError(problems[0])
    return frames


# -- index files: rows that name other result files (a handout plan's steps) -------------------


def reads(step: dict) -> list[str]:
    """The result files an index row names (a plan step's rows are in them): the plan's `reads`, else its CSV outputs; a JSONL beside
    a CSV is read instead (it keeps each step's samples, so per-phase spreads can be shown)."""
    names = _words(step.get("reads")) or [n for n in _words(step.get("outputs")) if n.endswith((".csv", ".json"))]
    return list(dict.fromkeys(names))


def _words(value: object) -> list[str]:
    return value.split() if isinstance(value, str) else []  # an empty cell reads back as NaN


def index_files(index: pd.DataFrame, directory: Path) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """The result files an index file names (a handout plan: each finished step's `reads`), by name, read
    from `directory` (a JSONL instead of its CSV twin); and one line per named file that is not there."""
    files, problems = {}, []
    for step in index.to_dict("records"):
        if step.get("outcome") not in ("ok", "failed rows"):
            continue
        for name in reads(step):
            path = directory / name
            twin = path.with_suffix(".jsonl")
            if path.suffix == ".csv" and twin.is_file():
                path = twin
            if not path.is_file():
                problems.append(f"{name}: named by step {step['step']} but not in {directory}")
                continue
            frame = read_file(path)
            files[name] = frame.assign(source=path.name)
    return files, problems
