"""Reading result files back: CSV, JSONL and the first table of a Markdown rendering, as a
DataFrame. Files written before a column was added or renamed read as today's rows.
"""

from __future__ import annotations

import html
import io
from pathlib import Path

import pandas as pd

from ..stats import summarize
from . import validate
from .environment import ADDED_FIELDS
from .errors import ResultFileError
from .origin import TOOL, legacy_tool
from .paths import OUTPUT_SUFFIXES
from .plausibility import NOT_MEASURABLE


def read_markdown(path: str | Path) -> pd.DataFrame:
    """The first pipe table of a Markdown file, with numbers parsed back and `&lt;`, `&gt;`, `&amp;` as
    the text they stand for (markdown.escape)."""
    lines = [line.strip() for line in validate.read_text(Path(path)).splitlines()]
    table = []
    for line in lines:
        if line.startswith("|"):
            table.append(line)
        elif table:
            break
    if len(table) < 2:
        return pd.DataFrame()
    split = [[html.unescape(cell.strip()) for cell in line.strip("|").split("|")] for line in table]
    header, body = split[0], split[2:]
    validate.check_width(Path(path), len(header))
    for number, cells in enumerate(body, 3):
        if len(cells) != len(header):
            raise ResultFileError(f"{path}: table row {number}: {len(cells)} cells, the header has {len(header)}")
    frame = pd.DataFrame(body, columns=header).replace({"": None, NOT_MEASURABLE: None})
    for column in frame.columns:
        converted = pd.to_numeric(frame[column], errors="coerce")
        if converted.notna().sum() == frame[column].notna().sum():
            frame[column] = converted
    return frame


CUT = "cut"  # a frame's attrs[CUT]: the line saying its file's cut last line was left out (or None)


def read_results(path: str | Path, dtype: dict | None = None) -> pd.DataFrame:
    """Rows of a .csv, .jsonl or .md result file as a DataFrame. Each line is checked first
    (results.validate): a damaged file raises ResultFileError naming the file and line; a last line that a
    writer was stopped in is left out (the file is not changed) and said in attrs[CUT]."""
    path = Path(path)
    if path.suffix not in OUTPUT_SUFFIXES:
        raise ResultFileError(f"{path}: unknown suffix, expected one of {', '.join(OUTPUT_SUFFIXES)}")
    if path.suffix == ".md":
        return read_markdown(path)  # a rendering: only its columns
    text = validate.read_text(path)
    cut, first, last = None, text.split("\n", 1)[0], text.rsplit("\n", 1)[-1]
    if text and not text.endswith("\n") and not validate.whole_last_line(path.suffix, first, last):
        cut = f"{path}:{text.count(chr(10)) + 1}: its last line, cut short (a writer stopped mid-row): read without it"
        text = text[: text.rfind("\n") + 1]
    if path.suffix == ".csv":
        validate.check_csv(path, text)
        if not text.strip():
            return pd.DataFrame()
        try:
            frame = pd.read_csv(io.StringIO(text), dtype=dtype)
        except (pd.errors.ParserError, ValueError) as exc:
            raise ResultFileError(f"{path}: damaged CSV ({str(exc).strip().split('. ')[-1]})") from None
    else:
        validate.check_jsonl(path, text)
        frame = pd.read_json(io.StringIO(text), lines=True, dtype=False) if text.strip() else pd.DataFrame()
    frame = as_todays_rows(frame)
    frame.attrs[CUT] = cut
    return frame


# Benchmark columns added since files were written: such a row measured a fixed number of steps and
# judged no peak (empty); a file appended to gains them (files.CsvWriter), as it gains the environment's
# ADDED_FIELDS.
ADDED_BENCHMARK_COLUMNS = ("target_iqr_pct", "iqr_target_reached", "peak_low")

# Columns renamed since, for rows only one tool writes: (a column that marks that tool's rows, old, new).
RENAMED_COLUMNS = (
    ("plan_status", "tool", "runs"),  # a handout plan: the tool each step runs (`tool` names the plan's own)
    ("implementation", "seq_len", "context_length"),  # attention_bench
    ("implementation", "steps", "measure_steps"),
    ("implementation", "forward_ms", "forward_samples_ms"),  # JSONL: raw samples, as benchmark names them
    ("implementation", "backward_ms", "backward_samples_ms"),
    ("implementation", "end_to_end_ms", "end_to_end_samples_ms"),
    ("strategy", "per_device_batch", "batch_size"),  # ddp_bench: the batch per rank
    # the per-phase means, before each phase had every timing column (timing_columns("forward_"))
    ("pass_type", "forward_ms", "forward_mean_ms"),  # benchmark
    ("pass_type", "backward_ms", "backward_mean_ms"),
    ("pass_type", "optimizer_ms", "optimizer_mean_ms"),
    ("strategy", "forward_ms", "forward_mean_ms"),  # ddp_bench
    ("strategy", "backward_ms", "backward_mean_ms"),
)
# Raw samples and the timing columns they summarise: a JSONL file written before the IQR was a
# column gets it from its samples (a CSV file has no samples; its rows have no iqr_pct).
SAMPLES_OF_TIMING = (
    ("step_ms", ""),
    *((f"{phase}_samples_ms", f"{phase}_") for phase in ("forward", "backward", "optimizer", "end_to_end")),
)


def as_todays_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of a file written before a column was renamed or added, as today's rows."""
    columns = set(frame.columns)
    renames = {
        old: new for marker, old, new in RENAMED_COLUMNS if marker in columns and old in columns and new not in columns
    }
    frame = _with_spread_from_samples(_with_added_config_columns(frame.rename(columns=renames)))
    return _with_tool(_with_placement(frame)).copy()  # one block per dtype again after the added columns


def _with_tool(frame: pd.DataFrame) -> pd.DataFrame:
    """A file written before rows named their tool: the tool its columns say, as the first column."""
    if TOOL in frame.columns or frame.empty:
        return frame
    tool = legacy_tool(frame.columns)
    return frame if tool is None else frame.assign(**{TOOL: tool})[[TOOL, *frame.columns]]


def _with_placement(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows written before the placement columns (executor, Slurm job, GPU) existed: they are empty."""
    if "hostname" in frame.columns:
        frame = _with_columns(frame, dict.fromkeys(ADDED_FIELDS))
    return frame


def _with_columns(frame: pd.DataFrame, columns: dict[str, object]) -> pd.DataFrame:
    """`frame` with those of `columns` (name: a value or a column) it lacks, added at once: one by one,
    pandas fragments a wide frame (and says so in a PerformanceWarning)."""
    added = {name: value for name, value in columns.items() if name not in frame.columns}
    if not added:
        return frame
    new = pd.DataFrame({k: v if isinstance(v, list | pd.Series) else [v] * len(frame) for k, v in added.items()})
    return pd.concat([frame, new.set_axis(frame.index)], axis=1)


def _with_spread_from_samples(frame: pd.DataFrame) -> pd.DataFrame:
    for samples, prefix in SAMPLES_OF_TIMING:
        if samples not in frame.columns or f"{prefix}median_ms" not in frame.columns or f"{prefix}iqr_pct" in frame:
            continue
        summaries = [summarize(s) if isinstance(s, list) and s else None for s in frame[samples]]
        if any(summaries):  # else a column of that name that holds no samples (a probe's step_ms)
            spread = {f"{prefix}iqr_ms": "iqr", f"{prefix}iqr_pct": "iqr_pct"}
            frame = _with_columns(
                frame, {c: [x if x is None else getattr(x, s) for x in summaries] for c, s in spread.items()}
            )
    return frame


def _with_added_config_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """Benchmark files written before compile_mode and cuda_graphs existed: their rows ran
    torch.compile's default mode (when compiled) and no CUDA graph, so they still match."""
    if "compile" not in frame.columns:
        return frame
    compiled = frame["compile"].astype(str).str.lower() == "true"
    mode = compiled.map({True: "default", False: None}).astype(object)
    # and measured a fixed number of steps (ADDED_BENCHMARK_COLUMNS empty)
    return _with_columns(frame, {"compile_mode": mode, "cuda_graphs": False, **dict.fromkeys(ADDED_BENCHMARK_COLUMNS)})
