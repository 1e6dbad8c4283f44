"""Which handout's size table a size name means: the flag, the student's adapters (read, never
imported), a name only one table has, else the newest; every tool says which and why."""

from __future__ import annotations

import json

import pytest

from cs336_systems.memory.cli import main as memory_main
from cs336_systems.size_tables import choose_size_table
from tests.helpers import run_main

# Importing either file would fail: the edition must come from the names alone.
ADAPTERS_2025 = (
    "raise SystemExit('imported')\ndef get_ddp_individual_parameters(module): ...\ndef get_ddp_bucketed(m, b): ...\n"
)
ADAPTERS_2026 = "raise SystemExit('imported')\ndef get_ddp(module): ...\ndef fsdp_on_after_backward(m, o): ...\n"


def student_repo(root, adapters: str):
    (root / "tests").mkdir()
    (root / "tests" / "adapters.py").write_text(adapters)
    return root


@pytest.mark.parametrize(
    ("requested", "sizes", "adapters", "edition", "why"),
    [
        ("2025", ["xl"], ADAPTERS_2026, "2025", "--size-table 2025"),
        (None, ["xl"], ADAPTERS_2025, "2025", "from tests/adapters.py"),
        ("auto", ["10B"], ADAPTERS_2026, "2026", "from tests/adapters.py"),
        (None, ["2.7B"], None, "2025", "2.7B is a size of the 2025 table only"),
        (None, ["small", "10B"], None, "2026", "10B is a size of the 2026 table only"),
        (None, ["xl"], None, "2026", "the newest edition's"),
        (None, ["xl"], ADAPTERS_2025 + ADAPTERS_2026, "2026", "the newest edition's"),  # both: names cannot tell
    ],
)
def test_the_choice_in_order(tmp_path, requested, sizes, adapters, edition, why):
    if adapters is not None:
        student_repo(tmp_path, adapters)
    choice = choose_size_table(requested, sizes, cwd=tmp_path)
    assert choice.edition == edition and choice.why.startswith(why)


def test_adapters_given_by_path_or_dotted_name_win_over_the_default_file(tmp_path):
    student_repo(tmp_path, ADAPTERS_2026)
    (tmp_path / "old.py").write_text(ADAPTERS_2025)
    assert choose_size_table(None, ["xl"], str(tmp_path / "old.py"), cwd=tmp_path).edition == "2025"
    assert choose_size_table(None, ["xl"], "old", cwd=tmp_path).why == "from old"
    assert choose_size_table(None, ["xl"], "tests.adapters", cwd=tmp_path).edition == "2026"
    assert choose_size_table(None, ["xl"], read_repository=False, cwd=tmp_path).why.startswith("the newest")


def test_a_tool_run_in_a_2025_repository_means_the_2025_xl_and_says_so_first(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(student_repo(tmp_path, ADAPTERS_2025))
    code, out, err = run_main(memory_main, capsys, "--model-size", "xl", "--json")
    assert code == 0 and err.splitlines()[0] == "size table 2025 (from tests/adapters.py)"
    row = json.loads(out)
    assert row["size_table"] == "2025" and row["config"].startswith("2025 xl")
    # a size of the other table: one line naming the table in use and why
    code, _, err = run_main(memory_main, capsys, "--model-size", "10B")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--size-table 2026" in err and "size table 2025 (from tests/adapters.py)" in err
