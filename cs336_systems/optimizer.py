"""The optimizer a train-step uses (the benchmark, DDP and the loader's training loop)."""

from __future__ import annotations

import torch
from torch import nn


def make_optimizer(model: nn.Module, device: torch.device) -> torch.optim.Optimizer:
    # Fused AdamW: one kernel for all parameters instead of several per tensor.
    return torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type in ("cuda", "cpu"))
