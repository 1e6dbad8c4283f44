"""The result records, the environment they ran in, and the CSV / Markdown / JSONL files.

environment.py  where a row was measured (device, versions, commit)
records.py      the base Record, timing columns, identity, BenchmarkRecord
markdown.py     drawing rows as Markdown / a console table
files.py        ResultSink (one for every tool) and the readers
"""

from .environment import (
    ENVIRONMENT_FIELDS,
    GIT_COMMIT_ENV,
    OUTPUT_DIRS,
    Environment,
    checkout_state,
    collect_environment,
    harness_commit,
    utc_timestamp,
)
from .files import (
    OUTPUT_SUFFIXES,
    CsvWriter,
    JsonlWriter,
    MarkdownWriter,
    OutputLock,
    ResultFileError,
    ResultRecord,
    ResultSink,
    ResultWriteError,
    check_output_path,
    check_output_paths,
    read_markdown,
    read_results,
)
from .markdown import (
    MARKDOWN_ENVIRONMENT,
    STATS_CONVENTIONS,
    console_table,
    environment_lines,
    format_cell,
    is_missing,
    markdown_table,
    note_lines,
    render_document,
    row_label,
    row_warnings,
)
from .records import (
    BENCHMARK_FIELDS,
    CONFIG_FIELDS,
    LABEL_COLUMNS,
    MARKDOWN_COLUMNS,
    STATUSES,
    TIMING_STATISTICS,
    BenchmarkRecord,
    LegacyRecord,
    Record,
    Timing,
    fill_timing,
    identity_field,
    identity_value,
    render_markdown,
    row_key,
    samples_field,
    timing_columns,
    timing_names,
)

__all__ = [
    "BENCHMARK_FIELDS", "CONFIG_FIELDS", "ENVIRONMENT_FIELDS", "GIT_COMMIT_ENV", "LABEL_COLUMNS",
    "MARKDOWN_COLUMNS", "MARKDOWN_ENVIRONMENT", "OUTPUT_DIRS", "OUTPUT_SUFFIXES", "STATS_CONVENTIONS",
    "STATUSES", "TIMING_STATISTICS", "BenchmarkRecord", "CsvWriter", "Environment", "JsonlWriter",
    "LegacyRecord", "MarkdownWriter", "OutputLock", "ResultWriteError", "check_output_path", "Record", "ResultFileError", "ResultRecord", "ResultSink", "Timing",
    "check_output_paths", "checkout_state", "collect_environment", "console_table", "environment_lines",
    "fill_timing", "format_cell", "harness_commit", "identity_field", "identity_value", "is_missing",
    "markdown_table", "note_lines", "read_markdown", "read_results", "render_document", "render_markdown",
    "row_key", "row_label", "row_warnings", "samples_field", "timing_columns", "timing_names", "utc_timestamp",
]  # fmt: skip
