"""A sweep's `--config FILE.json`: the command's own flags kept in a file (a cluster's Slurm settings, a
grid), read as if written on the command line before the flags given there, which win. torch-free.

    {"executor": "slurm", "slurm_partition": "gpu", "slurm_time": 30, "slurm_gpus_per_job": 1,
     "slurm_setup": ["module load cuda/12.4", "source .venv/bin/activate"], "model_sizes": ["small", "medium"]}

Keys are the flags' names without their leading dashes (slurm_partition, or slurm-partition); each value
is checked by its flag's own type and choices (argtypes.as_flag_value); a list for a flag that takes
several values; true or false for a switch ("no_wait": true).
"""

from __future__ import annotations

import argparse
import json

from . import jsontext
from .argtypes import as_flag_value, given_flags
from .errors import UsageError

MAX_BYTES = 1 << 20


class ConfigFileError(UsageError):
    """A --config file that cannot be read, is not a JSON object, or names a setting the command lacks."""


class _FlagFile(argparse._StoreAction):
    """--config as a file of the command's flags (benchmark's --config, a configuration, is another)."""


def add_config_file_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        action=_FlagFile,
        metavar="FILE.json",
        help='this command\'s flags from a JSON object ({"executor": "slurm", "slurm_partition": "gpu", ...}); '
        "a flag given on the command line wins (docs/cluster.md)",
    )


def _read(path: str) -> dict:
    try:
        text = jsontext.read_text(path, MAX_BYTES)
    except jsontext.UnreadableFile as exc:
        raise ConfigFileError(f"--config {path}: {exc}") from None
    try:
        value = jsontext.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigFileError(
            f"--config {path}: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None
    if not isinstance(value, dict):
        raise ConfigFileError(f"--config {path}: expected a JSON object of flags, got a {type(value).__name__}")
    return value


def with_config_file(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """`args` with every flag not given on the command line (`args.argv`) taken from `args.config`: a new
    namespace (the parsed one is left as parsed)."""
    if not any(isinstance(action, _FlagFile) for action in parser._actions) or not args.config:
        return args  # a command without add_config_file_argument's --config (Command calls this for all)
    path = args.config
    spellings = {option: action for action in parser._actions for option in action.option_strings}
    by_dest = {action.dest: action for action in parser._actions if action.option_strings}
    given = {action.dest for action in given_flags(parser, args.argv)}
    from_file = {}
    for key, value in _read(path).items():
        flag = "--" + str(key).replace("_", "-")
        action = spellings.get(flag) or by_dest.get(str(key).replace("-", "_"))
        if action is None or action.dest in ("config", "help"):
            raise ConfigFileError(f"--config {path}: no flag {flag} in this command")
        dest = action.dest
        several = action.nargs in ("+", "*") or isinstance(action, argparse._AppendAction)
        try:
            if several:
                items = value if isinstance(value, list) else [value]
                checked = [as_flag_value(action, item) for item in items]
            else:
                checked = as_flag_value(action, value)
                if isinstance(action, argparse._StoreConstAction) and flag in action.option_strings:
                    checked = action.const if checked else action.default  # "no_wait": true is --no-wait
        except argparse.ArgumentTypeError as exc:
            raise ConfigFileError(f"--config {path}: {key} (as {flag}): {exc}") from None
        if dest not in given:
            from_file[dest] = checked
    return argparse.Namespace(**{**vars(args), **from_file})
