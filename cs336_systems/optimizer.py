"""The optimizer a train-step uses (the benchmark, DDP and the loader's training loop),
or a user's own (`--optimizer package.module:callable`, e.g. their AdamW)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from .errors import UsageError
from .loading import fit_keywords, load_callable
from .usercode import UserCodeError, UserCodeTimeout, guarded, import_limit_s

# The hyperparameters a user's optimizer is given where its signature takes them (torch's AdamW
# defaults, our lr): an assignment-1 AdamW often requires all four.
OPTIMIZER_KWARGS = dict(lr=1e-4, weight_decay=0.01, betas=(0.9, 0.999), eps=1e-8)


class OptimizerFactoryError(UsageError):
    """A user's --optimizer that cannot be imported, called or used."""


@dataclass(frozen=True)
class UserOptimizer:
    """A user's --optimizer as every tool builds it: `make` as they wrote it (a class stays a class: a
    student's sharded optimizer may check that it subclasses torch.optim.Optimizer) and the
    OPTIMIZER_KWARGS its signature takes, so `make(params, **keywords)` is the one call."""

    spec: str
    make: Callable
    keywords: dict

    def __call__(self, params, **overrides) -> torch.optim.Optimizer:
        """`make(params, **keywords)`, `overrides` (ddp_bench's scaled lr) replacing the keywords it takes."""
        keywords = {**self.keywords, **{k: v for k, v in overrides.items() if k in self.keywords}}
        try:
            optimizer = self.make(params, **keywords)
        except (torch.OutOfMemoryError, MemoryError, UserCodeTimeout):
            raise
        except Exception as exc:
            raise OptimizerFactoryError(f"--optimizer {self.spec} raised {type(exc).__name__}: {exc}") from exc
        if not callable(getattr(optimizer, "step", None)) or not callable(getattr(optimizer, "zero_grad", None)):
            raise OptimizerFactoryError(
                f"--optimizer {self.spec} returned {type(optimizer).__name__}, which has no step()/zero_grad()"
            )
        return optimizer


def load_user_optimizer(spec: str) -> UserOptimizer:
    """The user's callable and the hyperparameters it takes; a parameter none of them fills (besides
    the parameters, its first argument) is an OptimizerFactoryError naming it."""
    make = load_callable(spec, "--optimizer", OptimizerFactoryError)
    keywords, unfilled = fit_keywords(make, OPTIMIZER_KWARGS, positional=1)
    if unfilled:
        raise OptimizerFactoryError(
            f"--optimizer {spec}: cannot fill its parameter {unfilled[0]!r}; it is called with the parameters and "
            f"{', '.join(OPTIMIZER_KWARGS)}; give {unfilled[0]!r} a default or wrap the callable"
        )
    return UserOptimizer(spec, make, keywords)


def check_user_optimizer(spec: str) -> UserOptimizer:
    """Load the user's optimizer and build it once on a dummy parameter, before any model, rank or
    worker exists: one that cannot be built is an OptimizerFactoryError (one line) now, not in every row."""
    optimizer = load_user_optimizer(spec)
    given = nn.Parameter(torch.zeros(2))
    # torch.optim.Optimizer's first build imports torch._dynamo (seconds on a busy machine): ours, not the user's time
    importlib.import_module("torch._dynamo")
    try:
        with guarded(f"--optimizer {spec}", import_limit_s()):
            built = optimizer([given])
    except (UserCodeError, UserCodeTimeout) as exc:
        raise OptimizerFactoryError(f"--optimizer {spec}: building it on one parameter failed: {exc}") from None
    held = held_parameters(built)
    if held is not None and id(given) not in held:  # its steps would train nothing of the model's
        raise OptimizerFactoryError(
            f"--optimizer {spec}: built on one parameter, its param_groups hold {len(held)} others and not that "
            "one; it must optimize the parameters it is called with"
        )
    return optimizer


def held_parameters(optimizer: object) -> set[int] | None:
    """ids of the tensors in the param_groups of `optimizer` and of optimizers it keeps as attributes
    (a sharded optimizer's local one); None where none has param_groups to read."""
    found, seen = None, set()

    def walk(candidate: object) -> None:
        nonlocal found
        if id(candidate) in seen:
            return
        seen.add(id(candidate))
        groups = vars(candidate).get("param_groups") if hasattr(candidate, "__dict__") else None
        if isinstance(groups, list):
            found = found or set()
            for group in groups:
                params = group.get("params", ()) if isinstance(group, dict) else ()
                found |= {id(p) for p in params if isinstance(p, torch.Tensor)}
        for attribute in getattr(candidate, "__dict__", {}).values():
            if hasattr(attribute, "step") and hasattr(attribute, "zero_grad"):
                walk(attribute)

    walk(optimizer)
    return found


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
    return load_user_optimizer(factory)(model.parameters())


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


OPTIMIZER_UNCHANGED_NOTE = (
    "the optimizer's step() left every parameter unchanged (checked on an untimed step): the optimizer part of "
    "these times updated nothing (an fp16 GradScaler skips steps whose gradients overflow)"
)
PARAMETER_SAMPLE = 64  # elements per parameter compared before and after a step: any real update changes them


def parameter_sample(model: nn.Module) -> list[torch.Tensor]:
    """A strided sample of every parameter, copied: enough to see whether a step changed it."""
    samples = []
    for parameter in model.parameters():
        flat = parameter.detach().reshape(-1)
        samples.append(flat[:: max(1, flat.numel() // PARAMETER_SAMPLE)].clone())
    return samples
