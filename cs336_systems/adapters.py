"""Read a student's official adapters module (their `tests/adapters.py`) by the handout's names.

    adapters = load_adapters("tests/adapters.py")        # or a dotted name: "tests.adapters"
    Fn = adapters.flash_function("pytorch")              # Fn.apply(q, k, v, is_causal)
    ddp_model = adapters.call("get_ddp", model)          # NotImplementedAdapter if it raises NotImplementedError

Both editions of the handout are known: 2026 (`get_ddp`, `get_fsdp`, FlashAttention getters) and
2025 (`get_ddp_individual_parameters`, `get_ddp_bucketed`, ...). A function that raises
`NotImplementedError` is "not implemented yet": callers list that implementation as skipped.
A module that cannot be imported, or defines none of these names, is an `AdapterError` (one line;
the CLIs turn it into exit status 2).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from .editions import (
    ADAPTER_NAMES,
    ADAPTERS_2025,
    ADAPTERS_2026,
    edition_of_names,
)
from .errors import UsageError
from .loading import (
    UserImportError,
    hung_before,
    import_user_module,
    note_hung,
    put_first_on_path,
    reading_user_names,
    repo_paths,
)
from .usercode import UserCodeTimeout, guarded, import_limit_s

FLASH_ADAPTERS = {
    "pytorch": "get_flashattention_autograd_function_pytorch",
    "triton": "get_flashattention_autograd_function_triton",
}


def add_adapters_argument(parser, help: str) -> None:
    """`--adapters MODULE`, the student's adapters module, as every tool that reads one spells it; `help`
    says what the tool takes from it."""
    parser.add_argument("--adapters", metavar="MODULE", help=help)


class AdapterError(UsageError):
    """The adapters module cannot be used at all (import failure, no adapter defined)."""


class MissingAdapter(LookupError):
    """The module does not define this adapter."""


class NotImplementedAdapter(Exception):
    """The adapter raised NotImplementedError: the student has not written it yet (skip, not error)."""


class BadAdapter(TypeError):
    """The adapter ran but returned something unusable (e.g. not an autograd Function)."""


def _import(spec: str) -> ModuleType:
    path = Path(spec)
    file = spec.endswith(".py") or path.is_file()
    if file and not path.is_file():
        raise AdapterError(f"--adapters {spec}: no such file")
    if file:
        # Their file imports what it imports under pytest: the repository root's packages (kept on
        # the path, spawned ranks inherit it) and its siblings (for the import only).
        put_first_on_path(*repo_paths(path))
    name = f"_student_adapters_{abs(hash(str(path.resolve())))}" if file else spec
    try:
        return import_user_module(name, file=path if file else None)
    except UserImportError as exc:
        raise AdapterError(f"--adapters {spec}: {exc}") from exc.__cause__


@dataclass
class Adapters:
    """The adapter functions one module defines, looked up by the handout's names."""

    spec: str
    module: ModuleType
    functions: dict[str, Callable] = field(default_factory=dict)

    def has(self, name: str) -> bool:
        return name in self.functions

    @property
    def edition(self) -> str:
        """Which handout's names the module uses: '2026', '2025', 'both' (a module with neither
        edition's own names, FlashAttention-2 only, reads as 2026)."""
        return edition_of_names(self.functions) or "2026"

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Call adapter `name`; NotImplementedAdapter if it raises NotImplementedError,
        MissingAdapter if the module lacks it. Other exceptions are the student's and propagate; a getter
        (get_*) that exits or takes longer than an import may (usercode.import_limit_s) raises UserCodeError /
        UserCodeTimeout; one that hung is not waited for again in the run (a row per configuration asks it)."""
        if name not in self.functions:
            raise MissingAdapter(f"{self.spec} defines no {name}")
        # a getter only builds or returns something: it gets an import's limit, not a step's
        limit = import_limit_s() if name.startswith("get_") else None
        shown = f"{self.spec}:{name}()"
        if limit and (why := hung_before(shown)) is not None:
            raise UserCodeTimeout(f"{why} (earlier in this run: not tried again)")
        try:
            with guarded(f"{name}()", limit) if limit else contextlib.nullcontext():
                return self.functions[name](*args, **kwargs)
        except UserCodeTimeout as exc:
            if limit:
                note_hung(shown, str(exc))
            raise
        except NotImplementedError as exc:
            raise NotImplementedAdapter(f"{name} is not implemented yet (raises NotImplementedError)") from exc

    def wrapper(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """call() of a getter that wraps the model (get_ddp, get_fsdp): BadAdapter unless it returns a Module."""
        import torch

        wrapped = self.call(name, *args, **kwargs)
        if not isinstance(wrapped, torch.nn.Module):
            raise BadAdapter(f"{name}() returned {type(wrapped).__name__} {wrapped!r:.60}, not a torch.nn.Module")
        return wrapped

    def flash_function(self, kind: str) -> type:
        """The student's FlashAttention-2 autograd Function class ('pytorch' or 'triton')."""
        import torch

        name = FLASH_ADAPTERS[kind]
        function = self.call(name)
        if not (isinstance(function, type) and issubclass(function, torch.autograd.Function)):
            raise BadAdapter(
                f"{name}() returned {type(function).__name__} {function!r:.60}, not a torch.autograd.Function class"
            )
        return function


def load_adapters(spec: str) -> Adapters:
    """Import `spec` (dotted module name or path to a .py file) and collect its adapter functions."""
    module = _import(spec)
    with reading_user_names(f"--adapters {spec}: reading its names", AdapterError):
        functions = {name: getattr(module, name) for name in ADAPTER_NAMES if callable(getattr(module, name, None))}
    if not functions:
        raise AdapterError(
            f"--adapters {spec}: defines none of the official adapter functions "
            f"(e.g. {ADAPTERS_2026[0]}, get_ddp, {ADAPTERS_2025[0]})"
        )
    return Adapters(spec=spec, module=module, functions=functions)
