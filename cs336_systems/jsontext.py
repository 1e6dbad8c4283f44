"""JSON read from a file a user can touch (a --config, a done marker, a job's record, a result line):
json.loads, except that nesting too deep for the decoder's recursion is a json.JSONDecodeError like any
other damage, not a RecursionError traceback. torch-free and import-free."""

from __future__ import annotations

import json


def loads(text: str | bytes) -> object:
    try:
        return json.loads(text)
    except RecursionError:  # json decodes arrays and objects by recursion: thousands deep ends it
        raise json.JSONDecodeError("nested too deep", text if isinstance(text, str) else "", 0) from None
