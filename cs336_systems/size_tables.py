"""The CS336 assignment 2 tables of named model sizes, one per handout edition, and the one rule
that picks a table when the user does not name one (`--size-table auto`, every tool's default).

The 2026 edition keeps small..large, makes xl the old 2.7B (d_model 2560) and adds 10B, so a name
alone can mean two models. The rule, in order:
  1. the edition of the student's repository: the adapters module given with --adapters, else
     tests/adapters.py under the current directory, read by the names it defines (never imported);
  2. a size name that only one table has (2.7B: 2025; 10B: 2026);
  3. the newest edition.
Nothing here imports torch: the handout planner and the report use it too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .editions import edition_of_file

_SMALL_TO_LARGE = {
    "small": dict(d_model=768, d_ff=3072, num_layers=12, num_heads=12),
    "medium": dict(d_model=1024, d_ff=4096, num_layers=24, num_heads=16),
    "large": dict(d_model=1280, d_ff=5120, num_layers=36, num_heads=20),
}
SIZE_TABLES: dict[str, dict[str, dict[str, int]]] = {
    "2025": {
        **_SMALL_TO_LARGE,
        "xl": dict(d_model=1600, d_ff=6400, num_layers=48, num_heads=25),
        "2.7B": dict(d_model=2560, d_ff=10240, num_layers=32, num_heads=32),
    },
    "2026": {
        **_SMALL_TO_LARGE,
        "xl": dict(d_model=2560, d_ff=10240, num_layers=32, num_heads=32),
        "10B": dict(d_model=4608, d_ff=12288, num_layers=50, num_heads=36),
    },
}
NEWEST_SIZE_TABLE = "2026"
AUTO = "auto"
SIZE_TABLE_CHOICES = (AUTO, *SIZE_TABLES)
STUDENT_ADAPTERS = Path("tests") / "adapters.py"  # where the official repository keeps them


@dataclass(frozen=True)
class SizeTableChoice:
    edition: str  # a key of SIZE_TABLES
    why: str  # how it was chosen, in words: "from tests/adapters.py", "--size-table 2025", ...

    def line(self) -> str:
        """The first line a tool prints: which table its size names mean."""
        return f"size table {self.edition} ({self.why})"


def tables_with(name: str) -> list[str]:
    """The editions whose table has a size called `name` (any case)."""
    return [edition for edition, table in SIZE_TABLES.items() if name.lower() in {key.lower() for key in table}]


def adapters_path(adapters: str | None, cwd: Path | None = None) -> Path | None:
    """The file of an adapters module: a .py path as given, a dotted name under `cwd`
    (tests.adapters -> tests/adapters.py), else the repository's tests/adapters.py if it is there."""
    cwd = cwd or Path.cwd()
    if adapters:
        path = Path(adapters) if adapters.endswith(".py") else cwd / Path(*adapters.split(".")).with_suffix(".py")
        return path if path.is_file() else None
    default = cwd / STUDENT_ADAPTERS
    return default if default.is_file() else None


def choose_size_table(
    requested: str | None,
    sizes: Iterable[str] = (),
    adapters: str | None = None,
    *,
    read_repository: bool = True,
    cwd: Path | None = None,
) -> SizeTableChoice:
    """The table `sizes` are names in: `requested` when it names one, else the rule above.
    `read_repository=False` leaves out step 1 (a library call that must not depend on the cwd)."""
    if requested and requested != AUTO:
        return SizeTableChoice(str(requested), f"--size-table {requested}")
    if read_repository:
        path = adapters_path(adapters, cwd)
        edition = edition_of_file(path) if path is not None else None
        if edition in SIZE_TABLES:
            shown = adapters if adapters else str(STUDENT_ADAPTERS)
            return SizeTableChoice(edition, f"from {shown}")
    for name in sizes:
        found = tables_with(name)
        if len(found) == 1:
            return SizeTableChoice(found[0], f"{name} is a size of the {found[0]} table only")
    return SizeTableChoice(NEWEST_SIZE_TABLE, "the newest edition's; --size-table 2025 for the other")
