"""argparse pieces every command shares, so a flag means the same everywhere.

torch-free on import (storage and monitor use it too). A user error is one line on
stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import os
import re
import sys
from collections.abc import Iterable

from . import terminal
from .errors import UsageError
from .units import format_bytes, parse_bytes
from .usercode import DEFAULT_IMPORT_TIMEOUT_S, DEFAULT_TIMEOUT, MAX_TIMEOUT_S, TIMEOUT_BOUNDS

EXIT_OK = 0
EXIT_FAILED = 1  # a row is 'error', 'timeout' or 'wrong'
EXIT_USAGE = 2  # bad input
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
EXIT_TERMINATED = 143  # SIGTERM (128 + SIGTERM), handled as Ctrl-C

# Rows that ran or are an expected result of the configuration (an OOM is a measurement).
# not-sharded: a student's FSDP or sharded optimizer ran, right, but divided nothing (ddp_bench)
EXPECTED_STATUSES = ("ok", "oom", "unsupported", "skipped", "not-sharded")
# cancelled, preempted: a Slurm job ended by a person or the scheduler (--executor slurm); the same command redoes it
FAILED_STATUSES = ("error", "timeout", "wrong", "cancelled", "preempted")

DEVICE_HELP = "auto (cuda when available), cpu, cuda or cuda:N"
# Names a flag chooses from, here so that a tool reads its flags before torch is imported (seconds on a
# busy machine): the rows of precision.PRECISION_TABLE (checked there) and timing's timers.
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
TIMERS = ("host", "cuda-event", "do-bench")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """--help as written, with each flag's default as ArgumentDefaultsHelpFormatter shows it, less those
    that say nothing (none, off, an empty list) and those the help names."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        values = action.default if isinstance(action.default, list | tuple) else [action.default]
        shown = " ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values).replace("%", "%%")
        said = action.nargs == 0 or "default" in text or f"({shown})" in text  # a switch's default is its absence
        if said or action.default is argparse.SUPPRESS or all(v is None or v is False for v in values):
            return text
        return f"{text} (default: {shown})".lstrip()

    def _format_action(self, action: argparse.Action) -> str:
        if not action.help and action.option_strings:  # argparse gives a flag without help no line: its default
            action = copy.copy(action)
            action.help = self._get_help_string(action) or None
        return super()._format_action(action)


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line, 'prog: error: message' (did_you_mean). Every command builds
    one, so this is where its output learns to fall back to ASCII (terminal.py, LANG=C), to show defaults
    (HelpFormatter) and to name the tool as run (a docstring's `python -m cs336_systems.TOOL:` as prog)."""

    def __init__(self, *args, **kwargs):
        terminal.install()
        if sys.version_info >= (3, 14):  # argparse suggests a choice itself there; did_you_mean then adds nothing
            kwargs.setdefault("suggest_on_error", True)
        super().__init__(*args, formatter_class=HelpFormatter, **kwargs)

    def format_help(self) -> str:
        head, colon, rest = (self.description or "").partition(": ")
        if colon and head.startswith("python -m "):
            self.description = f"{self.prog}: {rest}"
        return super().format_help()

    def error(self, message: str):  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {did_you_mean(self, message)}\n")


# Flags of one tool given to another: where they belong ("unrecognized arguments: --dry-run" on benchmark).
ELSEWHERE = {
    "--context-lengths": "a list is a sweep's: cs336-bench benchmark_direct or run_benchmarks",
    "--model-sizes": "a list is a sweep's: cs336-bench benchmark_direct or run_benchmarks",
    "--dry-run": "what a configuration needs, without running it: cs336-bench memory",
}


def did_you_mean(parser: argparse.ArgumentParser, message: str) -> str:
    """argparse's error `message`, with the flag or choice a mistyped one is close to (difflib, as Python
    3.14's suggest_on_error), and where a flag of another tool belongs (ELSEWHERE)."""
    if choice := re.search(r"argument (\S+): invalid choice: '([^']*)'", message):
        action = parser._option_string_actions.get(choice[1])
        known = [str(c) for c in action.choices or ()] if action and "maybe you meant" not in message else []
        guess = difflib.get_close_matches(choice[2], known, n=1)
        return f"{message}; did you mean {guess[0]!r}?" if guess else message
    if not message.startswith("unrecognized arguments: "):
        return message
    known = [
        option for action in parser._actions for option in action.option_strings if action.help != argparse.SUPPRESS
    ]
    for flag in (word.split("=", 1)[0] for word in message.split()[2:] if word.startswith("--")):
        guess = difflib.get_close_matches(flag, known, n=1)
        hint = (f"; did you mean {guess[0]}?" if guess else "") + (f" ({ELSEWHERE[flag]})" if flag in ELSEWHERE else "")
        if hint:
            return message + hint
    return message


def add_timer_argument(parser, help: str) -> None:
    """`--timer host|cuda-event|do-bench` (host by default); `help` says what the tool does with each."""
    parser.add_argument("--timer", choices=TIMERS, default="host", help=help)


def exit_status(statuses: Iterable[str | None]) -> int:
    """0 when every row ran or is an expected result, 1 when any row failed."""
    return EXIT_FAILED if any(status in FAILED_STATUSES for status in statuses) else EXIT_OK


# No count or size in this project comes near 2**40 (a trillion); past it, torch's size arithmetic
# overflows into a traceback instead of an honest out-of-memory result.
MAX_INT = 2**40


def positive_int(text: str) -> int:
    value = _parse(int, text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return _at_most(value, text)


def non_negative_int(text: str) -> int:
    value = _parse(int, text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be zero or more, got {text}")
    return _at_most(value, text)


def _at_most(value: int, text: str) -> int:
    if value > MAX_INT:
        raise argparse.ArgumentTypeError(f"must be at most 2**40 ({MAX_INT}), got {text}")
    return value


# Steps of one measurement: no statistic needs more, and 100,000 steps of even a millisecond are
# minutes (of a real training step, days); 2**40 of them would run for ever.
MAX_STEPS = 100_000
MAX_PORT = 65535


def step_count(text: str) -> int:
    """--measure-steps: a positive number of steps, at most MAX_STEPS."""
    return _steps(positive_int(text), text)


def warmup_count(text: str) -> int:
    """--warmup-steps: zero or more steps, at most MAX_STEPS."""
    return _steps(non_negative_int(text), text)


def _steps(value: int, text: str) -> int:
    if value > MAX_STEPS:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_STEPS:,} steps, got {text}")
    return value


def port_number(text: str) -> int:
    """A TCP port: 0 (any free one) to 65535."""
    value = non_negative_int(text)
    if value > MAX_PORT:
        raise argparse.ArgumentTypeError(f"must be a port from 0 to {MAX_PORT}, got {text}")
    return value


def positive_float(text: str) -> float:
    value = _parse(float, text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = _parse(float, text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be zero or more, got {text}")
    return value


def boolean(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def byte_size(text: str) -> int:
    """16GiB, 512MB, 1e9 (units.parse_bytes) as an argparse type."""
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def output_path(text: str) -> str:
    """An output file's path, made absolute as the flags are read: the user's code may change the
    working directory (a model factory that chdirs), and the rows must still go where the user said.
    A trailing '/' is kept, so the path check still refuses a directory."""
    return text if not text or os.path.isabs(text) else os.path.join(os.getcwd(), text)


def add_output_argument(parser, help: str, *, absolute: bool = True) -> None:
    """The repeatable `--output PATH` a tool writes its rows to (the suffix picks the format). Made
    absolute as it is read (output_path) unless `absolute` is off: a tool that checks its paths before
    any user code runs keeps them as the user wrote them."""
    parser.add_argument(
        "--output", action="append", type=output_path if absolute else None, default=[], metavar="PATH", help=help
    )


def add_all_columns_argument(parser) -> None:
    """`--all-columns`: the tool's table on the terminal with every column (Record.console)."""
    help = "print every column of the rows' Markdown, not only the settings that differ between rows and the measures"
    parser.add_argument("--all-columns", action="store_true", help=help)


def as_flag_value(action: argparse.Action, value: object) -> object:
    """`value` (from a configuration file) checked and converted as its flag `action` would read it from
    the command line: its type and choices; a switch (store_true / store_false) takes true or false only.
    argparse.ArgumentTypeError (one line) otherwise. None passes: the configuration says whether it may."""
    if value is None:
        return None
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        if not isinstance(value, bool):
            raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise argparse.ArgumentTypeError(f"expected a single value as the flag takes, got {value!r}")
    if action.type is not None:
        try:
            value = action.type(str(value))
        except ValueError as exc:  # ArgumentTypeError is one; a plain type such as int raises ValueError
            raise argparse.ArgumentTypeError(str(exc)) from None
    if action.choices is not None and value not in action.choices:
        raise argparse.ArgumentTypeError(
            f"invalid choice {value!r} (choose from {', '.join(map(str, action.choices))})"
        )
    return value


def given_flags(parser: argparse.ArgumentParser, argv: list[str]) -> list[argparse.Action]:
    """The actions of the flags written on the command line `argv` (not those left at their defaults)."""
    spellings = {option: action for action in parser._actions for option in action.option_strings}
    given: list[argparse.Action] = []
    for word in argv:
        if word == "--":
            break
        word = word.split("=", 1)[0]
        # argparse takes a unique prefix of a long flag too (--batch for --batch-size)
        found = [spellings[word]] if word in spellings else []
        if not found and word.startswith("--"):
            found = list({id(a): a for option, a in spellings.items() if option.startswith(word)}.values())
        if len(found) == 1 and found[0] not in given:
            given.append(found[0])
    return given


def argv_without(parser: argparse.ArgumentParser, argv: list[str], dests: Iterable[str]) -> list[str]:
    """`argv` less the flags whose destinations are `dests`, with their values: the same command line for
    another process that must not repeat them (a job's, given its own --output)."""
    drop = set(dests)
    spellings = {option: action for action in parser._actions for option in action.option_strings}
    kept: list[str] = []
    words = iter(range(len(argv)))
    for index in words:
        word = argv[index]
        if word == "--":
            kept += argv[index:]
            break
        name, eq, _ = word.partition("=")
        action = spellings.get(name)
        if action is None and name.startswith("--"):  # argparse takes a unique prefix of a long flag too
            found = {id(a): a for option, a in spellings.items() if option.startswith(name)}
            action = next(iter(found.values())) if len(found) == 1 else None
        if action is None or action.dest not in drop:
            kept.append(word)
            continue
        if eq or action.nargs == 0:
            continue
        count = action.nargs if isinstance(action.nargs, int) else None
        taken = 0
        while index + 1 < len(argv) and not argv[index + 1].startswith("-") and (count is None or taken < count):
            next(words)
            index, taken = index + 1, taken + 1
            if action.nargs in (None, "?"):
                break
    return kept


def _parse(kind, text: str):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected {'an integer' if kind is int else 'a number'}, got {text!r}"
        ) from None


def timeout_seconds(text: str) -> float:
    """argparse type for --timeout: a number of seconds within usercode.check_timeout's bounds."""
    value = _parse(float, text)
    if not 0 < value <= MAX_TIMEOUT_S:  # argparse names the flag
        raise argparse.ArgumentTypeError(f"{TIMEOUT_BOUNDS}, got {text}")
    return value


def add_timeout_argument(parser, what: str) -> None:
    """--timeout SECONDS: one limit for every step, model build and import of the user's code; by default
    usercode.DEFAULT_TIMEOUT (StepLimits) and DEFAULT_IMPORT_TIMEOUT_S for imports and adapter getters."""
    parser.add_argument(
        "--timeout",
        type=timeout_seconds,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"{what}: past it the row is 'timeout' (default: {DEFAULT_TIMEOUT}; importing your code and "
        f"calling an adapter's getter {DEFAULT_IMPORT_TIMEOUT_S:g} s)",
    )


# -- --device ---------------------------------------------------------------------------


def add_device_argument(parser, default: str = "auto", help: str | None = None) -> None:
    """`--device auto|cpu|cuda[:N]`; resolve it with device.resolve_device."""
    parser.add_argument("--device", default=default, metavar="auto|cpu|cuda[:N]", help=help or DEVICE_HELP)


# -- --memory-limit ---------------------------------------------------------------------

AUTO = "auto"


def memory_limit(text: str) -> int | str | None:
    """A byte size, 'none' (no limit) or 'auto' (resolved by resolve_memory_limit)."""
    value = text.strip().lower()
    if value == "none":
        return None
    if value == AUTO:
        return AUTO
    return byte_size(text)


def _size_only(text: str) -> int | None:
    if text.strip().lower() == "none":
        return None
    return byte_size(text)


def add_memory_limit_argument(parser, *, allow_auto: bool = False, help: str | None = None) -> None:
    """One typed `--memory-limit SIZE` flag: a CPU address-space cap (RLIMIT_AS), so an
    allocation past it fails for real and becomes an 'oom' row instead of swapping. With
    `allow_auto` the default is 'auto' (the memory available at start) and 'none' turns it off."""
    default_help = (
        "CPU only: allocations past this much more address space (e.g. 8GiB) fail as a real out-of-memory "
        "(a row with status oom): emulates a smaller machine"
    )
    if allow_auto:
        default_help += "; auto: the memory available at start; none: no limit (auto)"
    parser.add_argument(
        "--memory-limit",
        type=memory_limit if allow_auto else _size_only,
        default=AUTO if allow_auto else None,
        metavar="SIZE",
        help=help or default_help,
    )


def resolve_memory_limit(value: int | str | None, device_type: str) -> int | None:
    """The cap in bytes for a run on `device_type`, or None. A UsageError for a cap asked on CUDA
    (RLIMIT_AS caps host memory, and CUDA needs far more address space than it uses)."""
    if value is None:
        return None
    if device_type != "cpu":
        if value == AUTO:
            return None
        raise UsageError("--memory-limit caps CPU memory (RLIMIT_AS) and cannot be used with CUDA")
    if value == AUTO:
        return available_memory_bytes()
    return int(value)


def available_memory_bytes() -> int | None:
    """MemAvailable from /proc/meminfo: what can be allocated without swapping (Linux)."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def describe_memory_limit(limit_bytes: int) -> str:
    return f"ran under --memory-limit {format_bytes(limit_bytes)} (address-space cap)"
