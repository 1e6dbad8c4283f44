"""What identifies a configuration in a result row: the columns marked as identity, one
spelling per value, and the one key function resume and compare match rows on.

A key must come out the same from a record, a CSV file and a JSONL file: CSV has no types
(True, 1.0 and 1 are text), pandas reads an empty cell and "n/a" as NaN, JSONL keeps "n/a".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import field

import pandas as pd

# What pandas reads back as NaN that a record may hold as a value: a --model-factory row's attention.
NA_STRINGS = ("n/a",)


def identity_field(**kwargs):
    """A column that identifies the configuration (compared by `Record.key()`)."""
    return field(metadata={"identity": True}, **kwargs)


def identity_value(value: object) -> str:
    """One spelling per value whether it came from a record, a CSV or a JSONL file."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA or value in NA_STRINGS:
        return ""
    if isinstance(value, bool) or str(value) in ("True", "False", "true", "false"):
        return str(value).lower()
    try:
        return repr(float(value))
    except (TypeError, ValueError):
        return str(value)


def row_key(row: Mapping[str, object], names: Iterable[str]) -> tuple[str, ...]:
    """The identity of the configuration `row` holds: its `names` columns, each spelled once."""
    return tuple(identity_value(row.get(name)) for name in names)
