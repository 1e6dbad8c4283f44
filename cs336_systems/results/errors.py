"""The two ways a result file can fail us, below every module of results/ (no cycle)."""


class ResultFileError(ValueError):
    """An output path we cannot write to as asked (bad suffix, mismatched columns, locked), or
    an input that is not a readable result file (named as file:LINE where a line is damaged)."""


class ResultWriteError(OSError):
    """A row could not be written (a full disk): the file was truncated back to its last whole row."""


class OutputLockedError(ResultFileError):
    """Another process is writing this output now (its lock is held)."""
