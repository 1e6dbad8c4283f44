"""Flag tables for the docs site, made from the tools' own argparse parsers (MkDocs hook).

A page writes `<!-- flags: cs336_systems.benchmark -->` on a line of its own; the hook replaces
it with one row per advertised flag (hidden aliases left out): spelling, default, help text. The
parser is the tool's own `build_parser()` (a tool package's is in its cli module), so a flag added
to a tool appears on the next `mkdocs build`.

`python scripts/dev/flag_tables.py cs336_systems.benchmark` prints one table.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- flags: ([\w.]+) -->$", re.MULTILINE)


def tool_parser(module_name: str) -> argparse.ArgumentParser:
    """The parser of the tool `module_name` (cs336_systems.TOOL): its build_parser(), or its cli's."""
    module = importlib.import_module(module_name)
    if not hasattr(module, "build_parser"):  # a tool package: its command is its cli module
        module = importlib.import_module(f"{module_name}.cli")
    return module.build_parser()


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _flag(action: argparse.Action) -> str:
    spelling = action.option_strings[0] if action.option_strings else action.dest.upper()
    if action.nargs == 0:
        return f"`{spelling}`"
    metavar = action.metavar or (f"{{{','.join(map(str, action.choices))}}}" if action.choices else action.dest.upper())
    if isinstance(metavar, tuple):
        metavar = " ".join(metavar)
    many = " ..." if action.nargs in ("+", "*") else ""
    text = f"{spelling} {metavar}{many}" if action.option_strings else f"{metavar}{many}"
    return f"`{_cell(text)}`"


def flag_table(module_name: str) -> str:
    """A Markdown table of the tool's advertised flags, in --help's order."""
    parser = tool_parser(module_name)
    rows = ["| flag | default | meaning |", "|---|---|---|"]
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
            continue
        default = action.default
        if isinstance(default, (list, tuple)):
            default = " ".join(map(str, default))
        hidden = default is None or default is False or default == "" or default is argparse.SUPPRESS  # 0 is shown
        shown = "" if hidden or action.nargs == 0 else f"`{_cell(default)}`"
        help_text = (action.help or "") % {"default": default, "prog": parser.prog} if action.help else ""
        if action.choices and action.nargs != 0:
            help_text = f"{help_text} (one of: {', '.join(map(str, action.choices))})".strip()
        if action.required:
            help_text = f"required. {help_text}"
        rows.append(f"| {_flag(action)} | {shown} | {_cell(help_text)} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, **_) -> str:
    """MkDocs hook: every marker replaced by its tool's table."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # this checkout's package, not another install of it
    return MARKER.sub(lambda match: flag_table(match.group(1)), markdown)


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print(flag_table(name))
