"""Load a user's `package.module:callable` (a model factory, a dataset, an optimizer...).

One parser and one set of one-line errors for every flag that takes such a spec; the
callable may be a dotted attribute path (`pkg.mod:Class.create`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from .usercode import DEFAULT_IMPORT_TIMEOUT_S, UserCodeError, UserCodeTimeout, guarded


class LoadError(ValueError):
    """A spec that cannot be imported or is not a callable."""


def load_callable(
    spec: str, flag: str, error: type[Exception] = LoadError, timeout_s: float = DEFAULT_IMPORT_TIMEOUT_S
) -> Callable:
    """The callable `spec` names; any failure raises `error` with one line naming `flag`, an import that
    exits, interrupts itself or takes longer than `timeout_s` too (usercode.guarded)."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise error(f"{flag} must look like package.module:callable, got {spec!r}")
    try:
        with guarded(f"importing {module_name!r}", timeout_s):
            target = importlib.import_module(module_name)
    except (UserCodeError, UserCodeTimeout) as exc:
        raise error(f"cannot load {flag} {spec}: {exc}") from None
    except Exception as exc:  # the user's module may fail in any way while importing
        raise error(f"cannot load {flag} {spec}: cannot import {module_name!r}: {type(exc).__name__}: {exc}") from exc
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise error(f"cannot load {flag} {spec}: {module_name!r} has no attribute {attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise error(f"{flag} {spec} is not callable")
    return target
