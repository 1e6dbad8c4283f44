"""Byte sizes as people write them: '16GiB', '512MB', '1.5G', '4096'; counts as people say them: '1 thread'."""

from __future__ import annotations

import re

MIB, GIB = 2**20, 2**30  # bytes, for the tables and notes that show MiB and GiB

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-z]*)\s*$")


def counted(count: int | str, noun: str) -> str:
    """'1 thread', '2 threads', "the job's threads" (a noun whose plural takes an s)."""
    return f"{count} {noun}{'s' * (count != 1)}"


def parse_bytes(text: str) -> int:
    """'16GiB' -> 17179869184. KB/MB/GB are powers of 10, KiB/MiB/GiB (and K/M/G) powers of 2."""
    match = _PATTERN.match(str(text).lower())
    if not match or match.group(2) not in _UNITS:
        raise ValueError(f"not a size: {text!r} (examples: 16GiB, 512MB, 4096)")
    value = float(match.group(1)) * _UNITS[match.group(2)]
    if value <= 0:
        raise ValueError(f"size must be positive, got {text!r}")
    if value < 1:  # would round to 0 bytes: a limit of nothing
        raise ValueError(f"size must be at least one byte, got {text!r}")
    return int(value)


def format_bytes(value: float | None) -> str:
    """Binary units for memory: 1536 -> '1.50 KiB'."""
    if value is None:
        return ""
    sign, value = ("-" if value < 0 else ""), abs(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{sign}{value:.0f} {unit}" if unit == "B" else f"{sign}{value:.2f} {unit}"
        value /= 1024
    return f"{sign}{value:.2f} TiB"
