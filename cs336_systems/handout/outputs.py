"""What `handout` may write and remove in OUTPUT_DIR: only files it wrote itself, never through a link,
one handout per directory at a time.

- A ledger, OUTPUT_DIR/.handout/written, names each file before handout (or a step it runs) first writes
  it; a file of a step's outputs is removed or replaced only when the ledger names it. A directory
  that holds such a file which handout did not write is refused before any step runs. A directory an
  older handout wrote (a .handout/ and no ledger) gets a ledger of what its done markers recorded as
  their own (their outputs, logs and themselves, and a handout plan): never every name of the run.
- Links: the directory's .handout/ and logs/ must be real directories, and nothing handout writes may
  be a symbolic link (its own files are opened without following one: results.files).
- A lock (results.files.OutputLock on the plan file): a second handout on the same directory is refused
  in one line while the first runs.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

from ..errors import UsageError
from ..results import ResultFileError, ResultWriteError
from ..results.files import OutputLock
from ..results.paths import check_path_limits
from ..results.writing import append_line

MARKERS = ".handout"
LOGS = "logs"
LEDGER = "written"


class OutputDirError(UsageError):
    """--output-dir cannot be used as it is (one line)."""


def ledger_path(output_dir: Path) -> Path:
    return output_dir / MARKERS / LEDGER


def written(output_dir: Path) -> set[str]:
    """The names (relative to `output_dir`) handout wrote there, by the ledger."""
    try:
        return set(ledger_path(output_dir).read_text().split("\n")) - {""}
    except FileNotFoundError:
        return set()
    except (OSError, UnicodeDecodeError) as exc:
        raise OutputDirError(f"--output-dir {output_dir}: cannot read its ledger {MARKERS}/{LEDGER} ({exc})") from None


def claim(output_dir: Path, names: Iterable[str]) -> None:
    """Name `names` in the ledger before they are first written (a kill between the two leaves a claim
    on a file that does not exist: harmless)."""
    new = [name for name in dict.fromkeys(names) if name not in written(output_dir)]
    if new:
        try:
            append_line(ledger_path(output_dir), "".join(f"{name}\n" for name in new), inject=False)
        except ResultWriteError as exc:
            raise OutputDirError(f"--output-dir {output_dir}: {exc.strerror}") from None


def check_output_dir(output_dir: Path, names: Iterable[str], legacy: Callable[[], Iterable[str]] = tuple) -> None:
    """Before any step runs: `output_dir` made and writable, its .handout/ and logs/ real directories,
    and none of `names` (what this run will write) a link or a file handout did not write. A directory
    an older handout wrote (a .handout/ and no ledger) counts as written only what `legacy()` says its
    markers recorded (run.recorded_by_markers), read once the names are known to be regular files."""
    refuse_file(output_dir)
    for name in names:  # the directory's name and the longest of its files fit the filesystem's limits
        check_path_limits(output_dir / name, "--output-dir", output_dir)
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputDirError(f"--output-dir {output_dir}: cannot create it ({exc.strerror})") from None
    if not os.access(output_dir, os.W_OK | os.X_OK):
        raise OutputDirError(f"--output-dir {output_dir}: cannot write in it")
    for directory in (MARKERS, LOGS):
        _present(output_dir, directory, directory=True)
        try:
            (output_dir / directory).mkdir(exist_ok=True)
        except OSError as exc:
            raise OutputDirError(f"--output-dir {output_dir}: cannot create {directory}/ ({exc.strerror})") from None
    _present(output_dir, f"{MARKERS}/{LEDGER}")  # the ledger is read and appended to: never through a link
    present = [name for name in dict.fromkeys(names) if _present(output_dir, name)]
    if not ledger_path(output_dir).exists() and any((output_dir / MARKERS).iterdir()):
        claim(output_dir, legacy())  # written by a handout from before the ledger
    ours = written(output_dir)
    for name in present:
        if name not in ours:
            raise OutputDirError(
                f"--output-dir {output_dir}: {name} is there and handout did not write it; move it, or choose "
                "another --output-dir"
            )


def refuse_file(output_dir: Path) -> None:
    """--output-dir names a directory (or nothing yet), and a name the filesystem can hold."""
    check_path_limits(output_dir / "x", "--output-dir", output_dir)
    try:
        if output_dir.exists() and not output_dir.is_dir():
            raise OutputDirError(f"--output-dir {output_dir} is a file")
    except OSError as exc:
        raise OutputDirError(f"--output-dir {output_dir}: cannot look at it ({exc.strerror})") from None


def _present(output_dir: Path, name: str, directory: bool = False) -> bool:
    """Whether `name` is there, a regular file (`directory`: a directory); a link or anything else is refused."""
    try:
        mode = os.lstat(output_dir / name).st_mode
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise OutputDirError(f"--output-dir {output_dir}: cannot look at {name} ({exc.strerror})") from None
    if stat.S_ISLNK(mode):
        raise OutputDirError(
            f"--output-dir {output_dir}: {name} is a symbolic link; handout writes nothing through one: remove it"
        )
    if (stat.S_ISDIR if directory else stat.S_ISREG)(mode):
        return True
    why = "a file where handout keeps a directory" if directory else "not a regular file; remove it"
    raise OutputDirError(f"--output-dir {output_dir}: {name} is {why}")


def lock(output_dir: Path, plan_file: str) -> OutputLock:
    """This handout's hold on `output_dir` (released at exit); a second one is refused in one line."""
    try:
        return OutputLock(output_dir / plan_file)
    except ResultFileError as exc:
        raise OutputDirError(f"--output-dir {output_dir}: another handout runs there ({exc})") from None
