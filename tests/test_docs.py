"""The README's test command is what CI runs, and the manual's flag tables come from the parsers."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _flag_tables():
    spec = importlib.util.spec_from_file_location("flag_tables", ROOT / "scripts" / "dev" / "flag_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    command = next(line for line in readme.splitlines() if line.startswith("pip install") and "pytest" in line)
    # and a failure anywhere in that && list fails CI (set -e alone lets the script go on)
    assert f"python -m {command} || exit 1" in (ROOT / ".ci" / "run").read_text().splitlines()


def test_every_advertised_flag_of_a_tool_is_in_its_table():
    tables = _flag_tables()
    table = tables.flag_table("cs336_systems.benchmark")
    parser = tables.tool_parser("cs336_systems.benchmark")
    advertised = [a.option_strings[0] for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS]
    assert "--model-size" in advertised and "--output" in advertised
    for flag in advertised:
        if flag != "-h":
            assert f"`{flag}" in table, flag


def test_a_flag_added_to_a_tool_appears_without_touching_the_docs(tmp_path, monkeypatch):
    tool = tmp_path / "toy_tool.py"
    tool.write_text(
        "import argparse\n"
        "def build_parser():\n"
        "    parser = argparse.ArgumentParser(prog='toy')\n"
        "    parser.add_argument('--brand-new', type=int, default=3, help='a new flag')\n"
        "    parser.add_argument('--old', help=argparse.SUPPRESS)\n"
        "    parser.add_argument('--seed', type=int, default=0)\n"
        "    return parser\n"
        "def run(args):\n"
        "    raise SystemExit('must not run')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("toy_tool", None)
    table = _flag_tables().flag_table("toy_tool")
    assert "| `--brand-new BRAND_NEW` | `3` | a new flag |" in table
    assert "--old" not in table
    assert "| `--seed SEED` | `0` |  |" in table  # a default of 0 is a default


def test_every_page_marker_names_a_tool_that_builds():
    tables = _flag_tables()
    names = {m for page in (ROOT / "docs").glob("*.md") for m in tables.MARKER.findall(page.read_text())}
    assert "cs336_systems.benchmark" in names
    for name in sorted(names):
        assert tables.flag_table(name).count("\n") >= 2, name
