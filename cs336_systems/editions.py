"""Which CS336 assignment 2 (systems) handout edition a student's repository follows, told from the
names of its official adapters (tests/adapters.py), read without importing it. Each edition's
problems are the handout's own (handout/problems/).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ADAPTERS_2026 = (
    "get_flashattention_autograd_function_pytorch",
    "get_flashattention_autograd_function_triton",
    "get_ddp",
    "ddp_on_after_backward",
    "get_fsdp",
    "fsdp_on_after_backward",
    "fsdp_gather_full_params",
    "get_sharded_optimizer",
)
ADAPTERS_2025 = (
    "get_ddp_individual_parameters",
    "ddp_individual_parameters_on_after_backward",
    "get_ddp_bucketed",
    "ddp_bucketed_on_after_backward",
    "ddp_bucketed_on_train_batch_start",
    "get_sharded_optimizer",
)
ADAPTER_NAMES = tuple(dict.fromkeys(ADAPTERS_2026 + ADAPTERS_2025))
# The names that tell the editions apart (FlashAttention-2 and get_sharded_optimizer are in both).
EDITION_2026_NAMES = (
    "get_ddp",
    "ddp_on_after_backward",
    "get_fsdp",
    "fsdp_on_after_backward",
    "fsdp_gather_full_params",
)
EDITION_2025_NAMES = tuple(name for name in ADAPTERS_2025 if name not in ADAPTERS_2026)


def edition_of_names(names: Iterable[str]) -> str | None:
    """'2026' (get_ddp, get_fsdp, fsdp_*), '2025' (get_ddp_individual_parameters, get_ddp_bucketed, ...),
    'both', or None when the names say neither."""
    names = set(names)
    new = bool(names & set(EDITION_2026_NAMES)) or any(name.startswith("fsdp_") for name in names)
    old = bool(names & set(EDITION_2025_NAMES))
    return "both" if new and old else "2026" if new else "2025" if old else None


def edition_of_file(path: str | Path) -> str | None:
    """The edition of an adapters file from the top-level functions it defines, read with ast: the
    file is never imported (this runs before any tool decides what a size name means). None when
    it cannot be read or says neither edition."""
    try:
        tree = ast.parse(Path(path).read_text(), str(path))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    names = [node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return edition_of_names(names)
