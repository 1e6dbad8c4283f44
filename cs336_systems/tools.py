"""The tools of this package, found on disk, and `cs336-bench TOOL ARGS` (= python -m PACKAGE.TOOL ARGS).

A tool is a module that declares `main = Command(build_parser, run)` (command.py) or a subpackage
with `__main__.py`, and such a module inside a tool's subpackage (`memory.timeline`); its one-line
description is its docstring's first line. Nothing is imported to list them, and every tool is listed
(a module run only by the tools themselves, memory_cap, is no Command, so no tool).

The same files are importable under two top-level names: `cs336_systems` (python -m
cs336_systems.TOOL) and `cs336_bench` (the `cs336-bench` command), whose `__path__` is this
directory. Under `cs336_bench` a student's own package called `cs336_systems` can be imported
beside ours, which is why every import inside the package is relative and every child process
is started under `top_package()`.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import importlib
import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
COMMAND = "cs336-bench"
# Libraries of ours a file in a student's repository root (first on the path: python -m, main below,
# --adapters) could be named like, a tabulate.py of their own: imported first, that root off the path.
SHADOWED_BY_NAME = ("tabulate",)


def import_ours_first() -> None:
    saved, here = list(sys.path), Path.cwd().resolve()
    sys.path[:] = [entry for entry in saved if Path(entry or ".").resolve() != here]
    try:
        for name in SHADOWED_BY_NAME:
            with contextlib.suppress(ImportError):
                importlib.import_module(name)
    finally:
        sys.path[:] = saved


def top_package() -> str:
    """The name this copy of the package was imported under ('cs336_systems' or 'cs336_bench')."""
    return __name__.partition(".")[0]


def prog(tool: str) -> str:
    """How the user ran `tool`, for its usage line and errors: `cs336-bench TOOL` under the console
    command, `python -m cs336_systems.TOOL` otherwise."""
    return f"{COMMAND} {tool}" if top_package() == "cs336_bench" else f"python -m cs336_systems.{tool}"


def module_name(tool: str) -> str:
    """The importable name of `tool` (e.g. 'benchmark') in this copy of the package."""
    return f"{top_package()}.{tool}"


def _description(tree: ast.Module) -> str:
    docstring = (ast.get_docstring(tree) or "").strip()
    first = docstring.splitlines()[0] if docstring else ""
    head, sep, rest = first.partition(": ")
    text = rest.strip() if sep and head.startswith("python -m ") else first
    return text[:-1] + "..." if text.endswith(",") else text


def _declares_command(tree: ast.Module) -> bool:
    """`main = Command(...)` at the top level of the module."""
    return any(
        isinstance(node, ast.Assign)
        and any(isinstance(target, ast.Name) and target.id == "main" for target in node.targets)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id == "Command"
        for node in tree.body
    )


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def discover(root: Path = HERE) -> dict[str, str]:
    """{tool name: one-line description} for every tool in `root`, sorted by name."""
    found = {}
    for path in sorted(root.iterdir()):
        if path.name.startswith("_"):
            continue
        if path.is_dir() and (path / "__main__.py").is_file():
            init = path / "__init__.py"
            found[path.name] = _description(_parse(init)) if init.is_file() else ""
            found |= {f"{path.name}.{name}": text for name, text in discover(path).items() if name != "cli"}
        elif path.suffix == ".py" and _declares_command(tree := _parse(path)):
            found[path.stem] = _description(tree)
    return found


def usage(tools: dict[str, str]) -> str:
    width = max(map(len, tools), default=0)
    lines = [
        f"usage: {COMMAND} TOOL [ARGS...]   (the same as python -m cs336_systems.TOOL ARGS)",
        "",
        "Runs this project's tool whatever the current directory holds: a student's own package named",
        "cs336_systems (--adapters, --optimizer, --model-factory) is imported beside ours, not instead.",
        f"`{COMMAND} TOOL --help` for a tool's flags.",
        "",
        "tools:",
        *(f"  {name:<{width}}  {text}" for name, text in tools.items()),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    tools = discover()
    if argv and argv[0] in ("-h", "--help"):
        print(usage(tools))
        return 0
    if not argv:  # bad input: one line, exit 2
        print(f"{COMMAND}: error: name a tool, one of: {', '.join(tools)} (`{COMMAND} --help`)", file=sys.stderr)
        return 2
    tool, *args = argv
    if tool not in tools:
        guess = difflib.get_close_matches(tool, tools, n=1)
        hint = f"did you mean {guess[0]!r}? " if guess else ""
        print(f"{COMMAND}: error: unknown tool {tool!r}; {hint}one of: {', '.join(tools)}", file=sys.stderr)
        return 2
    # As `python -m` does: the current directory comes first, so the student's packages are theirs.
    if "" not in sys.path and str(Path.cwd()) not in sys.path[:1]:
        sys.path.insert(0, str(Path.cwd()))
    sys.argv = [f"{COMMAND} {tool}", *args]
    try:
        runpy.run_module(module_name(tool), run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0
