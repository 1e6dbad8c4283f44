"""How each data-parallel strategy wraps the model, builds the optimizer and syncs gradients.

A Strategy is four hooks around the one training step (step.make_step):
  wrap(module)                 the model the step calls (DDP, fully_shard, a student's wrapper)
  optimizer(model, cls, **kw)  the optimizer over what this rank steps (ZeRO shards its state)
  after_backward(model, opt)   in phase("optimizer"), before the step: naive/flat all-reduce,
                               the student's on_after_backward; timed as `comm_ms` when `timed_comm`
  full_parameters(model)       {name: full tensor} for the correctness check (DTensor.full_tensor()
                               for fsdp2, the student's fsdp_gather_full_params for adapter-fsdp)

`skip_sync` strategies can run a step without their gradient communication (DDP's no_sync):
their exposed communication is step - no_sync step.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..adapters import Adapters, NotImplementedAdapter, load_adapters
from ..distributed import all_reduce_mean

BUILT_IN = ("ddp", "naive", "flat", "zero1", "fsdp2")
ADAPTER_STRATEGIES = ("adapter-ddp", "adapter-ddp-bucketed", "adapter-sharded-optimizer", "adapter-fsdp")
STRATEGIES = BUILT_IN + ADAPTER_STRATEGIES
COMPUTE_DTYPES = {"fp32": None, "bf16": torch.bfloat16}

# How each strategy divides parameters, gradients and optimizer state over N ranks
# (True: 1/N on each rank), for the estimator's prediction.
SHARDING = {
    "single": (False, False, False),
    "ddp": (False, False, False),
    "naive": (False, False, False),
    "flat": (False, False, False),
    "zero1": (False, False, True),
    "fsdp2": (True, True, True),
    "adapter-ddp": (False, False, False),
    "adapter-ddp-bucketed": (False, False, False),
    "adapter-sharded-optimizer": (False, False, True),
    "adapter-fsdp": (True, True, True),
}


# the adapter functions each adapter-* strategy calls (any one of a tuple: 2026, then 2025 names)
REQUIRED_ADAPTERS = {
    "adapter-ddp": ("get_ddp", "get_ddp_individual_parameters"),
    "adapter-ddp-bucketed": ("get_ddp_bucketed",),
    "adapter-sharded-optimizer": ("get_sharded_optimizer",),
    "adapter-fsdp": ("get_fsdp",),
}


def missing_adapter(strategy: str, adapters: Adapters) -> str | None:
    """Why `strategy` cannot run with this adapters module (the other edition's file), or None."""
    names = REQUIRED_ADAPTERS.get(strategy, ())
    if not names or any(adapters.has(name) for name in names):
        return None
    return f"{adapters.spec} defines no {' or '.join(names)} (the handout edition it follows has none)"


@dataclass
class Setup:
    """What a strategy is built from, besides the model."""

    device: torch.device
    bucket_cap_mb: float | None = None
    compute_dtype: str = "fp32"  # fsdp2 / adapter-fsdp: the dtype forward and backward run in
    sync_buffers: bool = False  # DDP: re-broadcast buffers each step (a user's model may need it)
    adapters: str | None = None  # the --adapters module


def broadcast_parameters(module: nn.Module) -> None:
    """Start every rank from rank 0's weights, whatever a user's factory did."""
    for parameter in module.parameters():
        dist.broadcast(parameter.data, src=0)


def buffer_sync_option(sync: bool) -> dict[str, bool]:
    """DDP's flag for broadcasting buffers before each forward. Our model's only buffers are
    RoPE tables, equal on every rank by construction: re-sending them would be communication for
    nothing. (torch 2.13 renamed broadcast_buffers to forward_sync_buffers.)"""
    parameters = inspect.signature(DistributedDataParallel.__init__).parameters
    return {"forward_sync_buffers" if "forward_sync_buffers" in parameters else "broadcast_buffers": sync}


def all_reduce_each(module: nn.Module) -> None:
    """naive: one all-reduce per parameter gradient, then divide by the world size."""
    for parameter in module.parameters():
        if parameter.grad is not None:
            all_reduce_mean(parameter.grad)


def all_reduce_flat(module: nn.Module) -> None:
    """flat (the handout's minimal_ddp_flat): every gradient in one buffer, one all-reduce."""
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    if not grads:
        return
    flat = torch._utils._flatten_dense_tensors(grads)
    all_reduce_mean(flat)
    for grad, synced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads), strict=True):
        grad.copy_(synced)


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's whole value (a collective: every rank calls it), a plain tensor as it is."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


class Strategy:
    """The plain model: every hook does nothing (the `single` baseline)."""

    name = "single"
    skip_sync = False  # step(sync=False) leaves the gradient communication out
    timed_comm = False  # after_backward is the communication, timed directly

    def __init__(self, setup: Setup):
        self.setup = setup

    def wrap(self, module: nn.Module) -> nn.Module:
        return module

    def optimizer(self, model: nn.Module, cls: type, **kwargs: Any) -> torch.optim.Optimizer:
        return cls(model.parameters(), **kwargs)

    def after_backward(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        pass

    def before_step(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        pass

    @contextlib.contextmanager
    def unsynced(self, model: nn.Module) -> Iterator[None]:
        yield

    def full_parameters(self, model: nn.Module, module: nn.Module) -> dict[str, torch.Tensor]:
        return {name: full_tensor(p.detach()) for name, p in module.named_parameters()}

    def allreduces(self, model: nn.Module) -> int | None:
        """How many all-reduces share the gradients' bytes each step (the latency the links model pays),
        after a step; None where the strategy's communication is no such all-reduce (or unknown: a student's)."""
        return None


class Naive(Strategy):
    name, timed_comm, skip_sync = "naive", True, True

    def wrap(self, module):
        broadcast_parameters(module)
        return module

    def after_backward(self, model, optimizer):
        all_reduce_each(model)

    def allreduces(self, model):
        return sum(1 for parameter in model.parameters() if parameter.grad is not None)


class Flat(Naive):
    name = "flat"

    def after_backward(self, model, optimizer):
        all_reduce_flat(model)

    def allreduces(self, model):
        return 1


class Ddp(Strategy):
    name, skip_sync = "ddp", True

    def wrap(self, module):
        device = self.setup.device
        return DistributedDataParallel(
            module,
            device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=self.setup.bucket_cap_mb,
            **buffer_sync_option(self.setup.sync_buffers),
        )

    @contextlib.contextmanager
    def unsynced(self, model):
        with model.no_sync():
            yield

    def allreduces(self, model):  # its buckets (as DDP's own logging counts them)
        sizes = str(getattr(model, "_get_ddp_logging_data", dict)().get("bucket_sizes") or "")
        return len(sizes.split(",")) if sizes else None


class Zero1(Ddp):
    """DDP for the gradients, torch's ZeroRedundancyOptimizer for the state: each rank keeps and
    steps 1/N of the parameters' optimizer state, then broadcasts its updated parameters."""

    name = "zero1"

    def optimizer(self, model, cls, **kwargs):
        # imported here: torch.distributed.optim scripts its functional optimizers on import (~seconds)
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=cls, **kwargs)


class Fsdp2(Strategy):
    """torch's FSDP2: fully_shard on every Transformer block, then on the root (embedding,
    final norm, LM head); parameters become DTensors sharded on dim 0."""

    name = "fsdp2"

    def wrap(self, module):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        dtype = COMPUTE_DTYPES[self.setup.compute_dtype]
        kwargs = {"mp_policy": MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)} if dtype else {}
        for block in getattr(module, "layers", []):
            fully_shard(block, **kwargs)
        fully_shard(module, **kwargs)
        return module


class Adapter(Strategy):
    """A student's strategy from --adapters; NotImplementedAdapter (-> status skipped) propagates."""

    def __init__(self, setup: Setup):
        super().__init__(setup)
        if not setup.adapters:
            raise ValueError(f"{self.name} needs --adapters MODULE")
        self.adapters: Adapters = load_adapters(setup.adapters)

    def wrap(self, module):
        missing = missing_adapter(self.name, self.adapters)
        if missing:
            raise NotImplementedAdapter(missing)
        return module

    def first(self, *names: str) -> str:
        """The first of the handout's names (2026, then 2025) the module defines."""
        for name in names:
            if self.adapters.has(name):
                return name
        return names[0]  # call() then says the module lacks it


class AdapterDdp(Adapter):
    name, timed_comm = "adapter-ddp", True

    def wrap(self, module):
        super().wrap(module)
        self.get = self.first("get_ddp", "get_ddp_individual_parameters")
        return self.adapters.wrapper(self.get, module)

    def after_backward(self, model, optimizer):
        hook = "ddp_on_after_backward" if self.get == "get_ddp" else "ddp_individual_parameters_on_after_backward"
        self.adapters.call(hook, model, optimizer)


class AdapterDdpBucketed(Adapter):
    name, timed_comm = "adapter-ddp-bucketed", True

    def wrap(self, module):
        super().wrap(module)
        return self.adapters.wrapper("get_ddp_bucketed", module, self.setup.bucket_cap_mb or 25.0)

    def before_step(self, model, optimizer):
        if self.adapters.has("ddp_bucketed_on_train_batch_start"):
            self.adapters.call("ddp_bucketed_on_train_batch_start", model, optimizer)

    def after_backward(self, model, optimizer):
        self.adapters.call("ddp_bucketed_on_after_backward", model, optimizer)


class AdapterShardedOptimizer(Adapter):
    """The student's sharded optimizer over a plain model whose gradients are all-reduced."""

    name, timed_comm = "adapter-sharded-optimizer", True

    def wrap(self, module):
        super().wrap(module)
        broadcast_parameters(module)
        return module

    def optimizer(self, model, cls, **kwargs):
        return self.adapters.call("get_sharded_optimizer", model.parameters(), cls, **kwargs)

    def after_backward(self, model, optimizer):
        all_reduce_flat(model)


class AdapterFsdp(Adapter):
    name, timed_comm = "adapter-fsdp", True

    def wrap(self, module):
        super().wrap(module)
        # by keyword, as the handout's signature names it: get_fsdp(module, compute_dtype=None)
        return self.adapters.wrapper("get_fsdp", module, compute_dtype=COMPUTE_DTYPES[self.setup.compute_dtype])

    def after_backward(self, model, optimizer):
        self.adapters.call("fsdp_on_after_backward", model, optimizer)

    def full_parameters(self, model, module):
        return {
            name: full_tensor(t.detach()) for name, t in self.adapters.call("fsdp_gather_full_params", model).items()
        }


STRATEGY_CLASSES: dict[str, Callable[[Setup], Strategy]] = {
    cls.name: cls
    for cls in (
        Strategy,
        Naive,
        Flat,
        Ddp,
        Zero1,
        Fsdp2,
        AdapterDdp,
        AdapterDdpBucketed,
        AdapterShardedOptimizer,
        AdapterFsdp,
    )
}


def make_strategy(name: str, setup: Setup) -> Strategy:
    return STRATEGY_CLASSES[name](setup)
