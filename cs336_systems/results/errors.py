"""The two ways a result file can fail us, below every module of results/ (no cycle)."""

from ..errors import ResultWriteError, UsageError

__all__ = ["OutputLockedError", "ResultFileError", "ResultWriteError"]


class ResultFileError(UsageError):
    """An output path we cannot write to as asked (bad suffix, mismatched columns, locked), or
    an input that is not a readable result file (named as file:LINE where a line is damaged)."""


class OutputLockedError(ResultFileError):
    """Another process is writing this output now (its lock is held)."""
