"""The optimizer a train-step uses (the benchmark, DDP and the loader's training loop)."""

from __future__ import annotations

import torch
from torch import nn

LEARNING_RATE = 1e-4


def make_optimizer(model: nn.Module, device: torch.device, capturable: bool = False) -> torch.optim.Optimizer:
    if capturable:  # --cuda-graphs: the step count is a device tensor, so the update can be captured and replayed
        return torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, capturable=True, foreach=True)
    # Fused AdamW: one kernel for all parameters instead of several per tensor.
    return torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, fused=device.type in ("cuda", "cpu"))
