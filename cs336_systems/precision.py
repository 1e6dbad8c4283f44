"""Numeric modes: fp32 / tf32 / bf16 / fp16 autocast, and what was really in effect.

fp32  float32 matmuls at "highest" precision, cuDNN TF32 off: true IEEE fp32.
tf32  float32 tensors, matmuls and convolutions on TF32 tensor cores ("high").
bf16  torch.autocast to bfloat16 (fp32 weights and master copy), fp32 matmul "highest".
fp16  torch.autocast to float16; backward passes go through a GradScaler.

PRECISION_TABLE is the one place a precision is described: setup (precision_mode,
autocast, grad_scaler), flops (peak column, probe dtype), the memory estimator (bytes of
autocast outputs) and attention_bench (q, k, v dtype) read it; a new precision is one row.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from .argtypes import PRECISIONS


@dataclass(frozen=True)
class Precision:
    name: str
    compute_dtype: torch.dtype  # what matmuls run in: the autocast dtype, else float32 (TF32 or not)
    autocast_dtype: torch.dtype | None  # forward and loss under torch.autocast; weights stay float32
    matmul_precision: str  # torch.set_float32_matmul_precision
    tf32: bool  # cuDNN convolutions on TF32 tensor cores
    grad_scaler: bool  # fp16 gradients underflow without loss scaling
    peak_column: str  # column of flops.PEAK_TFLOPS_TABLE (fp16 tensor-core peak = bf16's)
    needs_ampere: bool  # compute capability 8.0+
    on_cpu: bool  # CPUs have no TF32


PRECISION_TABLE = {
    p.name: p
    for p in (
        Precision("fp32", torch.float32, None, "highest", False, False, "fp32", needs_ampere=False, on_cpu=True),
        Precision("tf32", torch.float32, None, "high", True, False, "tf32", needs_ampere=True, on_cpu=False),
        Precision("bf16", torch.bfloat16, torch.bfloat16, "highest", False, False, "bf16", True, True),
        Precision("fp16", torch.float16, torch.float16, "highest", False, True, "bf16", False, True),
    )
}
assert tuple(PRECISION_TABLE) == PRECISIONS, "argtypes.PRECISIONS names the table's rows"
AUTOCAST_DTYPES = {name: p.autocast_dtype for name, p in PRECISION_TABLE.items() if p.autocast_dtype is not None}


@dataclass(frozen=True)
class PrecisionState:
    """What was in effect while a configuration ran, read back from torch."""

    precision: str
    autocast_dtype: str | None
    matmul_precision: str
    cuda_matmul_allow_tf32: bool
    cudnn_allow_tf32: bool
    grad_scaler: bool


def unsupported_reason(precision: str, device: torch.device) -> str | None:
    """Why `precision` cannot run on `device`, or None if it can."""
    if precision not in PRECISION_TABLE:
        return f"unknown precision {precision!r}"
    mode = PRECISION_TABLE[precision]
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if mode.needs_ampere and major < 8:
            return f"{precision} needs an Ampere or newer GPU (compute capability 8.0+), this one is {major}.{minor}"
    elif device.type == "cpu" and not mode.on_cpu:
        return "TF32 is an NVIDIA tensor-core mode (Ampere+); CPUs have no TF32 matmul"
    return None


def cpu_has_native(precision: str) -> bool:
    """Whether this CPU has matmul instructions for the autocast dtype (else it is emulated)."""
    probes = {
        "bf16": ("_is_avx512_bf16_supported", "_is_amx_tile_supported"),
        "fp16": ("_is_amx_fp16_supported",),
    }.get(precision, ())
    if not probes:
        return True
    return any(getattr(torch.cpu, name, lambda: False)() for name in probes)


# TF32 has two APIs: the legacy flags (set_float32_matmul_precision, cuda.matmul.allow_tf32,
# cudnn.allow_tf32) and, since torch 2.9, `torch.backends.*.fp32_precision` ("ieee" / "tf32").
# Once anything in the process (a user's model, a library) sets the new one to a value the
# legacy flags cannot express, reading a legacy flag raises. We set both to the same values
# and read whichever answers. (PyTorch docs: CUDA semantics, TensorFloat-32.)
NEW_TF32_API = hasattr(torch.backends.cuda.matmul, "fp32_precision")


def _new_api_state() -> tuple[str, ...]:
    b = torch.backends
    return (b.fp32_precision, b.cuda.matmul.fp32_precision, b.cudnn.conv.fp32_precision, b.cudnn.rnn.fp32_precision)


def _tf32_on(value: str, fallback: str) -> bool:
    """A new-API value; "none" means the backend inherits the generic setting."""
    return (value if value != "none" else fallback) == "tf32"


def _current_flags() -> tuple[str, bool, bool]:
    """(float32 matmul precision, cuBLAS TF32, cuDNN TF32) in effect, whichever API set them."""
    try:
        return (
            torch.get_float32_matmul_precision(),
            bool(torch.backends.cuda.matmul.allow_tf32),
            bool(torch.backends.cudnn.allow_tf32),
        )
    except RuntimeError:  # the legacy flags disagree with the new API's values: read those
        generic, matmul, conv, _ = _new_api_state()
        cuda_tf32 = _tf32_on(matmul, generic)
        return ("high" if cuda_tf32 else "highest", cuda_tf32, _tf32_on(conv, generic))


def _set_flags(matmul_precision: str, cudnn_tf32: bool) -> None:
    """Both APIs, legacy first: equal values keep every later read of either working."""
    torch.set_float32_matmul_precision(matmul_precision)
    torch.backends.cudnn.allow_tf32 = cudnn_tf32
    if NEW_TF32_API:
        torch.backends.cuda.matmul.fp32_precision = "ieee" if matmul_precision == "highest" else "tf32"
        torch.backends.cudnn.conv.fp32_precision = "tf32" if cudnn_tf32 else "ieee"


@contextlib.contextmanager
def precision_mode(precision: str, device: torch.device) -> Iterator[PrecisionState]:
    """Set the global float32 matmul flags for `precision`; restore them on exit.

    Autocast itself is applied per step by `autocast`, so the step functions decide
    what runs inside it (forward and loss) and what does not (backward, optimizer).
    """
    saved = _current_flags()
    saved_new = _new_api_state() if NEW_TF32_API else None
    mode = PRECISION_TABLE[precision]
    _set_flags(mode.matmul_precision, mode.tf32)
    try:
        matmul_precision, cuda_tf32, cudnn_tf32 = _current_flags()
        dtype = mode.autocast_dtype
        yield PrecisionState(
            precision=precision,
            autocast_dtype=str(dtype).removeprefix("torch.") if dtype is not None else None,
            matmul_precision=matmul_precision,
            cuda_matmul_allow_tf32=cuda_tf32,
            cudnn_allow_tf32=cudnn_tf32,
            grad_scaler=mode.grad_scaler,
        )
    finally:
        torch.set_float32_matmul_precision(saved[0])
        torch.backends.cuda.matmul.allow_tf32 = saved[1]
        torch.backends.cudnn.allow_tf32 = saved[2]
        if saved_new is not None:  # as the process had them, new-API values included
            b = torch.backends
            b.fp32_precision, b.cuda.matmul.fp32_precision, b.cudnn.conv.fp32_precision, b.cudnn.rnn.fp32_precision = (
                saved_new
            )


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    dtype = AUTOCAST_DTYPES.get(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler | None:
    return torch.amp.GradScaler(device.type) if PRECISION_TABLE[precision].grad_scaler else None


@contextlib.contextmanager
def parameters_in(model: nn.Module, dtype: torch.dtype | None) -> Iterator[nn.Module]:
    """The model's parameters (not its buffers: RoPE's tables stay fp32) in `dtype` for the
    duration, float32 again afterwards (a reused model is left as it came). None: unchanged."""
    if dtype is None:
        yield model
        return
    params = list(model.parameters())
    with torch.no_grad():
        for p in params:
            p.data = p.data.to(dtype)
    try:
        yield model
    finally:
        with torch.no_grad():
            for p in params:
                p.grad = None
                p.data = p.data.float()


PARAM_CASTS = {"fp32": None, "bf16": torch.bfloat16}  # config.PARAM_DTYPES -> the cast (None: as built)
DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64"}


def built_dtype(model: nn.Module) -> str | None:
    """The parameters' dtype where a model uncast by --param-dtype was built in another than fp32 (a
    user's fp16 model): the row's param_dtype says what it trained, as --param-dtype bf16's does."""
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if not dtypes - {torch.float32}:
        return None
    return "+".join(sorted(DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch.")) for dtype in dtypes))
