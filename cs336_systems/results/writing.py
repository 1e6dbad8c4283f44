"""How a result file is written: a row appended as one `write` of a whole line (truncated back on a
failure, so a file never holds half a row), a whole file replaced atomically (a temp file beside it,
then a rename: the one writer of whole files, every tool's), the record of what a tool made (MADE), and
the fault hooks the tests inject.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import hashlib
import io
import math
import os
import signal
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path

from . import validate
from .errors import ResultWriteError
from .paths import TEMP_SUFFIX

# Tests inject faults through this variable: "enospc@N" makes the Nth row write fail half
# written with ENOSPC; "kill@N" SIGKILLs the process right after the Nth row write; "full" makes
# every write fail with ENOSPC, "full:.png,.tex" only those of files with these suffixes (a disk that
# fills up with the larger files).
FAULT_ENV = "CS336_SYSTEMS_FAULT"


_row_writes = 0


def _full_disk(path: Path) -> None:
    """The test fault hook's full disk (FAULT_ENV "full[:SUFFIX,...]"): ENOSPC for the writes it names."""
    kind, _, suffixes = os.environ.get(FAULT_ENV, "").partition(":")
    if kind == "full" and (not suffixes or path.suffix in suffixes.split(",")):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _fault(data: bytes, fd: int) -> None:
    """The test fault hook (FAULT_ENV); does nothing unless the variable is set."""
    global _row_writes
    fault = os.environ.get(FAULT_ENV)
    if not fault or fault.startswith("full"):
        return
    _row_writes += 1
    kind, _, count = fault.partition("@")
    if int(count or 1) != _row_writes:
        return
    if kind == "enospc":
        os.write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _after_write() -> None:
    fault = os.environ.get(FAULT_ENV, "")
    if fault.startswith("kill@") and int(fault.partition("@")[2]) == _row_writes:
        os.kill(os.getpid(), signal.SIGKILL)


def append_line(path: Path, line: str, *, inject: bool = True) -> None:
    """Append `line` (ending in a newline) in one write; on failure truncate the file back to
    where it was, so it never holds half a row, and raise ResultWriteError naming the file.
    `inject=False`: not a result row, so FAULT_ENV does not count it (the monitor's samples)."""
    data = line.encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise ResultWriteError(exc.errno, f"{path}: could not open to write a row ({exc.strerror})") from exc
    try:
        size = os.fstat(fd).st_size
        try:
            _full_disk(path)
            if inject:
                _fault(data, fd)
            written = os.write(fd, data)
            if written != len(data):
                raise OSError(errno.ENOSPC, f"short write ({written} of {len(data)} bytes)")
        except OSError as exc:
            os.ftruncate(fd, size)
            raise ResultWriteError(
                exc.errno, f"{path}: could not write a row ({exc.strerror}); the partial row was removed"
            ) from exc
    finally:
        os.close(fd)
    if inject:
        _after_write()


def repair_cut_line(path: Path) -> str | None:
    """A last line with no newline: kept (its newline added) when it is a whole row, dropped
    when a writer was stopped mid-row. Returns what was done, for the user, or None."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    with path.open("rb+") as handle:
        data = handle.read()
        if data.endswith(b"\n"):
            return None
        start = data.rfind(b"\n") + 1
        first, last = data.split(b"\n", 1)[0].decode(errors="replace"), data[start:].decode(errors="replace")
        line = data.count(b"\n") + 1
        if validate.whole_last_line(path.suffix, first, last):
            handle.write(b"\n")
            return f"{path}:{line}: the last row lacked its newline; kept it and added the newline"
        handle.truncate(start)
    return f"{path}:{line}: dropped a cut last line (a writer stopped mid-row); that row is not in the file"


def csv_line(values: Sequence[object]) -> str:
    """One CSV line as pandas writes it: empty for None/NaN, QUOTE_MINIMAL; a cell longer than the csv
    module reads by default (a long traceback) cut to validate.FIELD_CHARS, saying so."""
    buffer = io.StringIO()
    cells = [_cell(value) for value in values]
    csv.writer(buffer, lineterminator="\n").writerow(cells)
    return buffer.getvalue()


def _cell(value: object) -> object:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    text = value if isinstance(value, str) else None
    if text is None and not isinstance(value, int | float | bool):
        text = str(value)  # as csv writes it (a list of samples, a dict)
    if text is None or len(text) <= validate.FIELD_CHARS:
        return value
    cut = f" [cut: {len(text):,} characters]"
    return text[: validate.FIELD_CHARS - len(cut)] + cut


def open_to_write(path: Path):
    """`path` opened to write from its start, as a text file: never through a link planted at its name,
    never a FIFO or a device (whose open or write would not end). ResultWriteError naming it otherwise."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as exc:
        why = "it is a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
        raise ResultWriteError(exc.errno, f"{path}: cannot write it ({why})") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ResultWriteError(errno.EINVAL, f"{path}: cannot write it (not a regular file)")
    os.set_blocking(fd, True)
    os.ftruncate(fd, 0)
    return os.fdopen(fd, "w")


def write_whole(path: Path, text: str | bytes, *, unique: bool = False) -> None:
    """Replace `path` with `text` atomically: a temp file beside it (created fresh, never
    through a link planted at its name), then a rename. A failure (a full disk) leaves the
    previous file and no temp file, and raises ResultWriteError naming the file. `unique`: a
    temp name of this writer's own, for a file that writers outside the output locks share."""
    data = text.encode() if isinstance(text, str) else text
    temporary = None
    try:
        if unique:
            fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
            temporary = Path(name)
        else:
            temporary = path.with_name(path.name + TEMP_SUFFIX)
            temporary.unlink(missing_ok=True)  # a stale one, or a planted link (unlink never follows)
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            _full_disk(path)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        if unique:
            os.chmod(temporary, 0o644)  # mkstemp's 0o600 would hide the file from its other users
        os.replace(temporary, path)
    except OSError as exc:
        if temporary is not None:
            with contextlib.suppress(OSError):
                temporary.unlink(missing_ok=True)
        kept = "kept as it was" if path.exists() else "not written"
        raise ResultWriteError(exc.errno, f"{path}: could not write ({exc.strerror}); {kept}") from exc


# -- what a tool made: a file's sha256 when the tool finished it, so "changed since" is decidable --------

MADE = ".cs336-bench.sha256"  # beside the files: 'SHA256  NAME' lines (sha256sum's), the last one per name counts


def file_sha256(path: Path) -> str | None:
    """The file's sha256 (None: it cannot be read)."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def made_sums(directory: Path) -> dict[str, str]:
    """What each file a tool made in `directory` held when it was made (its sha256, by name)."""
    try:
        lines = (directory / MADE).read_text(errors="replace").splitlines()
    except OSError:
        return {}
    return {name: digest for digest, _, name in (line.partition("  ") for line in lines) if name}


def record_made(path: Path) -> None:
    """`path` holds what its tool made, as it is now (its sha256 in MADE beside it, never written through a link)."""
    append_line(path.parent / MADE, f"{file_sha256(path)}  {path.name}\n", inject=False)


def place_of(path: Path) -> Path:
    """Where a document meant for `path` is written: there, unless a file is there that is not as a tool of
    this project made it (the user's own, or edited since); then beside it, NAME.new.SUFFIX (new2, ...)."""
    for place in (path, *(path.with_name(f"{path.stem}.new{n if n > 1 else ''}{path.suffix}") for n in range(1, 100))):
        if not place.exists() or made_sums(place.parent).get(place.name) == file_sha256(place):
            return place
    raise ResultWriteError(errno.EEXIST, f"{path}: 99 edited copies beside it (NAME.new*.SUFFIX); move them away")
