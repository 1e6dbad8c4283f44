"""Memory per rank (the handout's optimizer-state sharding and FSDP accounting):
the bytes of parameters, gradients and optimizer state a rank really holds, counted from its
tensors, and the estimator's prediction with each divided as the strategy divides it."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..config import BenchmarkConfig
from ..memory.estimate import estimate_memory


def local_bytes(tensor: torch.Tensor) -> int:
    """Bytes this rank stores for `tensor`: a DTensor's local shard only."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def _state(optimizer: object) -> dict:
    """The optimizer's per-parameter state; {} for one that keeps none of its own (a student's sharded
    optimizer that never calls Optimizer.__init__ and holds a local optimizer instead)."""
    state = vars(optimizer).get("state") if hasattr(optimizer, "__dict__") else None
    return state if isinstance(state, dict) else {}


def _wrapped(optimizer: object) -> list:
    """Optimizers `optimizer` keeps as attributes (ZeRO's `optim`, a student's local one)."""
    return [
        attribute
        for attribute in getattr(optimizer, "__dict__", {}).values()
        if isinstance(attribute, torch.optim.Optimizer) and attribute is not optimizer
    ]


def _optimizer_tensors(optimizer: torch.optim.Optimizer, seen: set[int]) -> list[torch.Tensor]:
    """The state tensors of `optimizer`, and of optimizers it wraps (ZeRO's `optim`, a student's
    sharded optimizer holding a local one), each counted once."""
    seen.add(id(optimizer))
    found = []
    for state in _state(optimizer).values():
        for value in state.values() if isinstance(state, dict) else ():
            if isinstance(value, torch.Tensor) and id(value) not in seen and value.dim() > 0:
                seen.add(id(value))  # a 0-dim `step` counter is not state worth counting
                found.append(value)
    for inner in _wrapped(optimizer):
        if id(inner) not in seen:
            found += _optimizer_tensors(inner, seen)
    return found


def _state_keys(optimizer: torch.optim.Optimizer, seen: set[int]) -> set[int]:
    """ids of the tensors (parameters) `optimizer` and the optimizers it wraps keep state for."""
    seen.add(id(optimizer))
    keys = {id(key) for key, state in _state(optimizer).items() if state}
    for inner in _wrapped(optimizer):
        if id(inner) not in seen:
            keys |= _state_keys(inner, seen)
    return keys


def stateful_param_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of this rank's parameters the optimizer keeps state for: all of them unless the
    optimizer is sharded (0 for a stateless one, such as SGD without momentum)."""
    keys = _state_keys(optimizer, set())
    return sum(local_bytes(p) for p in {id(p): p for p in model.parameters()}.values() if id(p) in keys)


def measured_sharding(
    strategy: str, full_param_bytes: int, param_bytes: int, stateful_bytes: int, declared: tuple[bool, bool, bool]
) -> tuple[bool, bool, bool]:
    """What a student's strategy really divides, from the bytes a rank holds: parameters (and so
    gradients) when it holds fewer parameter bytes than the model has; optimizer state when its
    optimizer keeps state for fewer than all of them. Built-in strategies keep their declaration."""
    if not strategy.startswith("adapter-"):
        return declared
    params = declared[0] and param_bytes < full_param_bytes
    state = declared[2] and (params or 0 < stateful_bytes < param_bytes)
    return (params, params, state)


@dataclass(frozen=True)
class HeldBytes:
    param_bytes: int
    grad_bytes: int
    optimizer_state_bytes: int


def held_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> HeldBytes:
    """What this rank holds after a step, counted from its tensors (a DDP's bucket buffers and a
    student's unregistered copies are not parameters, so not counted)."""
    params = {id(p): p for p in model.parameters()}.values()
    return HeldBytes(
        param_bytes=sum(local_bytes(p) for p in params),
        grad_bytes=sum(local_bytes(p.grad) for p in params if p.grad is not None),
        optimizer_state_bytes=sum(local_bytes(t) for t in _optimizer_tensors(optimizer, set())),
    )


def predicted_peak_bytes(
    config: BenchmarkConfig, sharding: tuple[bool, bool, bool], world_size: int, optimizer: str
) -> int | None:
    """The estimator's peak of one step (cs336_systems.memory.estimate, AdamW) with parameters,
    gradients and optimizer state replaced by the 1/N each rank keeps where the strategy shards
    them. Activations are unchanged; FSDP's one unsharded block at a time is left out. None for a
    user's model or optimizer."""
    if config.model_factory is not None or ":" in optimizer:
        return None  # the estimator knows our model and torch's optimizers only
    estimate = estimate_memory(
        config.model,
        config.batch_size,
        config.context_length,
        "train-step",
        config.precision,
        torch.device(config.device).type,
    )
    optimizer_state = estimate.optimizer_state if optimizer == "adamw" else 0
    peak = estimate.peak_bytes - (estimate.optimizer_state - optimizer_state)
    for sharded, held in zip(sharding, (estimate.parameters, estimate.gradients, optimizer_state), strict=True):
        if sharded:
            peak -= held - held // world_size
    return peak
