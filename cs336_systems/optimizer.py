"""The optimizer a train-step uses (the benchmark, DDP and the loader's training loop),
or a user's own (`--optimizer package.module:callable`, e.g. their AdamW)."""

from __future__ import annotations

import torch
from torch import nn

from .loading import load_callable
from .usercode import DEFAULT_IMPORT_TIMEOUT_S, UserCodeTimeout

# The hyperparameters a user's optimizer is called with (torch's AdamW defaults, our lr).
OPTIMIZER_KWARGS = dict(lr=1e-4, weight_decay=0.01, betas=(0.9, 0.999), eps=1e-8)


class OptimizerFactoryError(ValueError):
    """A user's --optimizer that cannot be imported, called or used."""


def load_optimizer_factory(spec: str, import_timeout_s: float = DEFAULT_IMPORT_TIMEOUT_S):
    return load_callable(spec, "--optimizer", OptimizerFactoryError, import_timeout_s)


class MasterWeights:
    """Low-precision parameters (--param-dtype bf16) stepped through float32 master copies.

    The inner optimizer (`make_inner(masters)`) holds the fp32 copies and its own fp32 state;
    each step casts the gradients up into the copies, steps them, and writes the result back
    into the model's parameters (mixed-precision training as in Micikevicius et al., 2018).
    """

    def __init__(self, params, make_inner):
        self.params = [p for p in params if p.requires_grad]
        self.masters = [nn.Parameter(p.detach().float()) for p in self.params]
        self.inner = make_inner(self.masters)

    @property
    def param_groups(self):
        return self.inner.param_groups

    @property
    def state(self):
        return self.inner.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for p, master in zip(self.params, self.masters, strict=True):
            master.grad = None if p.grad is None else p.grad.float()
        self.inner.step()
        for p, master in zip(self.params, self.masters, strict=True):
            p.copy_(master)
            master.grad = None  # the fp32 gradient copies live only during the step


def make_optimizer(
    model: nn.Module,
    device: torch.device,
    factory: str | None = None,
    capturable: bool = False,
    master_weights: bool = False,
) -> torch.optim.Optimizer | MasterWeights:
    """torch's AdamW (fused) or the user's; `master_weights`: over fp32 copies of bf16 parameters."""
    if master_weights:
        inner = torch.nn.Module()
        return MasterWeights(
            model.parameters(), lambda masters: make_optimizer(_holding(inner, masters), device, factory)
        )
    if capturable:  # --cuda-graphs: the step count is a device tensor, so the update can be captured and replayed.
        # Fused, not foreach: one pass over parameters and state (~28 bytes per parameter moved,
        # foreach ~88, plus a parameter-sized temporary).
        return torch.optim.AdamW(model.parameters(), capturable=True, fused=True, **OPTIMIZER_KWARGS)
    if factory is None:
        # Fused AdamW: one kernel for all parameters instead of several per tensor.
        return torch.optim.AdamW(model.parameters(), fused=device.type in ("cuda", "cpu"), **OPTIMIZER_KWARGS)
    make = load_optimizer_factory(factory)
    try:
        optimizer = make(model.parameters(), **OPTIMIZER_KWARGS)
    except (torch.OutOfMemoryError, MemoryError, UserCodeTimeout):
        raise
    except Exception as exc:
        raise OptimizerFactoryError(f"--optimizer {factory} raised {type(exc).__name__}: {exc}") from exc
    if not callable(getattr(optimizer, "step", None)) or not callable(getattr(optimizer, "zero_grad", None)):
        raise OptimizerFactoryError(
            f"--optimizer {factory} returned {type(optimizer).__name__}, which has no step()/zero_grad()"
        )
    return optimizer


def _holding(module: nn.Module, params: list[nn.Parameter]) -> nn.Module:
    """`module` holding `params` (what make_optimizer takes)."""
    for index, param in enumerate(params):
        module.register_parameter(f"p{index}", param)
    return module


def optimizer_name(optimizer: object) -> str:
    """What ran, as the record states it: the class, and 'fused' for torch's fused kernels."""
    if isinstance(optimizer, MasterWeights):
        return f"{optimizer_name(optimizer.inner)} over fp32 master weights"
    cls = type(optimizer)
    name = f"{cls.__module__}.{cls.__qualname__}"
    fused = getattr(optimizer, "defaults", {}).get("fused") if isinstance(optimizer, torch.optim.Optimizer) else None
    return f"{name} (fused)" if fused else name
