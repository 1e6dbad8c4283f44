"""One attention configuration: implementation, shape, precision and timing budget."""

from __future__ import annotations

from dataclasses import dataclass

from ..models import ConfigError
from ..precision import PRECISION_TABLE
from ..timing import TIMERS  # noqa: F401 (the same three; do-bench falls back here where benchmark refuses it)
from .names import (  # noqa: F401  (the flags' names, torch-free)
    BUILTIN_IMPLEMENTATIONS,
    FLASH_IMPLEMENTATIONS,
    IMPLEMENTATIONS,
    LAYOUTS,
    PASSES,
    is_custom,
)

TENSOR_DTYPES = {name: mode.compute_dtype for name, mode in PRECISION_TABLE.items()}  # q, k, v (no autocast)

# Largest allowed |implementation - fp32 naive reference|, per dtype of q, k, v, as a fraction of
# max(1, max |reference|) of the compared tensor (output, dq, dk or dv). fp32 leaves room for a
# different summation order over long rows; tf32 and fp16 have 10-bit mantissas (eps ~1e-3);
# bf16 has 7 (eps ~8e-3), so a few roundings of O(1) values reach 1e-2. The official tests'
# FlashAttention tolerance is 1e-2 (absolute and relative).
TOLERANCES = {"fp32": 1e-4, "tf32": 5e-3, "fp16": 5e-3, "bf16": 3e-2}


@dataclass(frozen=True)
class AttentionConfig:
    implementation: str
    head_dim: int
    context_length: int
    batch_size: int = 1
    num_heads: int = 1
    layout: str = "bhsd"
    causal: bool = True
    precision: str = "fp32"
    device: str = "cpu"
    timer: str = "host"
    warmup_steps: int = 5
    measure_steps: int = 100
    max_seconds: float | None = None
    seed: int = 0
    adapters: str | None = None  # the --adapters module the flash-* implementations come from

    def __post_init__(self) -> None:
        if self.layout == "bsd" and self.num_heads != 1:
            raise ConfigError(f"--layout bsd has no head axis: use --num-heads 1, not {self.num_heads}")

    @property
    def shape(self) -> tuple[int, ...]:
        if self.layout == "bsd":
            return (self.batch_size, self.context_length, self.head_dim)
        return (self.batch_size, self.num_heads, self.context_length, self.head_dim)

    @property
    def forward_flops(self) -> int:
        """QK^T and PV: two (T x d) @ (d x T)-sized matmuls per batch element and head, full square
        (causal included: the convention of flops.py, whatever an implementation skips)."""
        return 2 * 2 * self.batch_size * self.num_heads * self.context_length**2 * self.head_dim

    @property
    def scores_bytes(self) -> int:
        """One (batch, heads, T, T) score matrix: what the naive implementation materialises."""
        return self.batch_size * self.num_heads * self.context_length**2 * TENSOR_DTYPES[self.precision].itemsize
