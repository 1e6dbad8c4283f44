"""One attention configuration: implementation, shape, precision and timing budget."""

from __future__ import annotations

from dataclasses import dataclass

from cs336_systems.precision import PRECISION_TABLE

IMPLEMENTATIONS = ("naive", "sdpa", "compiled")
TENSOR_DTYPES = {name: mode.compute_dtype for name, mode in PRECISION_TABLE.items()}  # q, k, v (no autocast)
PASSES = ("forward", "backward")


@dataclass(frozen=True)
class AttentionConfig:
    implementation: str
    head_dim: int
    seq_len: int
    batch_size: int = 8
    precision: str = "fp32"
    device: str = "cpu"
    timer: str = "host"
    warmup_steps: int = 5
    steps: int = 100
    max_seconds: float | None = 30.0
    seed: int = 0

    @property
    def forward_flops(self) -> int:
        """QK^T and PV: two (T x d) @ (d x T)-sized matmuls per batch element, full square."""
        return 2 * 2 * self.batch_size * self.seq_len**2 * self.head_dim

    @property
    def scores_bytes(self) -> int:
        """One (batch, T, T) score matrix: what the naive implementation materialises."""
        return self.batch_size * self.seq_len**2 * TENSOR_DTYPES[self.precision].itemsize
