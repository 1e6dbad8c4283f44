"""The result records, the environment they ran in, and the CSV / Markdown / JSONL files.

environment.py  where a row was measured (device, versions, commit)
records.py      the base Record, timing columns, BenchmarkRecord
markdown.py     drawing rows as Markdown / a console table
paths.py        output paths checked before any work starts
files.py        ResultSink (one for every tool): locks, the CSV / JSONL / Markdown writers
writing.py      a row appended as one whole line; a whole file replaced atomically (write_whole)
readers.py      reading result files back (old files read as today's rows)

Here: what other packages use; the rest is imported from its module.
"""

from ..identity import identity_field
from .environment import ENVIRONMENT_FIELDS, Environment, collect_environment
from .errors import ResultFileError, ResultWriteError
from .files import ResultSink
from .paths import check_distinct, check_output_path, check_output_paths
from .readers import read_results
from .records import BenchmarkRecord, Record, Timing, fill_timing, samples_field, timing_columns
from .writing import open_to_write, write_whole

__all__ = [
    "ENVIRONMENT_FIELDS",
    "BenchmarkRecord",
    "Environment",
    "Record",
    "ResultFileError",
    "ResultSink",
    "ResultWriteError",
    "Timing",
    "check_output_path",
    "check_output_paths",
    "collect_environment",
    "fill_timing",
    "identity_field",
    "read_results",
    "samples_field",
    "timing_columns",
    "check_distinct",
    "open_to_write",
    "write_whole",
]
