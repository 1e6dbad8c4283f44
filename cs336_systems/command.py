"""Every tool's command line, run one way (pip's `Command`), and the hidden spellings of its flags.

A tool module declares `build_parser()` (its flags) and `run(args) -> int` (its work), and ends with

    main = Command(build_parser, run)
    if __name__ == "__main__":
        main.start()

`main(argv)` parses and runs; what the user caused ends here as one line, whoever raised it:
- errors.UsageError (a bad value, file, device; the user's code that does not load): `PROG: error:
  MESSAGE`, exit status 2. Any other exception is a bug and raises with its traceback;
- Ctrl-C: exit 130, SIGTERM: 143, after one line (the rows written so far stay written; children
  are ended by the cleanup the interrupt runs through);
- a full disk (errors.ResultWriteError): one line, exit 1.
argparse's own usage errors are one line and exit 2 too (argtypes.ArgumentParser).

argparse names an action by all its option strings in errors ("argument --head-dims/--head-dim:
..."); an alias added as its own hidden action keeps the error naming the one spelling we teach,
and the alias writes to the same destination.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable
from typing import NoReturn

from .argtypes import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_TERMINATED, EXIT_USAGE
from .errors import ResultWriteError, UsageError
from .flagfile import with_config_file
from .lifetime import Terminated, check_interrupted, exit_with, signals_interrupt
from .loading import hung_imports_shared
from .usercode import import_limit


class Command:
    """A tool: its parser builder and its run. Calling it runs the command line `argv` (sys.argv's
    by default) and returns the exit status; `args.argv` holds that command line as given, a tuple put
    in the namespace before parsing (a sweep prints it again to resume, --config looks for flags given
    beside it). The parsed namespace is read-only from then on: what a tool derives from it is a
    value its run computes and passes on. A command called inside another's run (handout writes its
    report so) answers its status and leaves Ctrl-C to the outer one."""

    _running = 0  # commands running in this process, the outermost first

    def __init__(self, build_parser: Callable[[], argparse.ArgumentParser], run: Callable[[argparse.Namespace], int]):
        self.build_parser, self.run = build_parser, run

    def __call__(self, argv: list[str] | None = None) -> int:
        parser = self.build_parser()
        argv = list(sys.argv[1:] if argv is None else argv)
        args = parser.parse_args(argv, namespace=argparse.Namespace(argv=tuple(argv)))
        outermost = not Command._running
        Command._running += 1
        try:
            args = with_config_file(parser, args)  # a sweep's or handout's --config FILE.json of flags
            # --timeout limits importing the user's code too, here and in the processes the tool starts, and
            # what hung once is not waited for again in the run. The spine serves every tool, and --timeout
            # (like --output below) is a flag only some declare.
            with (
                signals_interrupt() if outermost else contextlib.nullcontext(),
                import_limit(getattr(args, "timeout", None)),
                hung_imports_shared(),
            ):
                status = self.run(args)
                check_interrupted()  # one Python swallowed (e.g. raised in an at-fork hook) still counts
                return status
        except UsageError as exc:
            print(f"{parser.prog}: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except KeyboardInterrupt as exc:
            if not outermost:
                raise
            terminated = isinstance(exc, Terminated)
            kept = "printed above (no --output)" if getattr(args, "output", None) == [] else "in the outputs"
            print(
                f"{parser.prog}: {'terminated' if terminated else 'interrupted'}; the rows finished so far are {kept}",
                file=sys.stderr,
            )
            return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
        except ResultWriteError as exc:
            print(f"{parser.prog}: error: {exc.strerror}; the rows before it are in the outputs", file=sys.stderr)
            return EXIT_FAILED
        finally:
            Command._running -= 1

    def start(self) -> NoReturn:
        """`python -m TOOL`: run and end the process with the status, whatever the user's code left
        running (lifetime.exit_with)."""
        exit_with(self)


def add_argument_with_aliases(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, flag: str, *aliases: str, **kwargs
) -> argparse.Action:
    """`flag` as documented, then each alias hidden from --help with the same dest and type."""
    action = parser.add_argument(flag, **kwargs)
    hidden = {key: value for key, value in kwargs.items() if key not in ("help", "default", "metavar")}
    hidden.setdefault("dest", action.dest)
    for alias in aliases:
        parser.add_argument(alias, help=argparse.SUPPRESS, default=argparse.SUPPRESS, **hidden)
    return action
