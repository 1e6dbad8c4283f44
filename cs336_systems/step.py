"""The step every tool times: one forward, forward+backward or training step of a
configuration, its batch, its compiled model and its CUDA-graph capture.

The engine (runner.py) times it; ddp_bench, scripts and tests build the same step from here.
A step's parts run inside `phase("forward")`, `phase("backward")` and `phase("optimizer")`,
so timing, memory tracing and NVTX ranges wrap them without the step knowing.
"""

from __future__ import annotations

import contextlib
import re
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from . import cuda_graphs
from .config import PASS_TYPES, BenchmarkConfig
from .precision import autocast, grad_scaler
from .units import counted
from .user_model import ModelFactoryError

CUDA_GRAPH_NOTE = (
    f"CUDA graph replays, captured after {cuda_graphs.CAPTURE_WARMUP_ITERS} eager iterations; "
    "no per-phase times (a replay is one call)"
)


@contextlib.contextmanager
def compiled(model: nn.Module, scope: str, mode: str = "default") -> Iterator[nn.Module]:
    """The model to step: compiled whole, or block by block (regional compilation).

    Identical blocks share one compiled graph, so "blocks" compiles about num_layers
    times faster; the blocks are swapped back afterwards so a reused model stays eager.
    """
    torch._dynamo.reset()  # a fresh compile per configuration, so compile_s is comparable
    if scope == "model":
        yield torch.compile(model, mode=mode)
        return
    blocks = getattr(model, "layers", None)
    if not isinstance(blocks, nn.ModuleList):
        raise ModelFactoryError("--compile-scope blocks needs a model whose blocks are in a `layers` ModuleList")
    originals = list(blocks)
    try:
        for index, block in enumerate(originals):
            blocks[index] = torch.compile(block, mode=mode)
        yield model
    finally:
        for index, block in enumerate(originals):
            blocks[index] = block


def compiling(first_call: Callable[[], Any], notes: list[str]) -> Any:
    """`first_call()`, the first call of a compiled model (which compiles it). A compile killed mid-build
    (--timeout, a stage's limit, Ctrl-C) leaves a .so or .o of torch's inductor cache unfinished, which every
    later compile loads ("ImportError: ...main.so: file too short"; a vector-ISA probe's: no AVX after it).
    Those are removed first, and a call failing on one is made once more; the row's note says so."""
    removed = _remove_unfinished_builds()
    try:
        result = first_call()
    except Exception as exc:
        if not (again := _remove_unfinished_builds("".join(traceback.format_exception(exc)))):
            raise
        removed += again
        torch._dynamo.reset()
        torch._inductor.utils.clear_caches()  # the loaders it made of those files
        result = first_call()
    if removed:
        notes.append(f"removed {removed} unfinished file(s) of a compile killed mid-build from torch's inductor cache")
    return result


def _remove_unfinished_builds(error_text: str = "") -> int:
    """Remove the .so and .o files of torch's inductor cache that are not whole (no ELF header, or named
    in `error_text`) and that no build holds (torch builds each under a lock of its key): how many."""
    from filelock import FileLock, Timeout
    from torch._inductor.codecache import get_lock_dir
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    root = Path(cache_dir())
    named = set(re.findall(r"/[^\s:'\"]+\.s?o\b", error_text))
    removed = 0
    for path in [*root.rglob("*.so"), *root.rglob("*.o")]:
        if str(path) in named or not _is_elf(path):
            lock = FileLock(Path(get_lock_dir(), f"{path.name.partition('.')[0]}.lock"), timeout=0)
            with contextlib.suppress(Timeout, OSError), lock:
                path.unlink()
                removed += 1
    return removed


def _is_elf(path: Path) -> bool:
    with contextlib.suppress(OSError), open(path, "rb") as handle:
        return handle.read(4) == b"\x7fELF"
    return False


Phase = Callable[[str], contextlib.AbstractContextManager]


def no_phase(name: str) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


def make_micro_batches(config: BenchmarkConfig, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The grad_accum_steps (tokens, targets) micro-batches every step of `config` uses, drawn
    from its seed (one micro-batch: the same draw as make_batch)."""
    generator = torch.Generator(device=device).manual_seed(config.seed)
    shape = (config.batch_size * config.grad_accum_steps, config.context_length)
    vocab = config.model.vocab_size
    tokens = torch.randint(0, vocab, shape, device=device, generator=generator)
    targets = torch.randint(0, vocab, shape, device=device, generator=generator)
    return list(zip(tokens.split(config.batch_size), targets.split(config.batch_size), strict=True))


def make_batch(config: BenchmarkConfig, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The (tokens, targets) every step of `config` uses, drawn from its seed."""
    return make_micro_batches(config.replace(grad_accum_steps=1), device)[0]


def make_step(
    config: BenchmarkConfig,
    model: nn.Module,
    device: torch.device,
    optimizer: torch.optim.Optimizer | None = None,
    phase: Phase = no_phase,
    losses: list | None = None,
) -> Callable[[], None]:
    """The function one timed step calls, its parts wrapped in `phase("forward")`,
    `phase("backward")` and `phase("optimizer")`. Training steps start by setting grads to None.
    With grad_accum_steps K, a step runs K forward(-backward) micro-batches (each phase entered
    K times: their times add up) and, for train-step, one optimizer step."""
    batches = make_micro_batches(config, device)
    scaler = grad_scaler(config.precision, device)
    scale = 1.0 / config.grad_accum_steps  # the step's loss is the mean over its micro-batches

    def forward() -> None:
        for tokens, _ in batches:
            with phase("forward"), torch.inference_mode(), autocast(config.precision, device):
                model(tokens)

    def forward_and_backward() -> None:
        for tokens, targets in batches:
            with phase("forward"), autocast(config.precision, device):
                logits = model(tokens)  # held until backward ends, as in a training loop
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
                loss = loss * scale if scale != 1.0 else loss
            if losses is not None:
                losses.append(loss.detach())  # read once after timing (a NaN loss gets a note)
            with phase("backward"):
                (scaler.scale(loss) if scaler else loss).backward()

    def forward_backward() -> None:
        model.zero_grad(set_to_none=True)
        forward_and_backward()

    def train_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        forward_and_backward()
        with phase("optimizer"):
            if scaler:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()

    if config.pass_type == "forward":
        return forward
    if config.pass_type == "forward-backward":
        return forward_backward
    if config.pass_type == "train-step":
        if optimizer is None:
            raise ValueError("train-step needs an optimizer")
        return train_step
    raise ValueError(f"unknown pass type {config.pass_type!r}; choose one of {PASS_TYPES}")


def describe_config(config: BenchmarkConfig) -> str:
    """One configuration in a few words, for progress lines: 'small sdpa fp32 T=128 B=4 train-step'."""
    compiled = " compile" if config.compile else ""
    return (
        f"{config.model.size_name} {config.model.attention} {config.precision}{compiled} "
        f"T={config.context_length} B={config.batch_size} {config.pass_type}"
    )


def describe_step(config: BenchmarkConfig) -> str:
    """What one timed step of `config` covers, in words (make_step's step): a run's first lines say it."""
    times = f"{config.grad_accum_steps} x " if config.grad_accum_steps > 1 else ""
    if config.pass_type == "forward":
        return f"{times}forward only (inference mode, no loss)"
    work = f"{times}(forward + loss + backward)" if times else "forward + loss + backward"
    if config.pass_type == "forward-backward":
        return f"{work}, no optimizer step"
    optimizer = f"your --optimizer {config.optimizer_factory}" if config.optimizer_factory else "torch's fused AdamW"
    masters = " over fp32 master weights" if config.param_dtype != "fp32" else ""
    return f"{work} + one optimizer step ({optimizer}{masters})"


def describe_measurement(configs: Sequence[BenchmarkConfig], threads: int | str | None = None) -> list[str]:
    """A run's first lines after its size table: where it measures (threads on a CPU: this process's, or
    `threads` where other processes measure), how many warmup and measured steps, what one step covers,
    and what MFU divides by. `configs` share all but their shape, precision and pass type (a sweep's grid)."""
    first = configs[0]
    threads = f" ({counted(threads or torch.get_num_threads(), 'thread')})" if first.device.startswith("cpu") else ""
    warmup, measured = first.warmup_steps, first.measure_steps
    samples = ("do_bench sample" if first.timer == "do-bench" else "step") + "s" * (measured != 1)
    peak = (
        f"--peak-tflops {first.peak_tflops:g}"
        if first.peak_tflops is not None
        else f"the peak --peak {first.peak} finds for the row's device and precision"
    )
    return [
        f"measuring on {first.device}{threads}: {warmup} warmup step{'s' * (warmup != 1)}, then {measured} "
        f"measured {samples} per configuration ({first.timer} timer)",
        *dict.fromkeys(f"one step ({c.pass_type}): {describe_step(c)}" for c in configs),
        f"mfu: model FLOP/s as a fraction of {peak} (the row's peak_tflops; its peak_source says where that came from)",
    ]


def combine_phases(*phases: Phase) -> Phase:
    """One phase callback that enters each of `phases` in order."""

    @contextlib.contextmanager
    def combined(name: str) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for phase in phases:
                stack.enter_context(phase(name))
            yield

    return combined


def captured_step(
    config: BenchmarkConfig, model: nn.Module, device: torch.device, phase: Phase = no_phase
) -> tuple[cuda_graphs.CapturedStep, torch.optim.Optimizer | None]:
    """The whole step captured in a CUDA graph (cuda_graphs.py), and the optimizer it steps.
    The eager iterations (AdamW state created) and the capture are the first step, inside
    `phase("eager")` and `phase("capture")`."""
    optimizer = cuda_graphs.make_optimizer(model) if config.pass_type == "train-step" else None
    batch = cuda_graphs.StaticBatch(*make_batch(config, device))
    body = cuda_graphs.step_body(model, batch, config.pass_type, optimizer, lambda: autocast(config.precision, device))
    return cuda_graphs.CapturedStep(body, model, phase=phase), optimizer
