"""Text for any terminal: where the locale cannot show a character (LANG=C cannot show ±),
print an ASCII spelling of it instead of dying in a UnicodeEncodeError.

torch-free; argtypes.ArgumentParser installs it, so every command gets it.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import sys
import unicodedata

ERRORS = "cs336_ascii_fallback"
ASCII = {
    "±": "+/-",
    "×": "x",
    "µ": "u",
    "–": "-",
    "—": "--",
    "≥": ">=",
    "≤": "<=",
    "→": "->",
    "…": "...",
    "†": "+",
    "‡": "++",
    "≈": "~",
    "‘": "'",
    "’": "'",
    "“": '"',
    "”": '"',
    "·": ".",
}


def ascii_spelling(text: str) -> str:
    """Each character as ASCII: a known spelling, its decomposition's ASCII part, or '?'."""
    out = []
    for char in text:
        if char.isascii():
            out.append(char)
        elif char in ASCII:
            out.append(ASCII[char])
        else:
            plain = unicodedata.normalize("NFKD", char).encode("ascii", "ignore").decode()
            out.append(plain or "?")
    return "".join(out)


def _fallback(exc: UnicodeError) -> tuple[str, int]:
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    return ascii_spelling(exc.object[exc.start : exc.end]), exc.end


codecs.register_error(ERRORS, _fallback)


def ascii_locale(environ=os.environ) -> bool:
    """LANG=C or POSIX named by the user: Python then writes UTF-8 anyway (PEP 538/540), which
    such a terminal shows as mojibake; an explicit PYTHONIOENCODING or PYTHONUTF8 wins."""
    if environ.get("PYTHONIOENCODING") or environ.get("PYTHONUTF8"):
        return False
    ctype = environ.get("LC_CTYPE")
    if ctype == "C.UTF-8" and environ.get("LANG") in ("C", "POSIX"):
        ctype = None  # set by Python's own C-locale coercion, not by the user
    name = environ.get("LC_ALL") or ctype or environ.get("LANG") or ""
    return name in ("C", "POSIX")


def install() -> None:
    """stdout and stderr spell in ASCII what their encoding or locale cannot show (idempotent)."""
    for stream, original in ((sys.stdout, sys.__stdout__), (sys.stderr, sys.__stderr__)):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is None or getattr(stream, "errors", None) == ERRORS:
            continue
        with contextlib.suppress(ValueError, OSError):  # a closed or exotic stream: leave it
            if stream is original and ascii_locale():
                reconfigure(encoding="ascii", errors=ERRORS)
            elif stream.errors == "strict":
                reconfigure(errors=ERRORS)


def show(text: str, file=None) -> None:
    """print(), where the stream may be gone: the user's code closed it, or the shell started us with it
    closed, or the reader of a pipe left. The results are already written; losing the echo is not a failure."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        print(text, file=file if file is not None else sys.stdout, flush=True)
