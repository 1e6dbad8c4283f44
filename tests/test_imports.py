"""No import cycle inside cs336_systems: each helper module sits below what uses it."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "cs336_systems"


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, root: Path, modules: set[str]) -> set[str]:
    """The cs336_systems modules `path` imports anywhere (function-level imports count too),
    with the packages a submodule import runs (importing a.b.c runs a.b's __init__)."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    edges = set()
    for target in found:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        while target and target != "cs336_systems":
            if not name.startswith(target + ".") and target != name:  # not our own package
                edges.add(target)
            target = target.rpartition(".")[0]
    return edges


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    paths = sorted(root.rglob("*.py"))
    modules = {module_name(path, root) for path in paths}
    return {module_name(path, root): imported_modules(path, root, modules) for path in paths}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a list of modules (first == last), or None."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" after

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = "open"
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target, [*path, target])):
                return cycle
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node, [node])):
            return cycle
    return None


def test_find_cycle_on_hand_made_graphs():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"cli": {"runner"}, "runner": {"memory"}, "memory": {"cli"}}) == [
        "cli",
        "runner",
        "memory",
        "cli",
    ]
    assert find_cycle({"a": {"a"}}) == ["a", "a"]


def test_graph_reads_function_level_relative_and_package_imports(tmp_path):
    root = tmp_path / "cs336_systems"
    (root / "memory").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "cli.py").write_text("from cs336_systems.memory.estimate import x\n")
    (root / "memory" / "__init__.py").write_text("from .estimate import x\n")
    (root / "memory" / "estimate.py").write_text("def main():\n    from cs336_systems import cli\n")
    graph = import_graph(root)
    assert graph["cs336_systems.cli"] == {"cs336_systems.memory", "cs336_systems.memory.estimate"}
    assert graph["cs336_systems.memory"] == {"cs336_systems.memory.estimate"}
    assert graph["cs336_systems.memory.estimate"] == {"cs336_systems.cli"}
    assert find_cycle(graph) is not None


def test_cs336_systems_has_no_import_cycle():
    graph = import_graph()
    assert "cs336_systems.runner" in graph and graph["cs336_systems.runner"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_only_the_benchmark_commands_import_the_engine():
    # the step lives in step.py; the engine (runner.py) is for commands that run configurations
    importers = {name for name, targets in import_graph().items() if "cs336_systems.runner" in targets}
    assert importers == {"cs336_systems.benchmark", "cs336_systems.benchmark_direct"}


def test_the_package_imports_itself_relatively_and_starts_children_by_its_running_name():
    """The same files run as cs336_bench.* beside a student's cs336_systems (cs336_systems/tools.py):
    an absolute `cs336_systems` import or a hard-coded `-m cs336_systems.x` child would load theirs."""
    absolute, hard_coded = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] if node.level == 0 else []
            else:
                names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if any(name.split(".")[0] == "cs336_systems" for name in names):
                absolute.append(f"{path.name}:{node.lineno}")
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value.startswith("cs336_systems.")
            ):
                hard_coded.append(f"{path.name}:{node.lineno} {node.value!r}")
    assert not absolute, f"absolute imports (run python scripts/dev/relative_imports.py): {absolute}"
    assert not hard_coded, f"module names spelled out (use tools.module_name): {hard_coded}"


def test_the_relative_import_script_is_idempotent_on_the_tree():
    import subprocess
    import sys

    script = PACKAGE.parent / "scripts" / "dev" / "relative_imports.py"
    result = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
