"""JSON read from a file a user can touch (a --config, a done marker, a job's record, a result line):
json.loads, except that nesting too deep for the decoder's recursion is a json.JSONDecodeError like any
other damage, not a RecursionError traceback. torch-free and import-free."""

from __future__ import annotations

import json
import os
import stat


class UnreadableFile(ValueError):
    """A file that is no regular file, cannot be read, or is larger than allowed: why, in words."""


def read_text(path: str, max_bytes: int) -> str:
    """A regular file's text, at most `max_bytes` (never a FIFO's or a device's, whose read would not
    end); UnreadableFile otherwise."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise UnreadableFile("not a regular file")
        with open(path, "rb") as handle:
            data = handle.read(max_bytes + 1)
    except OSError as exc:
        raise UnreadableFile(f"cannot read it ({exc.strerror})") from None
    if len(data) > max_bytes:
        raise UnreadableFile(f"larger than {max_bytes} bytes")
    return data.decode(errors="replace")


def loads(text: str | bytes) -> object:
    try:
        return json.loads(text)
    except RecursionError:  # json decodes arrays and objects by recursion: thousands deep ends it
        raise json.JSONDecodeError("nested too deep", text if isinstance(text, str) else "", 0) from None
