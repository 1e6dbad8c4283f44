"""NVTX ranges for Nsight Systems: named spans of a step that `nsys` shows on its timeline.

    from cs336_systems import nvtx
    nvtx.enable()                      # once, from a CLI flag (--nvtx)
    with nvtx.range("attention/softmax"):
        probs = torch.softmax(scores, dim=-1)

Ranges are pushed only when enabled *and* CUDA is available; otherwise `range` returns
one shared `contextlib.nullcontext`, so the disabled path costs a function call and a
global read (~0.1 us, see tests/test_nvtx.py). While torch.compile traces a function the
ranges are left out too, so they never break its graph: a compiled model shows the ranges
around it (forward, backward, optimizer) but not those inside attention; profile the eager
model to see those.

With `enable(blocks=True)` (`--nvtx blocks`) each Transformer block's forward is also a
range, "block/0", "block/1", ...: the handout's per-block memory question reads
memory off the timeline by these.

`capture` marks the measured steps: an NVTX range plus cudaProfilerStart/Stop, so
`nsys profile --capture-range=cudaProfilerApi` (the Nsight Systems wrapper in scripts/) records only them.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import TypeVar

import torch

_enabled = False
_blocks = False
LEVELS = ("steps", "blocks")  # --nvtx [steps|blocks]: steps and phases (and attention), or each block too
_DISABLED = contextlib.nullcontext()

F = TypeVar("F", bound=Callable)


def enable(on: bool = True, blocks: bool = False) -> bool:
    """Turn ranges on (or off), with a range per Transformer block if `blocks`.
    Returns whether ranges are now emitted: False without CUDA."""
    global _enabled, _blocks
    _enabled = bool(on) and torch.cuda.is_available()
    _blocks = _enabled and blocks
    return _enabled


def disable() -> None:
    enable(False)


def is_enabled() -> bool:
    return _enabled


class _Range:
    """Push on enter, pop on exit (also when the body raises, so the stack stays balanced)."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __enter__(self) -> None:
        torch.cuda.nvtx.range_push(self.name)

    def __exit__(self, *exc_info) -> bool:
        torch.cuda.nvtx.range_pop()
        return False


def range(name: str) -> contextlib.AbstractContextManager:  # noqa: A001 (reads as nvtx.range, like torch's)
    """A context manager around one named NVTX range; a shared no-op when disabled.

    Its signature fits runner's `phase` callback: `phase=nvtx.range` wraps forward,
    backward and optimizer in ranges of those names.
    """
    return _Range(name) if _enabled and not torch.compiler.is_compiling() else _DISABLED


def block(index: int) -> contextlib.AbstractContextManager:
    """The range "block/<index>" around one Transformer block, when block ranges are on."""
    return _Range(f"block/{index}") if _blocks and _enabled and not torch.compiler.is_compiling() else _DISABLED


def annotate(name: str) -> Callable[[F], F]:
    """Decorator: every call of the function runs inside `range(name)`."""

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def wrapped(*args, **kwargs):
            with range(name):
                return function(*args, **kwargs)

        return wrapped  # type: ignore[return-value]

    return decorate


@contextlib.contextmanager
def capture(name: str = "measured") -> Iterator[None]:
    """The region a profiler should record: cudaProfilerStart, range `name`, ..., cudaProfilerStop.

    Under `nsys profile --capture-range=cudaProfilerApi` only this region is collected.
    Outside a profiler the start/stop calls do nothing.
    """
    if not _enabled:
        yield
        return
    torch.cuda.profiler.start()
    try:
        with _Range(name):
            yield
    finally:
        torch.cuda.synchronize()  # the last step's kernels belong to the capture
        torch.cuda.profiler.stop()
