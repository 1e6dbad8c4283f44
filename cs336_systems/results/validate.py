"""Checking a result file line by line before it is read: a damaged line is named as
`file:LINE` with what is wrong (ResultFileError), so report, compare and resume refuse it in
one line instead of a pandas traceback or a silently wrong table.

Pure functions of the file's text; files.read_results calls them.
"""

from __future__ import annotations

import csv
import io
import json
import stat
from collections.abc import Iterable
from pathlib import Path

from .. import jsontext
from .environment import ADDED_FIELDS
from .errors import ResultFileError

# Columns that hold numbers in every tool's records: by suffix, or by name.
NUMERIC_SUFFIXES = ("_ms", "_pct", "_bytes", "_per_s", "_s", "_gbps", "_tflops", "_flops", "_gib", "_mb")
NUMERIC_NAMES = frozenset(
    (
        "batch_size",
        "context_length",
        "world_size",
        "seq_len",
        "head_dim",
        "d_model",
        "d_ff",
        "num_layers",
        "num_heads",
        "step_index",
        "size_bytes",
        "mfu",
        "num_params",
        "num_threads",
        "num_workers",
        "slurm_array_task_id",
    )
)


# A result file of this project has some 130 columns and short cells (an error's text is cut to
# FIELD_CHARS when written: writing.csv_line). Past these bounds a file is no result of ours: refused
# in one line, before pandas spends minutes on 50,000 columns.
MAX_COLUMNS = 1_000
FIELD_CHARS = 100_000  # what the writers keep of a cell: under the csv module's default limit (128 KiB)
MAX_FIELD_CHARS = 2**24  # what the readers accept (a file another tool wrote, or ours before the cut)


def csv_rows(lines: Iterable[str]):
    """csv.reader with a field limit that reads a long cell (the default stops at 128 KiB) and still
    bounds one; csv.Error is the caller's to name (csv_error)."""
    if csv.field_size_limit() < MAX_FIELD_CHARS:
        csv.field_size_limit(MAX_FIELD_CHARS)
    return csv.reader(lines)


def csv_error(path: Path, number: int, exc: csv.Error) -> ResultFileError:
    return ResultFileError(f"{path}:{number}: damaged CSV ({exc}; a cell holds at most {MAX_FIELD_CHARS:,} characters)")


def check_width(path: Path, columns: int) -> None:
    if columns > MAX_COLUMNS:
        raise ResultFileError(
            f"{path}:1: {columns:,} columns; a result file has at most {MAX_COLUMNS:,} (not a file of this project)"
        )


def is_numeric_column(name: str) -> bool:
    return name in NUMERIC_NAMES or name.endswith(NUMERIC_SUFFIXES)


def check_readable(path: Path) -> None:
    """A regular file that exists: a FIFO would block the reader, a directory cannot be read."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise ResultFileError(f"{path}: no such file") from None
    except OSError as exc:
        raise ResultFileError(f"{path}: cannot be read ({exc.strerror})") from None
    if stat.S_ISDIR(mode):
        raise ResultFileError(f"{path}: is a directory, give a result file")
    if not stat.S_ISREG(mode):
        raise ResultFileError(f"{path}: not a regular file (a FIFO, device or socket); give a result file")


def check_not_rendering(path: Path) -> None:
    """A Markdown results file is a rendering for people (some columns, rounded numbers): a tool
    that compares or reports rows reads the .csv or .jsonl written beside it instead."""
    if Path(path).suffix == ".md":
        raise ResultFileError(
            f"{path}: a Markdown rendering (some columns, rounded); give the .csv or .jsonl the tool wrote beside it"
        )


def read_text(path: Path) -> str:
    """The file's text; bytes that are not UTF-8 are named by line."""
    check_readable(path)
    data = path.read_bytes()
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ResultFileError(
            f"{path}:{line}: not UTF-8 text (byte {data[exc.start]:#04x}); not a result file"
        ) from None


def _bad_number(value: object) -> bool:
    """A value that cannot stand in a numeric column (empty, None and NaN are 'no value')."""
    if value is None or value == "":
        return False
    if isinstance(value, bool):
        return True
    if isinstance(value, int | float):
        return False
    try:
        float(str(value))
    except ValueError:
        return True
    return False


def _check_numbers(path: Path, number: int, row: dict) -> None:
    for name, value in row.items():
        if is_numeric_column(name) and _bad_number(value):
            raise ResultFileError(f"{path}:{number}: column {name} holds {str(value)[:40]!r}, not a number")


def check_csv(path: Path, text: str) -> None:
    """Every line has the header's fields, no line repeats the header, numbers are numbers; no more
    columns or longer cells than a result file has."""
    if text.lstrip().startswith("|") or text.lstrip().startswith("#"):
        raise ResultFileError(f"{path}:1: a Markdown file named .csv; give the .csv a tool wrote")
    rows = csv_rows(io.StringIO(text, newline=""))
    try:
        header = next(rows, None)
        if not header:
            return
        check_width(path, len(header))
        if len(set(header)) != len(header):
            raise ResultFileError(f"{path}:1: a column name appears twice in the header")
        for number, cells in enumerate(rows, 2):
            if not cells:
                continue  # a blank line
            if cells == header:
                raise ResultFileError(f"{path}:{number}: the header line again (two files joined?); remove it")
            if len(cells) != len(header):
                raise ResultFileError(f"{path}:{number}: {len(cells)} fields, the header has {len(header)}")
            _check_numbers(path, number, dict(zip(header, cells, strict=True)))
    except csv.Error as exc:
        raise csv_error(path, rows.line_num, exc) from None


def jsonl_row(path: Path, number: int, line: str) -> dict:
    """Line `number` of a JSONL file as the row it must be: a JSON object."""
    try:
        value = jsontext.loads(line)
    except json.JSONDecodeError as exc:
        raise ResultFileError(f"{path}:{number}: damaged JSONL line ({exc.msg})") from None
    if not isinstance(value, dict):
        raise ResultFileError(f"{path}:{number}: a JSON {type(value).__name__}, not an object (a row)")
    return value


def check_jsonl(path: Path, text: str) -> None:
    """Every line is a JSON object with line 1's keys (the placement columns may start mid-file: rows
    appended after they existed), numbers are numbers."""
    keys: set[str] | None = None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        value = jsonl_row(path, number, line)
        if keys is None:
            check_width(path, len(value))
            keys = set(value)
        elif set(value) - set(ADDED_FIELDS) != keys - set(ADDED_FIELDS):
            missing, extra = sorted(keys - set(value)), sorted(set(value) - keys)
            what = "; ".join(
                part
                for part in (
                    f"missing {', '.join(missing[:3])}" if missing else "",
                    f"extra {', '.join(extra[:3])}" if extra else "",
                )
                if part
            )
            raise ResultFileError(f"{path}:{number}: other keys than line 1 ({what}); mixed files?")
        _check_numbers(path, number, {k: v for k, v in value.items() if not isinstance(v, list | dict)})


def whole_last_line(suffix: str, first: str, last: str) -> bool:
    """Whether a last line that lacks its newline is still a whole row (kept) rather than one a writer was
    stopped in (left out): a JSONL object with line 1's (`first`) keys; a CSV line with the header's field
    count and numbers where numbers belong."""
    try:
        if suffix == ".jsonl":
            value, keys = jsontext.loads(last), jsontext.loads(first)
            return isinstance(value, dict) and isinstance(keys, dict) and set(value) == set(keys)
        header, cells = next(csv_rows([first])), next(csv_rows(io.StringIO(last, newline="")))
    except (StopIteration, csv.Error, json.JSONDecodeError):
        return False
    if first == last or last.count('"') % 2 or len(cells) != len(header):
        return False
    return not any(is_numeric_column(name) and _bad_number(value) for name, value in zip(header, cells, strict=True))
