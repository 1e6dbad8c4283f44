"""One rank's training step under a strategy (single, ddp, naive), and how it is timed."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from cs336_systems.config import BenchmarkConfig
from cs336_systems.distributed import BarrierFirst, RankContext, all_reduce_mean
from cs336_systems.models import build_model
from cs336_systems.optimizer import make_optimizer
from cs336_systems.precision import precision_mode
from cs336_systems.runner import make_step
from cs336_systems.timing import HostTimer, StepTimes, device_synchronizer, time_steps

STRATEGIES = ("ddp", "naive")
OPTIMIZERS = ("adamw", "sgd")
DDP_DEFAULT_BUCKET_CAP_MB = 25.0  # DistributedDataParallel's default


@dataclass(frozen=True)
class DdpUnit:
    """One run: a strategy on `ranks` ranks (the single baseline runs on rank 0 alone)."""

    strategy: str  # single, ddp or naive
    config: BenchmarkConfig  # the per-device train-step; its seed seeds the weights, seed + rank the data
    ranks: int
    optimizer: str = "adamw"
    lr: float = 1e-4
    bucket_cap_mb: float | None = None


def buffer_sync_option(sync: bool) -> dict[str, bool]:
    """DDP's flag for broadcasting buffers before each forward. Our model's only buffers are
    RoPE tables, equal on every rank by construction: re-sending them would be communication for
    nothing. (torch 2.13 renamed broadcast_buffers to forward_sync_buffers.)"""
    parameters = inspect.signature(DistributedDataParallel.__init__).parameters
    return {"forward_sync_buffers" if "forward_sync_buffers" in parameters else "broadcast_buffers": sync}


class Trainer:
    """This rank's model, optimizer and training step for `unit.strategy`."""

    def __init__(self, ctx: RankContext, unit: DdpUnit):
        self.ctx, self.unit = ctx, unit
        device = ctx.device
        config = unit.config.replace(device=str(device), pass_type="train-step")
        torch.manual_seed(config.seed)  # the same weights on every rank
        self.module = build_model(config.model, device, config.model_factory)
        self.model: nn.Module = self.module
        if unit.strategy == "naive":
            for parameter in self.module.parameters():  # whatever a user's factory did, start equal
                torch.distributed.broadcast(parameter.data, src=0)
        elif unit.strategy == "ddp":
            self.model = DistributedDataParallel(
                self.module,
                device_ids=[device.index] if device.type == "cuda" else None,
                bucket_cap_mb=unit.bucket_cap_mb,
                **buffer_sync_option(config.model_factory is not None),
            )
        if unit.optimizer == "sgd":
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=unit.lr)
        else:
            self.optimizer = make_optimizer(self.model, device)
            for group in self.optimizer.param_groups:
                group["lr"] = unit.lr
        self.comm_ms: list[float] = []
        self._sync = True
        self._comm_timer = HostTimer(synchronize=device_synchronizer(device))
        self._step = make_step(config.replace(seed=config.seed + ctx.rank), self.model, device, self.optimizer,
                               phase=self._phase)  # fmt: skip

    @contextlib.contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        # make_step enters phase("optimizer") after backward, just before the optimizer step:
        # where the naive strategy averages the gradients.
        if name == "optimizer" and self.unit.strategy == "naive" and self._sync:
            self.comm_ms.append(self._comm_timer.time_ms(self._all_reduce_gradients))
        yield

    def _all_reduce_gradients(self) -> None:
        for parameter in self.module.parameters():
            if parameter.grad is not None:
                all_reduce_mean(parameter.grad)

    def step(self, sync: bool = True) -> None:
        """One training step; with sync=False the gradients are not averaged (DDP's no_sync)."""
        self._sync = sync
        quiet = self.model.no_sync() if isinstance(self.model, DistributedDataParallel) and not sync else None
        with quiet or contextlib.nullcontext():
            self._step()


def time_interleaved(trainer: Trainer, warmup_steps: int, measure_steps: int, timer) -> tuple[StepTimes, StepTimes]:
    """A synced step and a no_sync step in turn, each timed on its own: a slow spell of the
    machine (a busy neighbour on a shared host) then falls on both, not on one block of them."""
    synced, unsynced = [], []
    for _ in range(warmup_steps + measure_steps):
        synced.append(timer.time_ms(trainer.step))
        unsynced.append(timer.time_ms(lambda: trainer.step(sync=False)))
    split = lambda times: StepTimes(tuple(times[:warmup_steps]), tuple(times[warmup_steps:]))  # noqa: E731
    return split(synced), split(unsynced)


def ddp_worker(ctx: RankContext, unit: DdpUnit) -> dict | None:
    """This rank's timings for one unit; None from ranks that sit it out."""
    if ctx.rank >= unit.ranks:
        return None
    config = unit.config
    with precision_mode(config.precision, ctx.device):
        trainer = Trainer(ctx, unit)
        timer = HostTimer(synchronize=device_synchronizer(ctx.device))
        if unit.ranks > 1:
            timer = BarrierFirst(timer, ctx.barrier)
        if unit.strategy == "single":
            synced = time_steps(trainer.step, warmup_steps=config.warmup_steps, measure_steps=config.measure_steps,
                                timer=timer)  # fmt: skip
            no_sync = None
        else:
            synced, no_sync = time_interleaved(trainer, config.warmup_steps, config.measure_steps, timer)
        comm_ms = trainer.comm_ms[-config.measure_steps :] if unit.strategy == "naive" else []
    return {
        "num_params": sum(p.numel() for p in trainer.module.parameters()),
        "step_ms": list(synced.measured_ms),
        "warmup_ms": list(synced.warmup_ms),
        "no_sync_ms": list(no_sync.measured_ms) if no_sync else [],
        "comm_ms": comm_ms,
    }
