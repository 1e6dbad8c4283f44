"""Result files: CSV and JSONL accumulate rows (each appended and flushed the moment it
exists); a Markdown file is a rendering, rewritten after every row. One `ResultSink` writes
every tool's records; the record type supplies the columns and the Markdown view.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Protocol

import pandas as pd

from cs336_systems.results.records import BenchmarkRecord

OUTPUT_SUFFIXES = (".csv", ".md", ".jsonl")


class ResultFileError(ValueError):
    """An output path we cannot write to as asked (bad suffix, mismatched columns)."""


class ResultRecord(Protocol):
    def to_row(self) -> dict[str, object]:
        """Flat scalar fields: one CSV / Markdown row."""
        ...

    def to_json(self) -> dict[str, object]:
        """The row plus raw samples: one JSONL line."""
        ...


class CsvWriter:
    """Appends rows; writes the header only to a new file; refuses a file with other columns.

    A file with the same columns in another order (written before a column moved) keeps its order.
    """

    def __init__(self, path: Path, fields: Sequence[str]):
        self.path, self.fields = path, list(fields)
        existing = _read_csv_header(path)
        if existing is not None and sorted(existing) != sorted(self.fields):
            raise ResultFileError(f"{path} already holds results with different columns; write to a new file")
        if existing is not None:
            self.fields = existing
        self._needs_header = existing is None

    def write(self, record: ResultRecord) -> None:
        row = record.to_row()
        frame = pd.DataFrame([[row.get(name) for name in self.fields]], columns=self.fields)
        with self.path.open("a", newline="") as handle:
            frame.to_csv(handle, header=self._needs_header, index=False)
            handle.flush()
        self._needs_header = False


def _read_csv_header(path: Path) -> list[str] | None:
    if not path.exists() or path.stat().st_size == 0:
        return None
    with path.open(newline="") as handle:
        return pd.read_csv(handle, nrows=0).columns.tolist()


class JsonlWriter:
    def __init__(self, path: Path):
        self.path = path

    def write(self, record: ResultRecord) -> None:
        line = json.dumps(record.to_json(), default=str, allow_nan=True)
        with self.path.open("a") as handle:
            handle.write(line + "\n")
            handle.flush()


class MarkdownWriter:
    """Re-renders the whole document after each row, atomically (temp file + rename)."""

    def __init__(self, path: Path, render: Callable[[Sequence[dict]], str], rows: Iterable[dict] = ()):
        self.path, self.render, self.rows = path, render, list(rows)

    def write(self, record: ResultRecord) -> None:
        self.rows.append(record.to_row())
        temporary = self.path.with_name(self.path.name + ".tmp")
        temporary.write_text(self.render(self.rows))
        os.replace(temporary, self.path)


def check_output_paths(paths: Iterable[str | Path]) -> list[Path]:
    """Validate suffixes and parent directories before any work starts."""
    checked = []
    for raw in paths:
        path = Path(raw)
        if path.suffix not in OUTPUT_SUFFIXES:
            raise ResultFileError(f"--output {raw}: unknown suffix, use one of {', '.join(OUTPUT_SUFFIXES)}")
        if path.parent and not path.parent.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
        checked.append(path)
    return checked


class ResultSink:
    """Sends each finished record to every output file at once.

    `record_type` gives the CSV columns (`row_fields()`) and the Markdown view (`markdown(rows)`);
    `previous_rows` are rows already in the files (a resumed sweep), so the Markdown shows them.
    `fields` / `render` override those for records not yet on `Record` (LegacyRecord).
    """

    def __init__(
        self,
        paths: Iterable[str | Path],
        record_type: type = BenchmarkRecord,
        previous_rows: Iterable[dict] = (),
        *,
        fields: Sequence[str] | None = None,
        render: Callable[[Sequence[dict]], str] | None = None,
    ):
        fields = record_type.row_fields() if fields is None else fields
        render = record_type.markdown if render is None else render
        self.writers = []
        for path in check_output_paths(paths):
            if path.suffix == ".csv":
                self.writers.append(CsvWriter(path, fields))
            elif path.suffix == ".jsonl":
                self.writers.append(JsonlWriter(path))
            else:
                self.writers.append(MarkdownWriter(path, render, previous_rows))

    def write(self, record: ResultRecord) -> None:
        for writer in self.writers:
            writer.write(record)


def read_markdown(path: str | Path) -> pd.DataFrame:
    """The first pipe table of a Markdown file, with numbers parsed back."""
    lines = [line.strip() for line in Path(path).read_text().splitlines()]
    table = []
    for line in lines:
        if line.startswith("|"):
            table.append(line)
        elif table:
            break
    if len(table) < 2:
        return pd.DataFrame()
    split = [[cell.strip() for cell in line.strip("|").split("|")] for line in table]
    header, body = split[0], split[2:]
    frame = pd.DataFrame(body, columns=header).replace("", None)
    for column in frame.columns:
        converted = pd.to_numeric(frame[column], errors="coerce")
        if converted.notna().sum() == frame[column].notna().sum():
            frame[column] = converted
    return frame


def read_results(path: str | Path) -> pd.DataFrame:
    """Rows of a .csv, .jsonl or .md result file as a DataFrame."""
    path = Path(path)
    if path.suffix == ".csv":
        return _with_added_config_columns(pd.read_csv(path))
    if path.suffix == ".jsonl":
        return _with_added_config_columns(pd.read_json(path, lines=True, dtype=False))
    if path.suffix == ".md":
        return read_markdown(path)  # a rendering: only its columns
    raise ResultFileError(f"{path}: unknown suffix, expected one of {', '.join(OUTPUT_SUFFIXES)}")


def _with_added_config_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """Benchmark files written before compile_mode and cuda_graphs existed: their rows ran
    torch.compile's default mode (when compiled) and no CUDA graph, so they still match."""
    if "compile" not in frame.columns:
        return frame
    if "compile_mode" not in frame.columns:
        compiled = frame["compile"].astype(str).str.lower() == "true"
        frame["compile_mode"] = compiled.map({True: "default", False: None}).astype(object)
    if "cuda_graphs" not in frame.columns:
        frame["cuda_graphs"] = False
    return frame
