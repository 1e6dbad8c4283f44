"""Result files: CSV and JSONL accumulate rows (each appended the moment it exists, as one
`write` of a complete line); a Markdown file is a rendering, rewritten whole after every row.
One `ResultSink` writes every tool's records; the record type supplies the columns and the
Markdown view. The sink holds an exclusive lock on each output for its whole life, so two
runs never interleave rows or write a header twice. The paths are checked first (paths.py); a
line or a whole file is written by writing.py.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import json
import os
import stat
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Protocol

from ..lifetime import at_exit
from . import validate
from .environment import ADDED_FIELDS
from .errors import OutputLockedError, ResultFileError
from .origin import TOOL
from .paths import check_output_paths, lock_path
from .readers import ADDED_BENCHMARK_COLUMNS
from .records import BenchmarkRecord
from .writing import append_line, csv_line, repair_cut_line, write_whole


class ResultRecord(Protocol):
    def to_row(self) -> dict[str, object]:
        """Flat scalar fields: one CSV / Markdown row."""
        ...

    def to_json(self) -> dict[str, object]:
        """The row plus raw samples: one JSONL line."""
        ...


# -- one writer per file ----------------------------------------------------------------


class OutputLock:
    """An exclusive `flock` on a sidecar `.NAME.lock` holding the writer's pid (the sidecar,
    not the file, because a Markdown file is replaced by rename on every row). Other processes
    are kept out; sinks of one process share the lock (counted), so a tool may open a file twice.

    `appended` (a .csv or .jsonl output, written in place): the file itself is locked too, so
    two names of one file (hard links, whose sidecars differ) are one lock, keyed by its device
    and inode: now if it exists, else as soon as the first row creates it (`hold_file`)."""

    held: dict[Path, list] = {}  # sidecar -> [fd, users, the file's own locked fd or None]

    def __init__(self, path: Path, wait: bool = False, wait_flag: str | None = None, appended: bool = False):
        # a tool without a waiting flag is told only to wait: name only flags that exist
        self.wait_hint = f", or pass {wait_flag}" if wait_flag else ""
        self.path = lock_path(path)
        entry = self.held.get(self.path)
        if entry is None:
            fd = self._acquire(path, wait)
            try:
                file_fd = self._acquire_file(path, wait) if appended and path.exists() else None
            except BaseException:
                self.path.unlink(missing_ok=True)
                os.close(fd)
                raise
            entry = self.held[self.path] = [fd, 0, file_fd]
        entry[1] += 1
        self.active = True

    def _acquire(self, output: Path, wait: bool) -> int:
        while True:
            try:  # never through a link planted at the sidecar's name
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
            except OSError as exc:
                raise ResultFileError(
                    f"{output}: cannot open its lock file {self.path.name} ({exc.strerror})"
                ) from None
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise ResultFileError(f"{output}: its lock file {self.path.name} is not a regular file; remove it")
            self._flock(fd, output, wait)
            # The previous holder removes the sidecar on release: make sure ours is the one at the path.
            try:
                current = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                current = False
            if current:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
                return fd
            os.close(fd)

    def _acquire_file(self, output: Path, wait: bool) -> int | None:
        """The output file itself, flocked: its fd (None if it cannot be opened; its sidecar still guards it)."""
        try:
            fd = os.open(output, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        self._flock(fd, output, wait, "another process under another name of the same file (a hard link)")
        return fd

    def _flock(self, fd: int, output: Path, wait: bool, holder: str | None = None) -> None:
        """`fd` locked now, or (`wait`) once its holder (None: the process the sidecar names) lets go, said in a
        line; else OutputLockedError naming the holder."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.pread(fd, 32, 0).decode(errors="replace").strip() if holder is None else ""
            holder = holder or f"process {pid or 'another process'} (lock {self.path.name})"
            if not wait:
                os.close(fd)
                raise OutputLockedError(f"{output} is being written by {holder}; wait for it{self.wait_hint}") from None
            print(f"waiting for {holder} to finish writing {output}", file=sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)

    def hold_file(self, output: Path) -> None:
        """The first row created `output`: lock it too (a hard link made to it from now on is kept out)."""
        entry = self.held.get(self.path)
        if entry is not None and entry[2] is None and self.active:
            with contextlib.suppress(
                OutputLockedError
            ):  # a writer there within the microseconds since: none to wait for
                entry[2] = self._acquire_file(output, wait=False)

    def release(self) -> None:
        if not self.active:
            return
        self.active = False
        entry = self.held.get(self.path)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del self.held[self.path]
            _release(self.path, entry)


def _release(sidecar: Path, entry: list) -> None:
    fd, _, file_fd = entry
    if file_fd is not None:
        os.close(file_fd)
    sidecar.unlink(missing_ok=True)
    os.close(fd)


@at_exit
def _release_all() -> None:
    for path, entry in list(OutputLock.held.items()):
        _release(path, entry)
    OutputLock.held.clear()


# -- the writers ------------------------------------------------------------------------


class CsvWriter:
    """Appends rows; writes the header only to a new file (in the same write as the first row);
    refuses a file with other columns. A file with the same columns in another order (written
    before a column moved) keeps its order; one without the `tool` column (written before it) keeps
    its columns; one written before the placement columns existed (environment.ADDED_FIELDS)
    gains them, empty, at the end of each row (the file is rewritten whole once, under the sink's lock)."""

    def __init__(self, path: Path, fields: Sequence[str]):
        self.path, self.fields = path, list(fields)
        existing = _read_csv_header(path)
        if existing is not None and TOOL not in existing and TOOL in self.fields:
            self.fields.remove(TOOL)  # a file written before rows named their tool keeps its columns
        if existing is not None:
            existing = _add_placement_columns(path, existing, self.fields)
        if existing is not None and sorted(existing) != sorted(self.fields):
            raise ResultFileError(
                f"{path} already holds results with different columns (another tool's, or an older schema); "
                "write to a new file"
            )
        if existing is not None:
            self.fields = existing
        self._needs_header = existing is None

    def write(self, record: ResultRecord) -> None:
        self.write_row(record.to_row())

    def write_row(self, row: dict) -> None:
        line = csv_line([row.get(name) for name in self.fields])
        if self._needs_header:
            line = csv_line(self.fields) + line
        append_line(self.path, line)
        self._needs_header = False


def _add_placement_columns(path: Path, header: list[str], fields: Sequence[str]) -> list[str]:
    """`header` with the placement columns it lacks appended, and the file rewritten so (empty cells);
    any other difference is left for the caller to refuse."""
    missing = [name for name in fields if name not in header]
    if not missing or not set(missing) <= {*ADDED_FIELDS, *ADDED_BENCHMARK_COLUMNS} or not set(header) <= set(fields):
        return header
    with path.open(newline="") as handle:
        reader = validate.csv_rows(handle)
        try:
            rows = list(reader)
        except csv.Error as exc:
            raise validate.csv_error(path, reader.line_num, exc) from None
    text = csv_line([*header, *missing]) + "".join(csv_line(row + [None] * len(missing)) for row in rows[1:])
    write_whole(path, text)
    return [*header, *missing]


def _read_csv_header(path: Path) -> list[str] | None:
    if not path.exists() or path.stat().st_size == 0:
        return None
    with path.open(newline="") as handle:
        rows = validate.csv_rows(handle)
        try:
            return next(rows, None)
        except csv.Error as exc:
            raise validate.csv_error(path, rows.line_num, exc) from None


class JsonlWriter:
    """Appends one JSON object per line; refuses a file whose rows have other keys."""

    def __init__(self, path: Path, fields: Sequence[str] = ()):
        self.path = path
        first = _first_jsonl_keys(path)
        # rows written before the tool or the placement columns existed lack them; a JSON line names its keys
        if first is not None and fields and not set(fields) - {TOOL, *ADDED_FIELDS, *ADDED_BENCHMARK_COLUMNS} <= first:
            raise ResultFileError(
                f"{path} already holds results with different keys (another tool's, or an older schema); "
                "write to a new file"
            )

    def write(self, record: ResultRecord) -> None:
        append_line(self.path, json.dumps(record.to_json(), default=str, allow_nan=True) + "\n")


def _first_jsonl_keys(path: Path) -> set[str] | None:
    if not path.exists() or path.stat().st_size == 0:
        return None
    with path.open() as handle:
        return set(validate.jsonl_row(path, 1, handle.readline()))


class MarkdownWriter:
    """Re-renders the whole document after each row, atomically (temp file + rename); a
    failed write leaves the previous rendering and no temp file."""

    def __init__(self, path: Path, render: Callable[[Sequence[dict]], str], rows: Iterable[dict] = ()):
        self.path, self.render, self.rows = path, render, list(rows)

    def write(self, record: ResultRecord) -> None:
        self.rows.append(record.to_row())
        write_whole(self.path, self.render(self.rows))


class ResultSink:
    """Sends each finished record to every output file at once.

    `record_type` gives the CSV columns (`row_fields()`) and the Markdown view (`markdown(rows)`);
    `previous_rows` are rows already in the files (a resumed sweep), so the Markdown shows them.
    Each output is locked for the sink's life (`close()`, or at exit); a locked output is refused
    with the holder's pid (naming `wait_flag`, the tool's flag to wait, if it has one), or waited for with `wait_lock`. A last line cut by a killed writer is
    dropped (and said) before any row is appended to it.
    """

    def __init__(
        self,
        paths: Iterable[str | Path],
        record_type: type = BenchmarkRecord,
        previous_rows: Iterable[dict] = (),
        *,
        wait_lock: bool = False,
        wait_flag: str | None = None,
    ):
        fields, render = record_type.row_fields(), record_type.markdown
        self.record_type = record_type
        self.owner = os.getpid()
        self.paths = check_output_paths(paths)
        self.locks: list[OutputLock] = []
        self.writers: list = []
        # Rows each output already holds, by key: a resumed run writes a row only where it is missing.
        self.holds: dict[Path, set] = {}
        try:
            for path in self.paths:
                self.locks.append(OutputLock(path, wait_lock, wait_flag, appended=path.suffix != ".md"))
            for path in self.paths:
                if path.suffix == ".csv":
                    self._repair(path)
                    self.writers.append(CsvWriter(path, fields))
                elif path.suffix == ".jsonl":
                    self._repair(path)
                    self.writers.append(JsonlWriter(path, fields))
                else:
                    self.writers.append(MarkdownWriter(path, render, previous_rows))
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _repair(path: Path) -> None:
        done = repair_cut_line(path)
        if done:
            print(done, file=sys.stderr)

    def set_previous_rows(self, rows: Sequence[dict]) -> None:
        """Rows already written (a resumed run), shown again in every Markdown rendering."""
        for writer in self.writers:
            if isinstance(writer, MarkdownWriter):
                writer.rows = list(rows)

    def write(self, record: ResultRecord) -> None:
        if os.getpid() != self.owner:  # a process the user's code forked: the rows are its parent's to write
            return
        key = record.key() if self.holds else None
        for writer in self.writers:
            if key is not None and key in self.holds.get(writer.path, ()):
                continue
            writer.write(record)
        for lock, path in zip(self.locks, self.paths, strict=True):
            if path.suffix != ".md":
                lock.hold_file(path)

    def close(self) -> None:
        for lock in self.locks:
            lock.release()

    def __enter__(self) -> ResultSink:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
