"""What every command shares beyond its flags' types (argtypes): old and singular spellings of
a flag accepted but not advertised, and Ctrl-C as exit status 130 (SIGTERM 143).

argparse names an action by all its option strings in errors ("argument --head-dims/--head-dim:
..."); an alias added as its own hidden action keeps the error naming the one spelling we teach,
and the alias writes to the same destination.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from .argtypes import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_TERMINATED
from .lifetime import Terminated, check_interrupted, signals_interrupt


def add_argument_with_aliases(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, flag: str, *aliases: str, **kwargs
) -> argparse.Action:
    """`flag` as documented, then each alias hidden from --help with the same dest and type."""
    action = parser.add_argument(flag, **kwargs)
    hidden = {key: value for key, value in kwargs.items() if key not in ("help", "default", "metavar")}
    hidden.setdefault("dest", action.dest)
    for alias in aliases:
        parser.add_argument(alias, help=argparse.SUPPRESS, default=argparse.SUPPRESS, **hidden)
    return action


def run_command(prog: str, run: Callable[[], int]) -> int:
    """run()'s exit status; Ctrl-C is 130 and SIGTERM 143, after one line (the rows written so far
    stay written; children are ended by the cleanup the interrupt runs through)."""
    try:
        with signals_interrupt():
            status = run()
            check_interrupted()  # one Python swallowed (e.g. raised in an at-fork hook) still counts
            return status
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, Terminated)
        print(
            f"{prog}: {'terminated' if terminated else 'interrupted'}; the rows finished so far are in the outputs",
            file=sys.stderr,
        )
        return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
    except OSError as exc:
        from .results.errors import ResultWriteError  # pandas: only when a write failed

        if not isinstance(exc, ResultWriteError):
            raise
        print(f"{prog}: error: {exc.strerror}; the rows before it are in the outputs", file=sys.stderr)
        return EXIT_FAILED
