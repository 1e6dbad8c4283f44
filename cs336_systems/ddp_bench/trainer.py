"""One rank's training step under a strategy: its correctness check, memory and timing."""

from __future__ import annotations

import contextlib
import gc
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..adapters import NotImplementedAdapter
from ..config import BenchmarkConfig
from ..distributed import BarrierFirst, RankContext
from ..factory import build_model
from ..memory import PhaseMemory, current_memory_bytes, pin_mmap_threshold, rss_high_water_mark_available
from ..memory.measure import BUILT, PHASES, TensorMemory
from ..optimizer import load_user_optimizer
from ..precision import autocast, precision_mode
from ..profiling import union_length
from ..step import combine_phases, make_step
from ..timing import (
    HostTimer,
    PhaseRecorder,
    StepTimes,
    device_synchronizer,
    make_phase_recorder,
    phase_samples,
    time_steps,
)
from .accounting import held_bytes, local_bytes, stateful_param_bytes
from .strategies import Setup, Strategy, make_strategy

OPTIMIZERS = ("adamw", "sgd")
FSDP_STRATEGIES = ("fsdp2", "adapter-fsdp")  # their all-gather and reduce-scatter time is profiled
DDP_DEFAULT_BUCKET_CAP_MB = 25.0  # DistributedDataParallel's default
# The check steps with SGD: Adam's first step is ~lr * sign(grad), blind to a gradient off by a
# constant factor (a sum not divided by the world size).
CHECK_LR = 0.5
CHECK_TOLERANCE = {"fp32": 1e-4, "half": 2e-2}  # max |param - single-process param| after the step


@dataclass(frozen=True)
class DdpUnit:
    """One run: a strategy on `ranks` ranks (the single baseline runs on rank 0 alone)."""

    strategy: str  # single or one of strategies.STRATEGIES
    config: BenchmarkConfig  # the per-device train-step; its seed seeds the weights, seed + rank the data
    ranks: int
    optimizer: str = "adamw"
    lr: float = 1e-4
    bucket_cap_mb: float | None = None
    compute_dtype: str = "fp32"  # fsdp2 / adapter-fsdp
    adapters: str | None = None
    check: bool = True  # compare one step with a single process before timing


def optimizer_class(name: str, device: torch.device, lr: float) -> tuple[type, dict]:
    """The optimizer class (or factory) and its keywords: a name of OPTIMIZERS, or a user's
    package.module:callable as every tool builds it (optimizer.UserOptimizer: the hyperparameters its
    signature takes, lr this run's), called as cls(params, **keywords), inside a sharded optimizer too."""
    if ":" in name:
        user = load_user_optimizer(name)
        return user.make, {**user.keywords, **({"lr": lr} if "lr" in user.keywords else {})}
    if name == "sgd":
        return torch.optim.SGD, {"lr": lr}
    # Fused AdamW (as optimizer.make_optimizer): one kernel for all parameters.
    return torch.optim.AdamW, {"lr": lr, "fused": device.type in ("cuda", "cpu")}


class Trainer:
    """This rank's model, optimizer and training step for `unit.strategy`."""

    def __init__(
        self, ctx: RankContext, unit: DdpUnit, optimizer: str | None = None, lr: float | None = None, phase=None
    ):
        self.ctx, self.unit = ctx, unit
        device = ctx.device
        config = unit.config.replace(device=str(device), pass_type="train-step")
        self.strategy: Strategy = make_strategy(
            unit.strategy,
            Setup(
                device=device,
                bucket_cap_mb=unit.bucket_cap_mb,
                compute_dtype=unit.compute_dtype,
                sync_buffers=config.model_factory is not None,
                adapters=unit.adapters,
            ),
        )
        torch.manual_seed(config.seed)  # the same weights on every rank
        self.module = build_model(config.model, device, config.model_factory)
        # counted before the wrap: a student's FSDP may replace the module's weights by shards
        self.num_params = sum(p.numel() for p in self.module.parameters())
        self.full_param_bytes = sum(local_bytes(p) for p in self.module.parameters())
        self.model = self.strategy.wrap(self.module)
        cls, kwargs = optimizer_class(optimizer or unit.optimizer, device, lr if lr is not None else unit.lr)
        if unit.strategy == "fsdp2":
            kwargs.pop("fused", None)  # fused AdamW does not take DTensor parameters
        self.optimizer = self.strategy.optimizer(self.model, cls, **kwargs)
        self.comm_ms: list[float] = []
        self.phases = None  # a timing.PhaseRecorder while the measured steps run: forward and backward ms
        self._sync = True
        self._comm_timer = HostTimer(synchronize=device_synchronizer(device))
        phases = (
            self._phase if phase is None else combine_phases(phase, self._phase)
        )  # the optimizer peak includes the sync
        self._step = make_step(
            config.replace(seed=config.seed + ctx.rank), self.model, device, self.optimizer, phase=phases
        )

    @contextlib.contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        if name == "forward":
            self.strategy.before_step(self.model, self.optimizer)
        # make_step enters phase("optimizer") after backward, just before the optimizer step:
        # where naive/flat and the student's on_after_backward sync the gradients.
        if name == "optimizer" and self._sync:
            hook = lambda: self.strategy.after_backward(self.model, self.optimizer)  # noqa: E731
            if self.strategy.timed_comm:
                self.comm_ms.append(self._comm_timer.time_ms(hook))
            else:
                hook()
        # innermost: a phase's time leaves out the strategy's hooks around it
        with self.phases.phase(name) if self.phases is not None else contextlib.nullcontext():
            yield

    def step(self, sync: bool = True) -> None:
        """One training step; with sync=False the gradients are not averaged (DDP's no_sync)."""
        self._sync = sync
        with contextlib.nullcontext() if sync else self.strategy.unsynced(self.model):
            self._step()

    def full_parameters(self) -> dict[str, torch.Tensor]:
        return self.strategy.full_parameters(self.model, self.module)


def reference_step(config: BenchmarkConfig, world_size: int, device: torch.device) -> dict[str, torch.Tensor]:
    """The single-process SGD step on the global batch (the N shards, drawn as make_step draws
    rank r's: tokens then targets from seed + r). The batch mean is accumulated shard by shard
    (loss / N each): the same gradient as one forward on the concatenated batch, in one shard's memory."""
    torch.manual_seed(config.seed)
    model = build_model(config.model, device, config.model_factory)
    for parameter in model.parameters():
        dist.broadcast(parameter.data, src=0)  # as the strategies start
    shape = (config.batch_size, config.context_length)
    for rank in range(world_size):
        generator = torch.Generator(device=device).manual_seed(config.seed + rank)
        tokens = torch.randint(0, config.model.vocab_size, shape, device=device, generator=generator)
        targets = torch.randint(0, config.model.vocab_size, shape, device=device, generator=generator)
        with autocast(config.precision, device):
            logits = model(tokens)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        (loss / world_size).backward()
    torch.optim.SGD(model.parameters(), lr=CHECK_LR).step()
    return {name: p.detach() for name, p in model.named_parameters()}


NONFINITE_DIFF = 1e30  # check_max_diff of a parameter that is NaN, infinite, missing or misshapen


def check_tolerance(unit: DdpUnit) -> float:
    half = unit.config.precision != "fp32" or unit.compute_dtype != "fp32"
    return CHECK_TOLERANCE["half" if half else "fp32"]


def check_step(ctx: RankContext, unit: DdpUnit) -> float:
    """The largest |parameter - single-process parameter| over this group after one SGD step
    (a max all-reduce: every rank gets the same verdict). A parameter missing or misshapen is inf."""
    trainer = Trainer(ctx, unit, optimizer="sgd", lr=CHECK_LR)
    trainer.step()
    got = trainer.full_parameters()
    expected = reference_step(unit.config.replace(device=str(ctx.device)), unit.ranks, ctx.device)
    difference = 0.0
    for name, value in expected.items():
        mine = got.get(name)
        if mine is None or mine.shape != value.shape:
            difference = math.inf
            break
        gap = (mine.float() - value.float()).abs().max().item()
        if not math.isfinite(gap):  # max() would keep the old value over a NaN
            difference = math.inf
            break
        difference = max(difference, gap)
    del trainer, got, expected
    gc.collect()
    verdict = torch.tensor([difference if math.isfinite(difference) else NONFINITE_DIFF], device=ctx.device)
    dist.all_reduce(verdict, op=dist.ReduceOp.MAX)
    return verdict.item()


def collective_time_ms(trainer: Trainer, device: torch.device) -> dict[str, float]:
    """Time in all-gather and in reduce-scatter over one profiled step (FSDP's collectives):
    the wall time the gloo worker threads' `gloo:*` spans cover on CPU (gloo runs reduce_scatter_tensor
    as an all-reduce, `gloo:all_reduce`; FSDP2 issues no other), the NCCL kernels' device time on CUDA."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        trainer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    totals = {"all_gather": 0.0, "reduce_scatter": 0.0}
    if device.type == "cuda":  # NCCL's kernels run one after another on its stream: their times add up
        for event in prof.key_averages():
            key = _collective_kind(event.key)
            if key.startswith("nccl"):
                for kind in totals:
                    totals[kind] += event.device_time_total / 1e3 if kind in key else 0.0
        return totals
    # gloo's spans of one kind can overlap (a student's asynchronous calls): the time any was in flight
    spans: dict[str, list[tuple[float, float]]] = {kind: [] for kind in totals}
    for event in prof.events():
        key = _collective_kind(event.name)
        if key.startswith("gloo:"):
            key = key.replace("all_reduce", "reduce_scatter")
            for kind in totals:
                if kind in key:
                    spans[kind].append((event.time_range.start, event.time_range.end))
    return {kind: union_length(spans[kind]) / 1e3 for kind in totals}


def _collective_kind(name: str) -> str:
    return name.lower().replace("allgather", "all_gather").replace("reducescatter", "reduce_scatter")


def time_interleaved(
    trainer: Trainer, warmup_steps: int, measure_steps: int, timer, phases: PhaseRecorder | None = None
) -> tuple[StepTimes, StepTimes]:
    """A synced step and a no_sync step in turn, each timed on its own: a slow spell of the
    machine (a busy neighbour on a shared host) then falls on both, not on one block of them.
    `phases` records the measured synced steps' phases."""
    synced, unsynced = [], []
    for index in range(warmup_steps + measure_steps):
        recorded = phases is not None and index >= warmup_steps
        if recorded:
            phases.start_step()
        synced.append(timer.time_ms(trainer.step))
        if recorded:
            phases.end_step()
        unsynced.append(timer.time_ms(lambda: trainer.step(sync=False)))
    return (
        StepTimes(tuple(synced[:warmup_steps]), tuple(synced[warmup_steps:]), phase_samples(phases)),
        StepTimes(tuple(unsynced[:warmup_steps]), tuple(unsynced[warmup_steps:])),
    )


def _finite(ctx: RankContext, unit: DdpUnit, module: torch.nn.Module) -> bool:
    """Every parameter of every rank (each its shard, for sharded strategies) is finite: one verdict for all."""
    with torch.no_grad():
        local = all(bool(torch.isfinite(getattr(p, "to_local", lambda p=p: p)()).all()) for p in module.parameters())
    if unit.ranks == 1:
        return local
    verdict = torch.tensor([0.0 if local else 1.0], device=ctx.device)
    dist.all_reduce(verdict, op=dist.ReduceOp.MAX)
    return verdict.item() == 0.0


MEMORY_STEPS = 2  # untimed, before the warmup: the first creates the optimizer state, the second is steady


def measured_trainer(ctx: RankContext, unit: DdpUnit) -> tuple[Trainer, dict]:
    """This rank's trainer, and its memory: its tensors' bytes by category at each phase's peak (built,
    then MEMORY_STEPS steps under TensorMemory), and the process's own peak over the same span, above what
    it held before (RSS high-water mark on a CPU, the CUDA allocator's peak on a GPU: a secondary figure)."""
    tensors, process = TensorMemory(ctx.device), PhaseMemory(ctx.device)
    seen = ctx.device.type == "cuda" or rss_high_water_mark_available()
    baseline = current_memory_bytes(ctx.device)
    with process.whole():
        with tensors.phase(BUILT):
            trainer = Trainer(ctx, unit, phase=tensors.phase)
        tensors.built(trainer.model)
        for _ in range(MEMORY_STEPS):
            trainer.step()
    tensors.on = False
    return trainer, {
        "memory_breakdown": [{"phase": phase, **tensors.peaks[phase]} for phase in PHASES],
        "process_peak_bytes": process.measured_peak[0] - baseline if seen else None,
        "memory_source": process.source if seen else None,
    }


def ddp_worker(ctx: RankContext, unit: DdpUnit) -> dict | None:
    """This rank's check, memory and timings for one unit; None from ranks that sit it out."""
    if ctx.rank >= unit.ranks:
        return None
    config = unit.config
    if ctx.device.type == "cpu":
        pin_mmap_threshold()  # freed tensors leave RSS: the check's model does not inflate the peaks
    try:
        with precision_mode(config.precision, ctx.device):
            checked = unit.strategy != "single" and unit.check
            message = {"check_max_diff": None, "check_tolerance": check_tolerance(unit) if checked else None}
            if checked:
                message["check_max_diff"] = check_step(ctx, unit)
                if not message["check_max_diff"] <= message["check_tolerance"]:
                    return {**message, "wrong": True}
            trainer, memory = measured_trainer(ctx, unit)
            timer = HostTimer(synchronize=device_synchronizer(ctx.device))
            if unit.ranks > 1:
                timer = BarrierFirst(timer, ctx.barrier)
            trainer.phases = make_phase_recorder(ctx.device)  # event pairs on CUDA: no added synchronisation
            if trainer.strategy.skip_sync:
                synced, no_sync = time_interleaved(
                    trainer, config.warmup_steps, config.measure_steps, timer, trainer.phases
                )
            else:
                synced = time_steps(
                    trainer.step,
                    warmup_steps=config.warmup_steps,
                    measure_steps=config.measure_steps,
                    timer=timer,
                    phases=trainer.phases,
                )
                no_sync = None
            trainer.phases = None
            if not _finite(ctx, unit, trainer.module):  # with --no-check, or broken after the first step
                return {**message, "nonfinite": True}
            held = held_bytes(trainer.model, trainer.optimizer)
            comm_ms = trainer.comm_ms[-config.measure_steps :] if trainer.strategy.timed_comm else []
            collectives = collective_time_ms(trainer, ctx.device) if unit.strategy in FSDP_STRATEGIES else None
    except NotImplementedAdapter as exc:
        return {"skipped": str(exc)}
    return {
        **message,
        "num_params": trainer.num_params,
        "full_param_bytes": trainer.full_param_bytes,
        "stateful_param_bytes": stateful_param_bytes(trainer.model, trainer.optimizer),
        "step_ms": list(synced.measured_ms),
        "warmup_ms": list(synced.warmup_ms),
        "no_sync_ms": list(no_sync.measured_ms) if no_sync else [],
        "phase_ms": {name: list(ms) for name, ms in synced.phase_ms.items()},  # per measured step
        "comm_ms": comm_ms,
        "collective_ms": collectives,
        **memory,
        "param_bytes": held.param_bytes,
        "grad_bytes": held.grad_bytes,
        "allreduces": trainer.strategy.allreduces(trainer.model),
        "optimizer_state_bytes": held.optimizer_state_bytes,
    }
