"""Run one benchmark configuration: build, step, time, record.

Flow: BenchmarkConfig -> model -> step function -> time_steps -> BenchmarkRecord.
Out-of-memory anywhere (building, first step, measured steps) is a result with
status 'oom', never a crash; the memory is released so a sweep can go on.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from . import cuda_graphs, nvtx
from .config import PASS_TYPES, BenchmarkConfig
from .device import (
    compile_unsupported_reason,
    failure_status,
    release_memory,
    resolve_device,
)
from .flops import flops_per_step, mfu, resolve_peak
from .memory import PhaseMemory, current_memory_bytes, estimate_memory, step_peak
from .models import (
    ModelFactoryError,
    build_model,
    check_model_output,
    count_parameters,
    count_parameters_for,
)
from .optimizer import OptimizerFactoryError, make_optimizer, optimizer_name
from .precision import (
    autocast,
    cpu_has_native,
    grad_scaler,
    precision_mode,
    unsupported_reason,
)
from .profiling import StepProfile, profile_step
from .results import BenchmarkRecord, Environment, collect_environment
from .results.records import NONFINITE_LOSS_NOTE
from .stats import summarize
from .timing import (
    HostTimer,
    StepTimes,
    device_synchronizer,
    make_phase_recorder,
    make_timer,
    time_steps,
)

OPTIMIZER_STATE_NOTE = "first measured step includes creating the AdamW state (no warmup step ran before it)"


def _tensor_bytes(model: nn.Module) -> int:
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


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


Phase = Callable[[str], contextlib.AbstractContextManager]


def no_phase(name: str) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


def make_batch(config: BenchmarkConfig, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The (tokens, targets) every step of `config` uses, drawn from its seed."""
    generator = torch.Generator(device=device).manual_seed(config.seed)
    shape = (config.batch_size, config.context_length)
    vocab = config.model.vocab_size
    tokens = torch.randint(0, vocab, shape, device=device, generator=generator)
    targets = torch.randint(0, vocab, shape, device=device, generator=generator)
    return tokens, targets


def make_step(
    config: BenchmarkConfig,
    model: nn.Module,
    device: torch.device,
    optimizer: torch.optim.Optimizer | None = None,
    phase: Phase = no_phase,
    losses: list | None = None,
) -> Callable[[], None]:
    """The function one timed step calls, its parts wrapped in `phase("forward")`,
    `phase("backward")` and `phase("optimizer")`. Training steps start by setting grads to None."""
    tokens, targets = make_batch(config, device)
    scaler = grad_scaler(config.precision, device)

    def forward() -> None:
        with phase("forward"), torch.inference_mode(), autocast(config.precision, device):
            model(tokens)

    def forward_and_backward() -> None:
        with phase("forward"), autocast(config.precision, device):
            logits = model(tokens)  # held until backward ends, as in a training loop
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
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


def combine_phases(*phases: Phase) -> Phase:
    """One phase callback that enters each of `phases` in order."""

    @contextlib.contextmanager
    def combined(name: str) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for phase in phases:
                stack.enter_context(phase(name))
            yield

    return combined


@contextlib.contextmanager
def cuda_memory_history(path: str | None, device: torch.device) -> Iterator[None]:
    """Record the CUDA allocator's history (for pytorch.org/memory_viz) and dump it to `path`."""
    if path is None:
        yield
        return
    torch.cuda.memory._record_memory_history(max_entries=1_000_000, device=device)
    try:
        yield
    finally:
        torch.cuda.memory._dump_snapshot(path)
        torch.cuda.memory._record_memory_history(enabled=None, device=device)


def new_record(
    config: BenchmarkConfig, device: torch.device, env: Environment, num_params: int | None
) -> BenchmarkRecord:
    """A record holding `config` with status 'ok' and nothing measured yet."""
    m = config.model
    return BenchmarkRecord(
        model_size=m.size_name,
        d_model=m.d_model,
        d_ff=m.d_ff,
        num_layers=m.num_layers,
        num_heads=m.num_heads,
        vocab_size=m.vocab_size,
        rope_theta=m.rope_theta,
        model_context_length=m.context_length,
        attention=config.attention,
        model_factory=config.model_factory,
        size_table=m.size_table,
        checkpoint_blocks=m.checkpoint_blocks,
        checkpoint_group_size=m.checkpoint_group_size,
        optimizer_factory=config.optimizer_factory if config.pass_type == "train-step" else None,
        num_params=num_params,
        context_length=config.context_length,
        batch_size=config.batch_size,
        pass_type=config.pass_type,
        precision=config.precision,
        compile=config.compile,
        compile_scope=config.compile_scope if config.compile else None,
        compile_mode=config.compile_mode if config.compile else None,
        cuda_graphs=config.cuda_graphs,
        device=str(device),
        timer=config.timer,
        warmup_steps=config.warmup_steps,
        measure_steps=config.measure_steps,
        seed=config.seed,
        status="ok",
        environment=env,
    )


def _measure(
    config: BenchmarkConfig,
    model: nn.Module,
    device: torch.device,
    clock: Callable[[], float],
    record: BenchmarkRecord,
    notes: list[str],
    memory: PhaseMemory,
    memory_snapshot: str | None,
) -> tuple[StepTimes, StepProfile | None]:
    """Compile (if asked, timed apart), then the warmup and measured steps, then the
    profiled step (if asked): its cost stays outside the timed steps.

    Memory is traced per phase on the first step run and on one extra, untimed step after
    the measured ones (the steady state); the measured steps themselves carry only one
    peak reset before them and one read after, so the instrumentation costs them nothing.
    Phase times come from the measured steps themselves (timing.make_phase_recorder).
    """
    model.train(config.pass_type != "forward")
    synchronize = device_synchronizer(device)
    with contextlib.ExitStack() as stack:
        runnable = (
            stack.enter_context(compiled(model, config.compile_scope, config.compile_mode)) if config.compile else model
        )
        losses: list[torch.Tensor] = []  # the traced steps' (untimed): first and last
        if config.cuda_graphs:
            step, traced = _captured_step(config, runnable, device, notes, memory), None
            phases = None
        else:
            optimizer = (
                make_optimizer(model, device, config.optimizer_factory) if config.pass_type == "train-step" else None
            )
            record.optimizer = optimizer_name(optimizer) if optimizer is not None else None
            phases = make_phase_recorder(device, clock)
            # phases.phase innermost: memory instrumentation stays outside the phase times
            plain = make_step(config, runnable, device, optimizer, phase=combine_phases(nvtx.range, phases.phase))
            traced = make_step(
                config, runnable, device, optimizer, phase=combine_phases(memory.phase, nvtx.range, phases.phase),
                losses=losses,
            )
            steps_run = []

            def step() -> None:
                (traced if not steps_run else plain)()
                steps_run.append(1)

            if config.compile:
                record.compile_s = HostTimer(clock, synchronize).time_ms(step) / 1e3
            elif config.pass_type == "train-step" and config.warmup_steps == 0:
                notes.append(OPTIMIZER_STATE_NOTE)
        during = contextlib.ExitStack()
        during.enter_context(memory.whole())
        during.enter_context(cuda_memory_history(memory_snapshot, device))
        times = time_steps(
            step,
            warmup_steps=config.warmup_steps,
            measure_steps=config.measure_steps,
            timer=make_timer(config.timer, device, clock),
            during_measurement=during,
            phases=phases,
        )
        if traced is not None:
            traced()
        else:
            memory.steps.append({})  # the steady state: one more replay, traced as a whole step
            with memory.phase("step"):
                step()
        synchronize()
        if losses and not torch.isfinite(losses[-1]).item():
            notes.append(NONFINITE_LOSS_NOTE)
        profile = None
        if config.profile_step:
            profile = profile_step(step, device, synchronize, step_ms=summarize(times.measured_ms).median, clock=clock)
        return times, profile


def _captured_step(
    config: BenchmarkConfig,
    model: nn.Module,
    device: torch.device,
    notes: list[str],
    memory: PhaseMemory,
) -> Callable[[], None]:
    """The whole step captured in a CUDA graph (cuda_graphs.py); the capture is the first step."""
    optimizer = cuda_graphs.make_optimizer(model) if config.pass_type == "train-step" else None
    batch = cuda_graphs.StaticBatch(*make_batch(config, device))
    body = cuda_graphs.step_body(model, batch, config.pass_type, optimizer, lambda: autocast(config.precision, device))
    with memory.phase("step"):  # first step: the eager iterations (AdamW state created) and the capture
        captured = cuda_graphs.CapturedStep(body, model)
    notes.append(
        f"CUDA graph replays, captured after {cuda_graphs.CAPTURE_WARMUP_ITERS} eager iterations; "
        "no per-phase times (a replay is one call)"
    )
    return captured


def _record_memory(record: BenchmarkRecord, memory: PhaseMemory, baseline: int) -> None:
    """First step (optimizer state created) and steady state (the extra traced step), per phase.

    CUDA figures are the allocator's absolute counters; CPU figures are RSS minus the
    RSS before the model was built, and peak_memory_bytes is the RSS high-water mark
    over the measured steps.
    """
    offset = baseline if memory.source == "rss_high_water_mark" else 0
    first, steady = memory.steps[0], memory.steps[-1]
    record.memory_source, record.memory_baseline_bytes = memory.source, baseline

    def phase_peak(step: dict, name: str) -> int | None:
        return step[name][0] - offset if name in step else None

    record.forward_peak_bytes = phase_peak(steady, "forward")
    record.backward_peak_bytes = phase_peak(steady, "backward")
    record.optimizer_peak_bytes = phase_peak(steady, "optimizer")
    record.first_forward_peak_bytes = phase_peak(first, "forward")
    record.first_backward_peak_bytes = phase_peak(first, "backward")
    record.first_optimizer_peak_bytes = phase_peak(first, "optimizer")
    first_allocated, first_reserved = step_peak(first)
    record.first_step_peak_bytes, record.first_step_reserved_bytes = first_allocated - offset, first_reserved
    if memory.source == "cuda_allocator":
        record.peak_memory_bytes, record.peak_reserved_bytes = step_peak(steady)
    else:
        record.peak_memory_bytes = memory.measured_peak[0] - offset


def run_benchmark(
    config: BenchmarkConfig,
    *,
    model: nn.Module | None = None,
    environment: Environment | None = None,
    clock: Callable[[], float] = time.perf_counter,
    memory_baseline_bytes: int | None = None,
    memory_snapshot: str | None = None,
) -> BenchmarkRecord:
    """Measure one configuration.

    Pass `model` to reuse one already built (sweeps), with `memory_baseline_bytes` the
    device memory in use before it was built (else it is estimated as the memory in use
    now minus the model's parameters and buffers). `memory_snapshot` (CUDA) records the
    allocator's history over the measured steps to that pickle file.
    """
    device = resolve_device(config.device)
    env = environment or collect_environment(device)
    num_params = (
        count_parameters(model) if model is not None else count_parameters_for(config.model, config.model_factory)
    )
    record = new_record(config, device, env, num_params)
    notes = ["NVTX ranges on (ranges cost about 1 us each on the host)"] if nvtx.is_enabled() else []
    step_flops = flops_per_step(
        config.model, config.batch_size, config.context_length, config.pass_type, config.model_factory, device
    )
    if step_flops is not None:
        record.flops_per_step, record.flops_source = step_flops.flops_per_step, step_flops.source
        model_flops = step_flops.model_flops
    else:
        model_flops = None
    if config.model_factory is None:
        record.predicted_memory_bytes = estimate_memory(
            config.model, config.batch_size, config.context_length, config.pass_type, config.precision, device.type
        ).peak_bytes

    reason = unsupported_reason(config.precision, device)
    if reason is None and config.compile:
        reason = compile_unsupported_reason(device)
    if reason is None and config.cuda_graphs:
        reason = cuda_graphs.unsupported_reason(
            device, config.precision, config.compile_mode if config.compile else None
        )
    if reason is not None:
        record.status, record.error = "unsupported", reason
        return record
    if device.type == "cpu" and not cpu_has_native(config.precision):
        notes.append(f"this CPU has no native {config.precision} matmul: it is emulated and far slower than fp32")

    owns_model = model is None
    times = failure = None
    memory = PhaseMemory(device)
    if model is None:
        release_memory(device)
        baseline = current_memory_bytes(device)
    elif memory_baseline_bytes is not None:
        baseline = memory_baseline_bytes
    else:
        baseline = current_memory_bytes(device) - _tensor_bytes(model)
        notes.append("memory baseline estimated as memory in use minus the reused model's parameters")
    with precision_mode(config.precision, device) as state:
        record.autocast_dtype = state.autocast_dtype
        record.matmul_precision = state.matmul_precision
        record.cuda_matmul_allow_tf32 = state.cuda_matmul_allow_tf32
        record.cudnn_allow_tf32 = state.cudnn_allow_tf32
        record.grad_scaler = state.grad_scaler
        try:
            torch.manual_seed(config.seed)
            if model is None:
                model = build_model(config.model, device, config.model_factory)
                if config.model_factory:
                    check_model_output(model, config.model, device, f"--model-factory {config.model_factory}")
            record.num_params = count_parameters(model)
            times, profile = _measure(config, model, device, clock, record, notes, memory, memory_snapshot)
        except (ModelFactoryError, OptimizerFactoryError) as exc:
            failure = ("error", str(exc))
        except Exception as exc:  # any failure is a row; OOM is told apart from the rest
            failure = failure_status(exc)
        finally:
            # Drop every reference to the failed step's tensors before freeing memory.
            if model is not None:
                model.zero_grad(set_to_none=True)
            if owns_model:
                model = None
            release_memory(device)

    if failure is not None:
        record.status, record.error = failure
    else:
        record.step_ms, record.warmup_step_ms = list(times.measured_ms), list(times.warmup_ms)
        record.add_summary(summarize(times.measured_ms))
        record.add_phases(times.phase_ms)
        if profile is not None:
            record.add_profile(profile)
        record.tokens_per_s = config.tokens_per_step / (record.mean_ms / 1e3)
        peak = resolve_peak(device, env.device_name, config.precision, config.peak, config.peak_tflops)
        record.peak_tflops, record.peak_source = peak.tflops, peak.source
        record.achieved_tflops, record.mfu = mfu(model_flops, record.mean_ms / 1e3, peak)
        _record_memory(record, memory, baseline)
    record.notes = "; ".join(notes) or None
    return record
