"""Load a user's `package.module:callable` (a model factory, a dataset, an optimizer...).

One parser and one set of one-line errors for every flag that takes such a spec; the
callable may be a dotted attribute path (`pkg.mod:Class.create`).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import os
import secrets
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType

from .errors import UsageError
from .usercode import UserCodeError, UserCodeTimeout, guarded, import_limit_s

# what pytest takes for the root of a repository (its rootdir's usual markers)
ROOT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", "pytest.ini", "tox.ini", ".git")


class LoadError(UsageError):
    """A spec that cannot be imported or is not a callable."""


def repo_paths(file: Path) -> list[Path]:
    """The directories pytest puts on sys.path for a test file, outermost first: the first
    ancestor that is not a package (so `tests/` with an `__init__.py` is imported as `tests`),
    and the repository root (the first ancestor holding pyproject.toml, setup.py, .git...)."""
    file = file.resolve()
    base = file.parent
    while (base / "__init__.py").is_file() and base.parent != base:
        base = base.parent
    paths = [base]
    for ancestor in file.parents:
        if any((ancestor / marker).exists() for marker in ROOT_MARKERS):
            if ancestor != base:
                paths.insert(0, ancestor)
            break
    return paths


def put_first_on_path(*directories: Path) -> None:
    """Put `directories` at the front of sys.path (kept there: spawned ranks inherit sys.path)."""
    for directory in reversed(directories):
        entry = str(directory)
        if entry in sys.path:
            sys.path.remove(entry)
        sys.path.insert(0, entry)


def namespace_hint(exc: BaseException) -> str:
    """A sentence for an import of `cs336_systems.X` that failed because `cs336_systems` is this
    harness (started as python -m cs336_systems...), not the student's package; '' otherwise."""
    ours = __name__.partition(".")[0]
    name = getattr(exc, "name", None) or ""
    mentions = name.startswith("cs336_systems") or "'cs336_systems" in str(exc)
    if ours != "cs336_systems" or not isinstance(exc, ImportError) or not mentions:
        return ""
    return (
        " (cs336_systems here is this benchmark harness, not your package: run the tool as "
        "`cs336-bench TOOL ...` from your repository's root, which imports your cs336_systems beside ours)"
    )


def not_installed_hint(exc: BaseException) -> str:
    """A sentence for a module that asks importlib.metadata for its own package's version (the handout's
    cs336_systems/__init__.py does) where that package is not installed; '' otherwise."""
    import importlib.metadata

    if not isinstance(exc, importlib.metadata.PackageNotFoundError):
        return ""
    return (
        f" (your package {exc.name or ''} is not installed in this Python: run `uv sync` or `pip install -e .` in "
        "your repository's root, as the assignment's set-up does, then install this tool beside it)"
    )


class UserImportError(Exception):
    """A user's module that could not be imported; the message is one line saying why."""


# Within one run (a command: hung_imports_shared; a group of ranks per unit, a row per configuration, each
# would wait the whole limit again), an import or adapter getter that hung is not tried again, in any of the
# run's processes. Outside a run it is: the user may have fixed the module since.
HUNG_IMPORTS_ENV = "CS336_BENCH_HUNG_IMPORTS"  # the note's path: a line "shown<TAB>why" per import that hung


@contextlib.contextmanager
def hung_imports_shared() -> Iterator[None]:
    """Inside, the processes started share one note of the user's imports that hung (a temporary file,
    made by the first hang: most runs have none)."""
    if os.environ.get(HUNG_IMPORTS_ENV):  # a parent's: shared already
        yield
        return
    path = os.path.join(tempfile.gettempdir(), f"cs336-hung-imports-{os.getpid()}-{secrets.token_hex(8)}")
    os.environ[HUNG_IMPORTS_ENV] = path
    try:
        yield
    finally:
        os.environ.pop(HUNG_IMPORTS_ENV, None)
        with contextlib.suppress(OSError):
            os.unlink(path)


def hung_before(shown: str) -> str | None:
    """Why `shown` (an import, a getter) hung earlier in this run, or None."""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        for line in Path(os.environ.get(HUNG_IMPORTS_ENV) or "/nonexistent").read_text().splitlines():
            name, _, why = line.partition("\t")
            if name == shown:
                return why
    return None


def note_hung(shown: str, why: str) -> None:
    if path := os.environ.get(HUNG_IMPORTS_ENV):
        with contextlib.suppress(OSError):
            note = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            with open(note, "a") as handle:
                handle.write(f"{shown}\t{why}\n")


def import_user_module(name: str, timeout_s: float | None = None, file: Path | None = None) -> ModuleType:
    """The user's module `name` (the file `file`, imported under that name, when given), imported under
    usercode.guarded: whatever the import does (raises, exits, interrupts itself, hangs past `timeout_s`)
    is a UserImportError of one line; a real Ctrl-C stays a KeyboardInterrupt. The one place a user's
    module is imported; each caller puts its flag in front of the line. `timeout_s` None: the command's
    limit (usercode.import_limit_s). Within a run, one that hung is refused at once the next time (hung_before)."""
    shown = repr(str(file) if file is not None else name)
    if (why := hung_before(shown)) is not None:
        raise UserImportError(f"{why} (earlier in this run: not tried again)")
    try:
        with guarded(f"importing {shown}", import_limit_s() if timeout_s is None else timeout_s):
            return importlib.import_module(name) if file is None else _import_file(name, file)
    except UserCodeTimeout as exc:
        note_hung(shown, str(exc))
        raise UserImportError(str(exc)) from None
    except UserCodeError as exc:
        raise UserImportError(str(exc)) from None
    except Exception as exc:  # the user's module may fail in any way while importing
        hint = not_installed_hint(exc) or namespace_hint(exc)
        raise UserImportError(f"cannot import {shown}: {type(exc).__name__}: {exc}{hint}") from exc


def _import_file(name: str, file: Path) -> ModuleType:
    """`file` run as module `name`, its directory first on the path for the import only (as when it is run)."""
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ImportError("not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    directory = str(file.resolve().parent)
    sys.path.insert(0, directory)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    finally:
        sys.path.remove(directory)
    return module


def load_callable(spec: str, flag: str, error: type[Exception] = LoadError, timeout_s: float | None = None) -> Callable:
    """The callable `spec` names; any failure raises `error` with one line naming `flag`, an import that
    exits, interrupts itself or takes longer than `timeout_s` too (usercode.guarded)."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise error(f"{flag} must look like package.module:callable, got {spec!r}")
    try:
        target = import_user_module(module_name, timeout_s)
    except UserImportError as exc:
        raise error(f"cannot load {flag} {spec}: {exc}") from exc.__cause__
    with reading_user_names(f"cannot load {flag} {spec}: reading {attribute!r}", error):
        for part in attribute.split("."):
            if not hasattr(target, part):
                hint = namespace_hint(ImportError(name=module_name)) if module_name.startswith("cs336_systems") else ""
                raise error(f"cannot load {flag} {spec}: {module_name!r} has no attribute {attribute!r}{hint}")
            target = getattr(target, part)
        if not callable(target):
            raise error(f"{flag} {spec} is not callable")
    return target


@contextlib.contextmanager
def reading_user_names(what: str, error: type[Exception]) -> Iterator[None]:
    """Inside, the attributes of the user's module are read (its module-level __getattr__ runs): whatever it
    raises or does (exits, hangs past an import's limit) is `error` of one line, `what` first."""
    try:
        with guarded(what, import_limit_s()):
            yield
    except (UserCodeError, UserCodeTimeout) as exc:  # their line starts with `what`
        raise error(str(exc)) from None
    except UsageError:
        raise
    except Exception as exc:
        raise error(f"{what}: {type(exc).__name__}: {exc}") from None


def fit_keywords(
    function: Callable,
    offered: Mapping[str, object],
    positional: int = 0,
    synonyms: Mapping[str, str] | None = None,
    only_named: tuple[str, ...] = (),
) -> tuple[dict, list[str]]:
    """The `offered` keywords that `function`'s signature takes (all of them when it takes **kwargs or
    its signature cannot be read, but those in `only_named`, given only to a parameter of that name), and
    the names of its parameters without a default that neither those nor the first `positional`
    arguments fill. `synonyms` maps a parameter's spelling to the offered name it stands for (theta for
    rope_theta)."""
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return {k: v for k, v in offered.items() if k not in only_named}, []
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        named = {p.name for p in parameters}
        return {k: v for k, v in offered.items() if k not in only_named or k in named}, []
    given, unfilled = {}, []
    for index, parameter in enumerate(parameters):
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            continue
        if index < positional and parameter.kind is not inspect.Parameter.KEYWORD_ONLY:
            continue  # the caller passes it positionally
        source = parameter.name if parameter.name in offered else (synonyms or {}).get(parameter.name)
        if source in offered and parameter.kind is not inspect.Parameter.POSITIONAL_ONLY:
            given[parameter.name] = offered[source]
        elif parameter.default is inspect.Parameter.empty:
            unfilled.append(parameter.name)
    return given, unfilled
