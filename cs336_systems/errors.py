"""What the command runner (command.Command) turns into one line instead of a traceback.

Every error a user can cause (a bad flag value, a file, a device, their code that does not load)
derives from UsageError: raised anywhere in a tool's run, it ends as `PROG: error: MESSAGE` and exit
status 2. A new kind is a subclass where it is raised; no command needs an except clause for it.
Anything else is a bug and raises with its traceback. torch-free and import-free: every module may
raise these.
"""


class UsageError(ValueError):
    """Something the user asked for that cannot be done, in one line that names it (the flag, the file)."""


class ResultWriteError(OSError):
    """A row could not be written (a full disk): the file was truncated back to its last whole row."""
