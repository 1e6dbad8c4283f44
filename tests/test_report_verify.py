"""report --verify rebuilds each table whole from the results: a row deleted or
duplicated, a spec's column keys swapped with their cells, a heading or caption that claims other rows,
a changed number wherever a table renders, and a spec nested deep are each a failure in one line."""

import re

import pandas as pd
import pytest

from cs336_systems.report import cli as report
from cs336_systems.report.markdown_tables import parse_tables
from cs336_systems.report.spec import Spec
from tests.test_report_formats import _row

FP32_ROW = "| custom d32 L2 ff64 V97 | fp32        | 10.0 (0.100) | 20.0 (0.100) |"
BF16_ROW = "| custom d32 L2 ff64 V97 | bf16        | 5.00 (0.100) | 7.00 (0.100) |"
TRAIN_ROW = "| custom d32 L2 ff64 V97 | 30.0 (0.100) | 40.0 (0.100) |"


@pytest.fixture
def written(tmp_path):
    """A report of forward rows at two contexts in fp32 and bf16, and train-step rows in fp32, measured
    while other processes kept 1.2 cores busy."""
    rows = [
        _row(pass_type="forward", context_length=8, mean_ms=10.0),
        _row(pass_type="forward", context_length=16, mean_ms=20.0),
        _row(pass_type="forward", precision="bf16", context_length=8, mean_ms=5.0),
        _row(pass_type="forward", precision="bf16", context_length=16, mean_ms=7.0),
        _row(pass_type="train-step", context_length=8, mean_ms=30.0),
        _row(pass_type="train-step", context_length=16, mean_ms=40.0),
    ]
    results = tmp_path / "rows.csv"
    pd.DataFrame(rows).assign(other_load_cores=1.2).to_csv(results, index=False)
    output = tmp_path / "report.md"
    assert report.main([str(results), "--output", str(output)]) == 0
    text = output.read_text()
    assert FP32_ROW in text and BF16_ROW in text and TRAIN_ROW in text
    return results, text


def _verify(tmp_path, results, text: str, capsys) -> tuple[int, str]:
    edited = tmp_path / "edited.md"
    edited.write_text(text)
    capsys.readouterr()
    status = report.main(["--verify", str(edited), str(results)])
    return status, capsys.readouterr().err


def _swap_context_keys(text: str) -> str:
    """The forward table's spec says ctx 8 is context 16 and back, and its cells say so too."""
    spec = re.search(r"<!-- cells (.*\"title\":\"forward step time.*) -->", text).group(1)
    data = Spec.from_json(spec.replace("-\\u002d", "--"))
    ctx8, ctx16 = data.values
    data.values = [
        type(ctx8)(ctx8.header, ctx8.field, ctx8.fmt, ctx16.where),
        type(ctx16)(ctx16.header, ctx16.field, ctx16.fmt, ctx8.where),
    ]
    text = text.replace(spec, data.to_json().replace("--", "-\\u002d"))
    text = text.replace(FP32_ROW, "| custom d32 L2 ff64 V97 | fp32        | 20.0 (0.100) | 10.0 (0.100) |")
    return text.replace(BF16_ROW, "| custom d32 L2 ff64 V97 | bf16        | 7.00 (0.100) | 5.00 (0.100) |")


def _around(text: str, row: str, prefix: str, changed: str) -> str:
    """The table holding `row` (header to row) with each line prefixed, and the row changed."""
    lines = text.split("\n")
    at = lines.index(row)
    lines = [prefix + line if at - 3 <= i <= at else line for i, line in enumerate(lines)]
    lines[at] = prefix + changed
    return "\n".join(lines)


EDITS = {
    "a deleted row": (lambda t: t.replace(BF16_ROW + "\n", ""), "'custom d32 L2 ff64 V97, bf16': in the results"),
    "a duplicated row": (lambda t: t.replace(BF16_ROW, f"{BF16_ROW}\n{BF16_ROW}"), "is shown 2 times"),
    "column keys swapped with their cells": (_swap_context_keys, "column 'ctx 8' says 8; its rows have context"),
    "a heading claiming train-step": (
        lambda t: t.replace("#### forward step time", "#### train-step step time"),
        "its heading reads 'train-step step time",
    ),
    "a heading and its spec claiming compiled": (
        lambda t: t.replace("forward step time, cpu test (ms)", "forward step time, cpu test (ms), compiled"),
        "its heading or caption says compiled; its rows are eager",
    ),
    "a caption claiming bf16": (
        lambda t: t.replace("ms. Every row: batch 2, train-step, fp32,", "ms. Every row: batch 2, train-step, bf16,"),
        "steps, ms. Every row: batch 2, train-step, bf16",
    ),
    "an indented table with a changed number": (
        lambda t: _around(t, TRAIN_ROW, " ", TRAIN_ROW.replace("30.0", "31.0")),
        "shows '31.0 (0.100)', the result row gives '30.0 (0.100)'",
    ),
    "a blockquoted table with a changed number": (
        lambda t: _around(t, TRAIN_ROW, "> ", TRAIN_ROW.replace("30.0", "31.0")),
        "shows '31.0 (0.100)', the result row gives '30.0 (0.100)'",
    ),
    "an observation whose spec names no maker": (
        lambda t: t.replace('"maker":"describe_rows"', '"maker":"nothing"'),
        "(observation): its claims spec cannot be applied (KeyError: 'nothing')",
    ),
    "an observation whose spec names a file not given": (
        lambda t: t.replace(
            '{"maker":"describe_rows","tool":"","sources":["rows.csv"]',
            '{"maker":"describe_rows","tool":"","sources":["other.csv"]',
        ),
        "(observation): its source other.csv is not among the result files given",
    ),
    "a spec nested 200,000 deep": (
        lambda t: t.replace('"fixed":{', '"fixed":{"x":' + "[" * 200_000 + "]" * 200_000 + ",", 1),
        "its spec cannot be read (ValueError: nested 200002 deep",
    ),
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_verify_fails_a_table_that_is_not_the_one_its_results_make(written, tmp_path, capsys, edit):
    results, text = written
    change, said = EDITS[edit]
    changed = change(text)
    assert changed != text
    status, err = _verify(tmp_path, results, changed, capsys)
    assert status == 1, err
    assert said in err and "Traceback" not in err
    assert re.search(r"edited\.md: line \d+ \(", err)  # the line names the table


def test_the_report_as_written_verifies(written, tmp_path, capsys):
    results, text = written
    status, err = _verify(tmp_path, results, text, capsys)
    assert status == 0, err


def test_verify_refuses_a_first_page_that_claims_a_quiet_machine(written, tmp_path, capsys):
    """The load sentence is a claim made from the rows: replaced, or left without its spec, it fails."""
    results, text = written
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("Other processes kept up to 1.2 cores busy"))
    assert lines[at - 1].startswith("<!-- claims ") and "during 6 of 6 rows" in lines[at]
    quiet = "The machine was quiet while the 6 rows were measured: other processes kept at most 0.0 cores busy."
    status, err = _verify(tmp_path, results, text.replace(lines[at], quiet), capsys)
    assert status == 1 and f"line {at + 1}: reads {quiet!r}, the results say {lines[at]!r}" in err, err
    status, err = _verify(tmp_path, results, text.replace(f"{lines[at - 1]}\n{lines[at]}", quiet), capsys)
    assert status == 1 and "a sentence in the claims' words with no claims spec" in err, err
    assert "each of its 1 observations" in _verify(tmp_path, results, text, capsys)[1]


def test_every_block_that_renders_as_a_table_is_read():
    text = "\n".join(
        [
            "a | b",  # no outer pipes
            "--|--:",
            "1 | 2",
            "3",  # a row of one cell, padded as rendered
            "",
            "- | c |",  # in a list item
            "  |---|",
            "  | 4 |",
            "",
            "```",
            "| d |",  # in a fenced code block: text
            "|---|",
            "| 5 |",
            "```",
            "x",
            "---",  # a heading underlined, not a table
        ]
    )
    tables = parse_tables(text)
    assert [t.header for t in tables] == [["a", "b"], ["c"]]
    assert tables[0].rows == [["1", "2"], ["3", ""]] and tables[1].rows == [["4"]]


def test_the_environment_table_names_each_file_as_the_spec_lists_it_whichever_twin_was_read():
    """A CSV and its JSONL twin hold the same rows: the table of where they were measured names the file
    the write-up's spec lists, whether its rows came from the CSV or from the JSONL (which one a verify
    reads first depends on the order of its arguments)."""
    from cs336_systems.report.summary import environment_frame

    rows = pd.DataFrame([{"device_name": "AMD EPYC", "torch_version": "2.13.0", "git_commit": "abc"}])
    from_csv = {"a.csv": rows.assign(source="a.csv"), "b.csv": rows.assign(source="b.csv")}
    from_twin = {"a.csv": rows.assign(source="a.jsonl"), "b.csv": rows.assign(source="b.jsonl")}
    assert environment_frame(from_twin).equals(environment_frame(from_csv))
    assert environment_frame(from_twin).loc["result files", "machine 1"] == "a.csv, b.csv"
