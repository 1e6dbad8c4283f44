"""What to try, from the measurement (as loader_bench's recommendation does)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import psutil
import torch

from ..loader_bench import predicted_buffer_bytes, predicted_epoch_s
from ..memory import estimate_memory
from ..models import ModelConfig, TransformerLM
from ..units import format_bytes
from .record import Step

DEFAULT_PREFETCH = 2  # torch's DataLoader default


@dataclass(frozen=True)
class LoaderInfo:
    """What the probe read off a torch DataLoader (None: not a DataLoader)."""

    num_workers: int
    prefetch_factor: int | None
    pin_memory: bool
    persistent_workers: bool
    batch_size: int | None
    num_items: int | None

    @classmethod
    def of(cls, loader: object) -> LoaderInfo | None:
        if not isinstance(loader, torch.utils.data.DataLoader):
            return None
        try:
            items = len(loader.dataset)
        except TypeError:
            items = None
        workers = loader.num_workers
        return cls(
            workers,
            loader.prefetch_factor if workers else None,
            loader.pin_memory,
            loader.persistent_workers,
            loader.batch_size,
            items,
        )

    def describe(self) -> str:
        return (
            f"num_workers={self.num_workers} prefetch_factor={self.prefetch_factor} "
            f"pin_memory={self.pin_memory} persistent_workers={self.persistent_workers}"
        )


def input_advice(steps: Sequence[Step], info: LoaderInfo | None, batch_bytes: int | None, pinned: bool) -> list[str]:
    """More workers (how many, what it predicts, the host RAM it takes), persistence, a local copy."""
    wait = sum(s.wait_ms for s in steps) / len(steps) / 1e3
    step = sum(s.wall_ms for s in steps) / len(steps) / 1e3
    compute = max(step - wait, 1e-6)
    if info is None:
        return [
            f"input-bound: the loop waits {1e3 * wait:.1f} ms per {1e3 * step:.1f} ms step for its data; "
            "load in parallel (DataLoader num_workers / prefetch_factor) or from a faster copy"
        ]
    # steady state with W workers: a step takes fetch / W, so a batch's fetch is W steps (W = 0: one wait)
    fetch = wait if info.num_workers == 0 else info.num_workers * step
    needed = max(info.num_workers + 1, math.ceil(fetch / compute))
    workers = needed + 1  # the closed form has no slack: one worker more absorbs jitter
    prefetch = info.prefetch_factor or DEFAULT_PREFETCH
    predicted = predicted_epoch_s(len(steps), fetch, compute, workers) / len(steps)
    lines = [
        f"input-bound: {1e3 * wait:.1f} ms of each {1e3 * step:.1f} ms step is spent waiting for a batch "
        f"({info.describe()}); a batch takes about {1e3 * fetch:.0f} ms to fetch and the rest of the step "
        f"{1e3 * compute:.1f} ms",
        f"try num_workers={workers} (prefetch_factor={prefetch}): loader_bench's closed form needs {needed} "
        f"to keep up and predicts a {1e3 * predicted:.1f} ms step ({step / predicted:.1f}x); one more absorbs jitter",
    ]
    if batch_bytes is not None:
        buffer = predicted_buffer_bytes(workers, prefetch, batch_bytes, pinned)
        available = psutil.virtual_memory().available
        lines.append(
            f"  host RAM for its batches in flight: up to {format_bytes(buffer)} "
            f"({format_bytes(available)} available now)"
        )
    if info.num_workers and not info.persistent_workers:
        lines.append("persistent_workers=True: keeps the workers (and their warm state) between epochs")
    if batch_bytes is not None and info.num_items is not None and info.batch_size:
        dataset = info.num_items * batch_bytes // info.batch_size
        lines.append(
            f"a local copy of the data (on local disk or in RAM under /dev/shm) takes "
            f"{format_bytes(dataset)}: worth it when each item is fetched from remote storage"
        )
    return lines


def compute_advice(
    model: torch.nn.Module | None,
    batch_size: int | None,
    context_length: int | None,
    precision: str,
    device: torch.device,
) -> list[str]:
    """Precision, compile, and a larger batch (with the estimator's verdict for the built-in model)."""
    lines = ["compute-bound: the time is in your own phases; the loader keeps up"]
    if precision == "fp32":
        lines.append(
            "precision: bf16 autocast (torch.autocast) on hardware that has it; on a GPU TF32 "
            "matmuls (torch.set_float32_matmul_precision('high'))"
        )
    lines.append("compile: torch.compile(model) fuses the elementwise work")
    config = getattr(model, "config", None)
    if isinstance(model, TransformerLM) and isinstance(config, ModelConfig) and batch_size and context_length:
        if device.type == "cuda":
            memory = torch.cuda.get_device_properties(device).total_memory
        else:
            memory = psutil.virtual_memory().total
        larger = 2 * batch_size
        context = min(context_length, config.context_length)  # a batch often holds inputs + 1 target
        est = estimate_memory(config, larger, context, "train-step", precision, device.type, memory)
        fits = "fits" if est.fits else "does not fit"
        lines.append(
            f"batch size {larger} (from {batch_size}): the estimator predicts {format_bytes(est.total_bytes)} "
            f"for a train step, which {fits} in {format_bytes(memory)}"
        )
    else:
        lines.append("batch size: a larger batch uses the hardware better while it fits in memory")
    return lines


def host_advice(phases_pct: float | None, device_busy_pct: float | None) -> list[str]:
    if device_busy_pct is not None:
        measured = f"the GPU is busy {device_busy_pct:.0f}% of the step (measured)"
    else:
        measured = f"your phases cover {phases_pct:.0f}% of the step on the GPU"
    return [
        f"host-bound: {measured}; the GPU waits for the host to launch work",
        "try torch.compile(mode='reduce-overhead') or CUDA graphs, a larger batch, and no "
        "synchronising calls (.item(), .cpu(), print of a tensor) inside the step",
    ]
