"""Rewrite absolute `cs336_systems` imports inside the package as relative ones.

    python scripts/dev/relative_imports.py            # rewrite in place, then sort the imports with ruff
    python scripts/dev/relative_imports.py --check    # list what would change; exit 1 if anything would

Why: the same files are also importable as `cs336_bench.*` (the `cs336-bench` command), so that a
student's own package named `cs336_systems` can be loaded beside ours. An absolute
`from cs336_systems.x import y` inside our package would load the student's module, or a second copy
of ours. Only files under cs336_systems/ are touched; tests/ and scripts/ keep absolute names.
Idempotent: a second run changes nothing. Docstrings and comments are left alone (only real import
statements, found with ast, are rewritten).
"""

from __future__ import annotations

import argparse
import ast
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOP = "cs336_systems"
PACKAGE = ROOT / TOP


def package_of(path: Path) -> list[str]:
    """The package a module's relative imports are anchored to, as name parts."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return parts[:-1]  # a/b/c.py -> [a, b]; a/b/__init__.py -> [a, b]


def relative(anchor: list[str], target: list[str]) -> tuple[str, str | None]:
    """(`from` part, last name for `import X` forms) of `target` seen from package `anchor`."""
    common = 0
    while common < min(len(anchor), len(target)) and anchor[common] == target[common]:
        common += 1
    dots = "." * (len(anchor) - common + 1)
    return dots + ".".join(target[common:]), None


def rewrite_line(line: str, node: ast.stmt, anchor: list[str]) -> str | None:
    """The statement's first line rewritten, or None when it is not ours to touch."""
    start = node.col_offset
    head = line[start:]
    if (
        isinstance(node, ast.ImportFrom)
        and node.level == 0
        and node.module
        and (node.module == TOP or node.module.startswith(TOP + "."))
    ):
        prefix = f"from {node.module} "
        if not head.startswith(prefix):
            return None
        source, _ = relative(anchor, node.module.split("."))
        return line[:start] + f"from {source} " + head[len(prefix) :]
    if isinstance(node, ast.Import) and len(node.names) == 1:
        alias = node.names[0]
        parts = alias.name.split(".")
        if parts[0] != TOP or len(parts) < 2:
            return None
        prefix = f"import {alias.name}"
        if not head.startswith(prefix):
            return None
        rest = head[len(prefix) :]
        source, _ = relative(anchor, parts[:-1])
        # `import cs336_systems.a.b` binds `cs336_systems`; every use inside our package is a bare
        # import for its side effect, so binding `b` instead is equivalent.
        return line[:start] + f"from {source} import {parts[-1]}" + rest
    return None


def convert(path: Path) -> str | None:
    """The new text of `path`, or None when nothing changes."""
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    anchor = package_of(path)
    changed = False
    for node in ast.walk(ast.parse(text, str(path))):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        index = node.lineno - 1
        new = rewrite_line(lines[index], node, anchor)
        if new is not None and new != lines[index]:
            lines[index] = new
            changed = True
    return "".join(lines) if changed else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file would change")
    args = parser.parse_args()
    changed = []
    for path in sorted(PACKAGE.rglob("*.py")):
        new = convert(path)
        if new is None:
            continue
        changed.append(path)
        if not args.check:
            path.write_text(new)
    for path in changed:
        print(path.relative_to(ROOT))
    if args.check:
        return 1 if changed else 0
    ruff = shutil.which("ruff")
    if changed and ruff:  # relative imports sort in a section of their own
        subprocess.run([ruff, "check", "--quiet", "--select", "I", "--fix", *map(str, changed)], check=False)
    print(f"{len(changed)} files rewritten", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
