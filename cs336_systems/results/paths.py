"""Output paths checked before any work starts: suffix, filesystem limits, links, directories,
permissions, two names of one file. The lock and temp-file names beside an output are named here
so the check covers the files the writers will create."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from .errors import ResultFileError

OUTPUT_SUFFIXES = (".csv", ".md", ".jsonl")
LOCK_PREFIX, LOCK_SUFFIX, TEMP_SUFFIX = ".", ".lock", ".tmp"  # .NAME.lock beside NAME; NAME.tmp for Markdown


def lock_path(path: Path) -> Path:
    """The lock sidecar of an output: resolved through the directory only, never through itself."""
    return path.resolve().with_name(f"{LOCK_PREFIX}{path.name}{LOCK_SUFFIX}")


def _refuse(flag: str, raw: object, why: str) -> ResultFileError:
    return ResultFileError(f"{flag} {raw}: {why}")


def check_path_limits(path: Path, flag: str, raw: object) -> None:
    """The name and the path fit the filesystem's limits with the sidecar's extra characters (a file a
    tool writes at `path`, given as `raw` to `flag`), and holds no control character (a newline would end a
    line of a script or a comment that names it); ResultFileError otherwise."""
    if any(ord(c) < 32 or ord(c) == 127 for c in str(path)):
        raise _refuse(flag, repr(str(raw)), "a control character (a newline, a tab...) in a path: give one without")
    extra = len(LOCK_PREFIX) + len(LOCK_SUFFIX)
    name_max, path_max = 255, 4096  # POSIX's usual values, for a directory we cannot ask
    for parent in path.absolute().parents:  # the nearest directory that exists knows its filesystem's limits
        try:
            name_max, path_max = os.pathconf(parent, "PC_NAME_MAX"), os.pathconf(parent, "PC_PATH_MAX")
            break
        except OSError:
            continue
    if len(os.fsencode(str(path.absolute()))) + extra >= path_max:
        raise _refuse(
            flag,
            str(raw)[:60] + "...",
            f"path too long ({len(os.fsencode(str(path.absolute())))} bytes; at most {path_max - extra - 1} here)",
        )
    for part in path.absolute().parent.parts:
        if len(os.fsencode(part)) > name_max:
            raise _refuse(
                flag,
                str(raw)[:60] + "...",
                f"a directory name is too long ({len(os.fsencode(part))} bytes; at most {name_max})",
            )
    if len(os.fsencode(path.name)) + extra > name_max:
        raise _refuse(
            flag,
            str(raw)[:60] + "...",
            f"file name too long ({len(os.fsencode(path.name))} bytes; at most "
            f"{name_max - extra} here, leaving room for its lock file)",
        )


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "is a directory, give a file name"
    if stat.S_ISFIFO(mode):
        return "is a FIFO (named pipe), not a regular file: give a file name"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "is a device, not a regular file: give a file name"
    return "is not a regular file: give a file name"


def check_output_path(raw: str | Path, flag: str = "--output", suffixes: Sequence[str] | None = None) -> Path:
    """A path we can write, checked before any work starts. Refused: a trailing slash, an
    unknown suffix, a name or path past the filesystem's limits, a symbolic link (a planted
    link would make us write through it into another file), a directory, a FIFO or device,
    a parent that cannot be created, a directory we cannot write in (the lock file and the
    Markdown temp file live there), a lock file that is not a regular file. Creates missing parents."""
    if str(raw).endswith(("/", os.sep)):
        raise _refuse(flag, raw, "ends in '/': give a file name, not a directory")
    path = Path(raw)
    if suffixes is not None and path.suffix not in suffixes:
        raise _refuse(flag, raw, f"unknown suffix, use one of {', '.join(suffixes)}")
    check_path_limits(path, flag, raw)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise _refuse(flag, raw, f"cannot write there ({exc.strerror})") from None
    if mode is not None and stat.S_ISLNK(mode):
        raise _refuse(flag, raw, f"is a symbolic link (to {os.readlink(path)}); give the file itself or a new name")
    if mode is not None and not stat.S_ISREG(mode):
        raise _refuse(flag, raw, _kind(mode))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _refuse(flag, raw, f"cannot create its directory {path.parent} ({exc.strerror})") from None
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise _refuse(flag, raw, f"cannot write in its directory {path.parent} (its lock file goes there)")
    try:
        lock_mode = os.lstat(lock_path(path)).st_mode
    except FileNotFoundError:
        lock_mode = None
    if lock_mode is not None and not stat.S_ISREG(lock_mode):
        why = "a symbolic link" if stat.S_ISLNK(lock_mode) else "not a regular file"
        raise _refuse(flag, raw, f"its lock file {lock_path(path).name} is {why}; remove it")
    try:  # a new file probed beside it: one made and removed at its name could be another writer's first rows
        if mode is None:
            fd, probe = tempfile.mkstemp(dir=path.parent, prefix=".")
            os.close(fd)
            os.unlink(probe)
        else:
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK))
    except OSError as exc:
        raise _refuse(flag, raw, f"cannot write there ({exc.strerror})") from None
    return path


def same_file(a: Path, b: Path) -> bool:
    """Two spellings of one file: the same resolved path, or hard links to one inode."""
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_distinct(paths: Iterable[tuple[str, Path | None]]) -> None:
    """Outputs of different flags (--output, --monitor, --summary) must be different files:
    (flag, path) pairs, None paths skipped."""
    items = [(flag, path) for flag, path in paths if path is not None]
    for i, (flag, path) in enumerate(items):
        for other_flag, other in items[i + 1 :]:
            if same_file(path, other):
                raise ResultFileError(f"{flag} {path} and {other_flag} {other} are the same file; give two files")


def check_output_paths(paths: Iterable[str | Path], flag: str = "--output") -> list[Path]:
    """Every result output checked (suffix, writable); a path given twice is used once; two
    names of one file (hard links) are refused."""
    checked: dict[Path, Path] = {}
    for raw in paths:
        path = check_output_path(raw, flag, OUTPUT_SUFFIXES)
        for other in checked.values():
            if path.resolve() != other.resolve() and same_file(path, other):
                raise ResultFileError(f"{flag} {raw} and {flag} {other} are the same file (hard links); give two files")
        checked.setdefault(path.resolve(), path)
    return list(checked.values())
