"""python -m cs336_systems.report: results files -> a write-up in Markdown, LaTeX, Typst or PDF;
--verify: every number of a write-up re-derived from the result files."""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import sys
from pathlib import Path

import pandas as pd

from ..argtypes import EXIT_FAILED, EXIT_OK, EXIT_USAGE, ArgumentParser
from ..command import Command
from ..errors import UsageError
from ..results import ResultFileError, ResultWriteError, check_distinct, check_output_path, write_whole
from ..results.origin import TOOL_NAMES
from ..results.writing import MADE, file_sha256, made_sums, place_of, record_made
from ..tools import prog
from . import plots
from .build import build_document
from .grid import FoldedRows
from .latex import document_latex, table_latex
from .load import index_files, load_each, read_file
from .markdown import document_markdown, table_markdown
from .typst_source import INSTALL_HINT, compile_pdf, document_typst, table_typst

PROG = prog("report")
FORMATS = (".md", ".tex", ".typ", ".pdf")
USAGE = f"""{__doc__.splitlines()[0]}

    {PROG} RESULTS... [--output writeup/report.md] [--output writeup/report.pdf ...] [--tables-only]
        [--note "A paragraph for the reader, placed under the title."]
    {PROG} --verify WRITEUP.md RESULTS...

The format is the output's extension: {", ".join(FORMATS)} (PDF: the Typst document compiled by the
typst package: pip install "typst>=0.14"). RESULTS are .csv/.jsonl files of {", ".join(TOOL_NAMES)}
(find_max: its .json answer); each tool's rows are told apart by their columns. A handout plan
(handout_plan.csv of `handout`) makes the write-up of that plan, its results read from beside it.
A file of no tool is named in one line and left out; the others are reported, and the exit status
is 1. --tables-only writes one file per table (OUTPUT's stem + the table's name).

--verify reads each table and each observation of WRITEUP.md with its spec and makes it again from
RESULTS (a plan brings its own results): exit 0 when each table (heading, caption, columns, rows) reads
as the one its rows make, each cell exactly one row's value, and each observation word for word as its
maker says it of its rows; 1 naming each difference. Other prose is not checked.
"""


def _check_outputs(outputs: list[Path], tables_only: bool, inputs: list[str]) -> str | None:
    for output in outputs:
        if output.suffix not in FORMATS:
            return f"--output {output}: unknown format {output.suffix or '(no extension)'!r}; expected one of {', '.join(FORMATS)}"
        if output.suffix == ".pdf" and tables_only:
            return f"--output {output}: --tables-only writes .md, .tex or .typ snippets, not PDF"
        try:
            check_output_path(output)  # a directory, an unwritable place: refused before any work
        except ResultFileError as exc:
            return str(exc)
    try:  # an output that is an input (or another output) would overwrite it
        check_distinct([*(("input", Path(raw)) for raw in inputs), *(("--output", o) for o in outputs)])
    except ResultFileError as exc:
        return str(exc)
    if any(o.suffix == ".pdf" for o in outputs) and importlib.util.find_spec("typst") is None:
        return INSTALL_HINT
    if any(o.suffix == ".tex" for o in outputs) and importlib.util.find_spec("jinja2") is None:
        return "LaTeX output uses pandas' Styler, which needs jinja2: pip install jinja2"
    return None


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog=PROG, description=USAGE)
    parser.add_argument("results", nargs="+", help="result files (.csv, .jsonl; a handout_plan.csv)")
    parser.add_argument(
        "--output",
        action="append",
        default=[],
        help="report file, format by extension (repeatable; default writeup/report.md)",
    )
    parser.add_argument("--tables-only", action="store_true", help="write each table to a file of its own")
    parser.add_argument("--note", action="append", default=[], help="a paragraph under the title (repeatable)")
    parser.add_argument(
        "--verify",
        metavar="WRITEUP.md",
        type=Path,
        help="check that every table and observation of this Markdown write-up is what RESULTS make; write nothing",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    if args.verify is not None:
        return run_verify(args.verify, args.results)
    if trailing := [o for o in args.output if o.endswith("/")]:
        raise UsageError(f"--output {trailing[0]}: ends in '/': give a file name, not a directory")
    outputs = [Path(o) for o in args.output] or [Path("writeup/report.md")]
    if problem := _check_outputs(outputs, args.tables_only, args.results):
        raise UsageError(problem)
    frames, problems = load_each(args.results)
    for problem in problems:
        print(f"{PROG}: {'error' if not frames else 'left out'}: {problem}", file=sys.stderr)
    if not frames:
        return EXIT_USAGE
    if "handout" in frames:  # its write-up is the handout's (report knows no handout's problems)
        plan = frames["handout"]["source"].iloc[0]
        raise UsageError(
            f"{plan} is a handout plan: `cs336-bench handout --write-up --output-dir DIR` writes its write-up, "
            f"`{PROG} --verify DIR/writeup.md DIR/{plan}` checks it"
        )
    here = outputs[0].parent
    paths_given = [*args.results, *map(str, outputs)]
    inside = all(_inside(p, here) for p in paths_given)  # a handout's write-up: name its files as they lie
    show = (lambda p: str(Path(p).resolve().relative_to(here.resolve()))) if inside else str
    command = shlex.join(
        [
            "cs336-bench",
            "report",
            *(show(raw) for raw in args.results),
            *(x for o in outputs for x in ("--output", show(o))),
            *(["--tables-only"] if args.tables_only else []),
        ]
    )
    generated = f"Generated by `{command}`" + (", run in this directory." if inside else ".")
    for output in outputs:
        output.parent.mkdir(parents=True, exist_ok=True)
    plots.UNWRITTEN.clear()
    try:
        document = build_document(frames, outputs[0].parent, outputs[0].stem, [*args.note, generated])
    except FoldedRows as exc:  # the fallback label (when each was measured) could not tell them apart
        raise UsageError(exc.said()) from None
    # A full disk: each file that could not be written is one line, the others are written (Markdown first,
    # the smallest); the inputs are untouched.
    unwritten = [f"{PROG}: error: {problem}" for problem in plots.UNWRITTEN]
    for output in sorted(outputs, key=lambda o: o.suffix != ".md"):
        try:
            written = write(document, output, args.tables_only)
        except OSError as exc:
            unwritten.append(
                f"{PROG}: error: {exc.strerror if isinstance(exc, ResultWriteError) else f'{output}: could not write ({exc.strerror})'}"
            )
            continue
        print(f"wrote {', '.join(str(p) for p in written)}", file=sys.stderr)
    for line in unwritten:
        print(line, file=sys.stderr)
    return EXIT_FAILED if problems or unwritten else EXIT_OK


def _inside(path: str | Path, directory: Path) -> bool:
    return Path(path).resolve().is_relative_to(directory.resolve())


def write(document, output: Path, tables_only: bool) -> list[Path]:
    """The document (or each table, `tables_only`) in `output`'s format; a file there that is not as this
    project made it (the user's own, or edited since) is kept, and the new one written beside it, said in a line."""
    directory = output.parent
    if tables_only:
        render = {".md": table_markdown, ".tex": table_latex, ".typ": table_typst}[output.suffix]
        made = [
            (directory / f"{output.stem}_{table.name}{output.suffix}", render(table)) for table in document.tables()
        ]
    elif output.suffix == ".pdf":
        made = [(output, compile_pdf(document_typst(document, directory), directory))]
    else:
        render = {".md": document_markdown, ".tex": document_latex, ".typ": document_typst}[output.suffix]
        made = [(output, render(document, directory))]
    paths = []
    for path, text in made:
        if (place := place_of(path)) != path:  # the user's own, or edited since
            print(f"{path}: not as cs336-bench made it: kept; the new one is {place}", file=sys.stderr)
        write_whole(place, text)
        record_made(place)
        paths.append(place)
    return paths


def result_files(raws: list[str]) -> tuple[dict[str, pd.DataFrame], list[str], dict[str, Path]]:
    """Every given file's rows by file name, and the files an index file (a handout plan) names, read
    from beside it; one line per file that cannot be read; where each was read. The same file given twice
    (by itself and through a plan) is read once."""
    frames: dict[str, pd.DataFrame] = {}
    where: dict[str, Path] = {}
    problems: list[str] = []
    for raw in raws:
        path = Path(raw)
        if path.name in where:
            if path.resolve() != where[path.name].resolve():
                problems.append(f"{raw}: a second file named {path.name}: the write-up names its sources by file name")
            continue
        try:
            frame = read_file(path)
        except ResultFileError as exc:
            problems.append(str(exc))
            continue
        frames[path.name], where[path.name] = frame.assign(source=path.name), path
        if "reads" in frame.columns:
            found, missing = index_files(frame, path.parent)
            for name, rows in found.items():
                if name not in frames:
                    frames[name], where[name] = rows, path.parent / name
            problems += missing
    # a write-up names a JSONL where the plan named its CSV twin: both names find the rows
    for name, frame in list(frames.items()):
        source = str(frame["source"].iloc[0]) if not frame.empty else name
        frames.setdefault(source, frame)
    return frames, problems, where


def _sources(table) -> list[str]:
    return list(table.spec.sources) if table.spec is not None and not isinstance(table.spec, str) else []


def run_verify(writeup: Path, raws: list[str]) -> int:
    from .verify import parse_tables, verify

    if writeup.suffix != ".md" or not writeup.is_file():
        raise UsageError(f"--verify {writeup}: expected a Markdown write-up (.md) that exists")
    frames, problems, where = result_files(raws)
    if problems:
        raise UsageError(problems[0])
    # an index file (a handout plan) brings the files beside it that the write-up names (its checklist)
    folders = {Path(raw).parent for raw in raws if "reads" in frames.get(Path(raw).name, pd.DataFrame()).columns}
    named = {name for table in parse_tables(writeup.read_text(errors="replace")) for name in _sources(table)}
    beside = [str(folder / name) for folder in folders for name in named - set(frames) if (folder / name).is_file()]
    more, _, more_where = result_files(beside)
    tables, said, failures = verify(writeup, {**more, **frames})
    # a file whose sha256 the tool that made it recorded (a handout step's output) is still what it made
    for name, given in {**more_where, **where}.items():
        path = given.parent / str(next(iter({**more, **frames}[name]["source"]), name))  # a plan's CSV: its JSONL
        if (made := made_sums(path.parent).get(path.name)) is not None and made != file_sha256(path):
            failures.append(f"{path}: changed since its tool made it (its sha256 is not the one in {MADE})")
    for line in failures:
        print(f"{PROG}: {writeup}: {line}", file=sys.stderr)
    if failures:
        print(f"{PROG}: {len(failures)} difference(s) from what the results make", file=sys.stderr)
        return EXIT_FAILED
    print(
        f"{writeup}: each cell of its {tables} tables is one row's value of the results, and each of its {said} "
        "observations (a sentence or list under a claims spec) is what its maker says of those rows; the "
        "rest of the text (headings, the plan's notes and reductions, the commands) is not checked",
        file=sys.stderr,
    )
    return EXIT_OK


main = Command(build_parser, run)
