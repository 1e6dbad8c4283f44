"""The optimizer a train-step uses (the benchmark, DDP and the loader's training loop),
or a user's own (`--optimizer package.module:callable`, e.g. their AdamW)."""

from __future__ import annotations

import torch
from torch import nn

from .loading import load_callable

# The hyperparameters a user's optimizer is called with (torch's AdamW defaults, our lr).
OPTIMIZER_KWARGS = dict(lr=1e-4, weight_decay=0.01, betas=(0.9, 0.999), eps=1e-8)


class OptimizerFactoryError(ValueError):
    """A user's --optimizer that cannot be imported, called or used."""


def load_optimizer_factory(spec: str):
    return load_callable(spec, "--optimizer", OptimizerFactoryError)


def make_optimizer(
    model: nn.Module, device: torch.device, factory: str | None = None, capturable: bool = False
) -> torch.optim.Optimizer:
    if capturable:  # --cuda-graphs: the step count is a device tensor, so the update can be captured and replayed
        return torch.optim.AdamW(model.parameters(), capturable=True, foreach=True, **OPTIMIZER_KWARGS)
    if factory is None:
        # Fused AdamW: one kernel for all parameters instead of several per tensor.
        return torch.optim.AdamW(model.parameters(), fused=device.type in ("cuda", "cpu"), **OPTIMIZER_KWARGS)
    make = load_optimizer_factory(factory)
    try:
        optimizer = make(model.parameters(), **OPTIMIZER_KWARGS)
    except (torch.OutOfMemoryError, MemoryError):
        raise
    except Exception as exc:
        raise OptimizerFactoryError(f"--optimizer {factory} raised {type(exc).__name__}: {exc}") from exc
    if not callable(getattr(optimizer, "step", None)) or not callable(getattr(optimizer, "zero_grad", None)):
        raise OptimizerFactoryError(f"--optimizer {factory} returned {type(optimizer).__name__}, which has no step()/zero_grad()")
    return optimizer


def optimizer_name(optimizer: object) -> str:
    """What ran, as the record states it: the class, and 'fused' for torch's fused kernels."""
    cls = type(optimizer)
    name = f"{cls.__module__}.{cls.__qualname__}"
    fused = getattr(optimizer, "defaults", {}).get("fused") if isinstance(optimizer, torch.optim.Optimizer) else None
    return f"{name} (fused)" if fused else name
