"""The device a run uses, and how a failure on it becomes a row.

Out-of-memory is an expected result ('oom'), any other failure is 'error'; both are one
line. `release_memory` returns what a failed or finished configuration held, so a sweep
can go on in the same process.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import gc
import shutil

import torch

from .errors import UsageError
from .usercode import UserCodeError, UserCodeTimeout

OOM_MESSAGE_MARKERS = ("out of memory", "can't allocate memory", "defaultcpuallocator")


class DeviceError(UsageError):
    """A device the user asked for that this machine does not have."""


def resolve_device(name: str) -> torch.device:
    """'auto' is CUDA when present, else CPU. Asking for CUDA without it is a user error."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise DeviceError(f"unknown device {name!r}: use auto, cpu, cuda or cuda:N") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"--device {name}: CUDA is not available on this machine")
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise DeviceError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) present")
        device = torch.device("cuda", index)
    elif device.type != "cpu":
        raise DeviceError(f"unknown device {name!r}: use auto, cpu, cuda or cuda:N")
    return device


def is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in OOM_MESSAGE_MARKERS)


def first_line(exc: BaseException) -> str:
    """The message's first line; where that is only a header ending in ':' (Triton's
    CompilationError: 'at 123:16:', then the source, then the reason), the reason after it."""
    text = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not text:
        return type(exc).__name__
    if text[0].endswith(":") and len(text) > 1:
        return f"{text[0]} ... {text[-1]}"
    return text[0]


def failure_status(exc: BaseException) -> tuple[str, str]:
    """(status, error) of the row for a configuration that raised `exc`."""
    if is_out_of_memory(exc):
        return "oom", first_line(exc)
    if isinstance(exc, UserCodeTimeout):
        return "timeout", first_line(exc)
    if isinstance(exc, UserCodeError):  # its message names what the code did
        return "error", first_line(exc)
    return "error", f"{type(exc).__name__}: {first_line(exc)}"


@functools.cache
def libc() -> ctypes.CDLL | None:
    """The C library (glibc's malloc_trim and mallopt), or None where it cannot be loaded."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def return_freed_heap_to_os() -> None:
    """glibc keeps freed memory resident; without this a process's RSS only ever grows,
    and RSS-based measurements of a later configuration would reuse an earlier one's pages."""
    trim = getattr(libc(), "malloc_trim", None)  # absent outside glibc
    if trim is not None:
        trim(0)


def release_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        # after a device-side assert the context is lost and every call raises it again: the
        # failed row already holds that error, and must not be replaced by a traceback here
        with contextlib.suppress(RuntimeError):
            torch.cuda.empty_cache()
    else:
        return_freed_heap_to_os()


def compile_unsupported_reason(device: torch.device) -> str | None:
    if not torch._dynamo.is_dynamo_supported():
        return "torch.compile is not supported on this Python/platform"
    if device.type == "cpu" and not (shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")):
        return "torch.compile on CPU needs a C++ compiler (g++ or clang++) on PATH"
    return None
