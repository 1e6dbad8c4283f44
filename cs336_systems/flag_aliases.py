"""Old and singular spellings of a flag, accepted but not advertised.

argparse names an action by all its option strings in errors ("argument --head-dims/--head-dim:
..."); an alias added as its own hidden action keeps the error naming the one spelling we teach,
and the alias writes to the same destination.
"""

from __future__ import annotations

import argparse


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
