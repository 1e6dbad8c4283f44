"""Run one benchmark configuration: build, step, time, record.

Flow: BenchmarkConfig -> model -> step function (step.py) -> time_steps -> BenchmarkRecord.
Out-of-memory anywhere (building, first step, measured steps) is a result with
status 'oom', never a crash; the memory is released so a sweep can go on.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import torch
from torch import nn

from . import cuda_graphs, nvtx
from .config import BenchmarkConfig
from .contention import machine_load, with_load
from .device import (
    compile_unsupported_reason,
    failure_status,
    release_memory,
    resolve_device,
)
from .factory import build_model, count_parameters_for
from .flops import flops_per_step, mfu
from .memory import PhaseMemory, baseline_memory_bytes, current_memory_bytes, estimate_config, step_peak
from .models import count_parameters
from .optimizer import OptimizerFactoryError, make_optimizer, optimizer_name
from .peak_flops import Peak, resolve_peak
from .precision import (
    cpu_has_native,
    parameters_in,
    precision_mode,
    unsupported_reason,
)
from .profiling import StepProfile, profile_step
from .results import BenchmarkRecord, Environment, collect_environment
from .results.records import NONFINITE_LOSS_NOTE
from .stats import per_second, summarize
from .step import CUDA_GRAPH_NOTE, captured_step, combine_phases, compiled, make_step
from .timing import (
    HostTimer,
    StepTimes,
    device_synchronizer,
    make_phase_recorder,
    make_timer,
    time_steps,
)
from .user_model import ModelFactoryError, check_model_output
from .usercode import DEFAULT_TIMEOUT, StepLimits, UserCodeError, UserCodeTimeout, guarded

OPTIMIZER_STATE_NOTE = "first measured step includes creating the AdamW state (no warmup step ran before it)"


OPTIMIZER_UNCHANGED_NOTE = (
    "the optimizer's step() left every parameter unchanged (checked on an untimed step): the optimizer part of "
    "these times updated nothing (an fp16 GradScaler skips steps whose gradients overflow)"
)
PARAMETER_SAMPLE = 64  # elements per parameter compared before and after a step: any real update changes them


def _parameter_sample(model: nn.Module) -> list[torch.Tensor]:
    """A strided sample of every parameter, copied: enough to see whether a step changed it."""
    samples = []
    for parameter in model.parameters():
        flat = parameter.detach().reshape(-1)
        samples.append(flat[:: max(1, flat.numel() // PARAMETER_SAMPLE)].clone())
    return samples


def _tensor_bytes(model: nn.Module) -> int:
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


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


def _measure(
    config: BenchmarkConfig,
    model: nn.Module,
    device: torch.device,
    clock: Callable[[], float],
    record: BenchmarkRecord,
    notes: list[str],
    memory: PhaseMemory,
    memory_snapshot: str | None,
    rearm: Callable[[], None] = lambda: None,
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
        stack.enter_context(parameters_in(model, PARAM_DTYPES[config.param_dtype]))
        runnable = (
            stack.enter_context(compiled(model, config.compile_scope, config.compile_mode)) if config.compile else model
        )
        losses: list[torch.Tensor] = []  # the traced steps' (untimed): first and last
        if config.cuda_graphs:
            memory.new_step()
            step, optimizer = captured_step(config, runnable, device, memory.phase)
            record.optimizer = optimizer_name(optimizer) if optimizer is not None else None
            traced = None
            notes.append(CUDA_GRAPH_NOTE)
            phases = None
        else:
            optimizer = (
                make_optimizer(model, device, config.optimizer_factory, master_weights=config.param_dtype != "fp32")
                if config.pass_type == "train-step"
                else None
            )
            record.optimizer = optimizer_name(optimizer) if optimizer is not None else None
            # do_bench calls the step many times per sample: its phases would add up over those calls
            phases = make_phase_recorder(device, clock) if config.timer != "do-bench" else None
            # phases.phase innermost: memory instrumentation stays outside the phase times
            timed_phases = [phases.phase] if phases is not None else []
            plain = make_step(config, runnable, device, optimizer, phase=combine_phases(nvtx.range, *timed_phases))
            traced = make_step(
                config,
                runnable,
                device,
                optimizer,
                phase=combine_phases(memory.phase, nvtx.range, *timed_phases),
                losses=losses,
            )
            steps_run = []

            def step() -> None:
                rearm()  # each step gets the whole --timeout (one setitimer call)
                if not steps_run:
                    memory.new_step()
                (traced if not steps_run else plain)()
                steps_run.append(1)

            if config.compile:
                record.compile_s = HostTimer(clock, synchronize).time_ms(step) / 1e3
            elif config.pass_type == "train-step" and config.warmup_steps == 0 and config.timer != "do-bench":
                notes.append(OPTIMIZER_STATE_NOTE)  # do_bench's own first calls create the state, untimed
        during = contextlib.ExitStack()
        during.enter_context(memory.whole())
        during.enter_context(cuda_memory_history(memory_snapshot, device))
        load = during.enter_context(machine_load(device))  # how busy other processes kept the machine
        times = time_steps(
            step,
            warmup_steps=config.warmup_steps,
            measure_steps=config.measure_steps,
            timer=make_timer(config.timer, device, clock),
            during_measurement=during,
            phases=phases,
            target_iqr_pct=config.target_iqr_pct,
            max_measure_s=config.max_measure_s,
        )
        record.environment = with_load(record.environment, load.load)
        record.iqr_target_reached = times.target_reached
        memory.new_step()  # the steady state: one more step, traced
        if traced is not None:
            before = _parameter_sample(model) if config.pass_type == "train-step" else None
            traced()
            if before is not None and all(torch.equal(a, b) for a, b in zip(before, _parameter_sample(model))):
                notes.append(OPTIMIZER_UNCHANGED_NOTE)
        else:  # one more replay, traced as a whole step
            with memory.phase("step"):
                step()
            losses.append(step.loss.detach().clone())  # the replay's static output
        synchronize()
        if losses and not torch.isfinite(losses[-1]).item():  # the model computes garbage: its row says so
            record.status, record.error = "wrong", f"{NONFINITE_LOSS_NOTE} after the measured steps (times kept)"
        profile = None
        if config.profile_step:
            profile = profile_step(step, device, synchronize, step_ms=summarize(times.measured_ms).median, clock=clock)
        return times, profile


PARAM_DTYPES = {"fp32": None, "bf16": torch.bfloat16}  # config.PARAM_DTYPES -> the cast (None: as built)
DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64"}


def _built_dtype(model: nn.Module) -> str | None:
    """The parameters' dtype where a model uncast by --param-dtype was built in another than fp32 (a
    user's fp16 model): the row's param_dtype says what it trained, as --param-dtype bf16's does."""
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if not dtypes - {torch.float32}:
        return None
    return "+".join(sorted(DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch.")) for dtype in dtypes))


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
        # A CUDA-graph replay allocates nothing: its footprint is the capture's peak (graph pool included).
        capture = first.get("capture")
        record.peak_memory_bytes, record.peak_reserved_bytes = capture if capture is not None else step_peak(steady)
    else:
        record.peak_memory_bytes = memory.measured_peak[0] - offset


def _peak_or_note(device: torch.device, device_name: str, config: BenchmarkConfig) -> Peak:
    """The MFU denominator; finding it never costs the measured row (a probe that fails, an
    unusable cache): no MFU, and a note saying why."""
    try:
        return resolve_peak(device, device_name, config.precision, config.peak, config.peak_tflops)
    except Exception as exc:  # the measured times stand without an MFU
        return Peak(None, "unknown", notes=(f"no MFU: finding the peak failed ({type(exc).__name__}: {exc})",))


def run_benchmark(
    config: BenchmarkConfig,
    *,
    model: nn.Module | None = None,
    environment: Environment | None = None,
    clock: Callable[[], float] = time.perf_counter,
    memory_baseline_bytes: int | None = None,
    memory_snapshot: str | None = None,
    timeout_s: float | StepLimits | None = DEFAULT_TIMEOUT,
) -> BenchmarkRecord:
    """Measure one configuration.

    The model (a user's factory), its optimizer and every step run inside usercode.guarded: a step
    that exits, interrupts itself or takes longer than `timeout_s` is an 'error' or 'timeout' row.

    Pass `model` to reuse one already built (sweeps), with `memory_baseline_bytes` the
    device memory in use before it was built (else it is estimated as the memory in use
    now minus the model's parameters and buffers). `memory_snapshot` (CUDA) records the
    allocator's history over the measured steps to that pickle file.
    """
    device = resolve_device(config.device)
    env = environment or collect_environment(device)
    user_code = (
        " or ".join(
            f"{flag} {spec}"
            for flag, spec in (("--model-factory", config.model_factory), ("--optimizer", config.optimizer_factory))
            if spec
        )
        or "the step"
    )
    try:
        with guarded(user_code, timeout_s):  # a user's factory is built on the meta device here
            num_params = (
                count_parameters(model)
                if model is not None
                else count_parameters_for(config.model, config.model_factory)
            )
            step_flops = flops_per_step(  # K micro-batches of B sequences: the work of one batch of K * B
                config.model,
                config.batch_size * config.grad_accum_steps,
                config.context_length,
                config.pass_type,
                config.model_factory,
                device,
            )
    except (UserCodeError, UserCodeTimeout) as exc:
        record = BenchmarkRecord.for_config(config, device, env, None)
        record.status, record.error = failure_status(exc)
        return record
    record = BenchmarkRecord.for_config(config, device, env, num_params)
    notes = ["NVTX ranges on (ranges cost about 1 us each on the host)"] if nvtx.is_enabled() else []
    if step_flops is not None:
        record.flops_per_step, record.flops_source = step_flops.flops_per_step, step_flops.source
        model_flops = step_flops.model_flops
    else:
        model_flops = None
    if config.model_factory is None:
        record.predicted_memory_bytes = estimate_config(config, device.type).peak_bytes

    # what depends on the device (the configuration refused its own contradictions when it was made)
    reason = unsupported_reason(config.precision, device)
    if reason is None and config.compile:
        reason = compile_unsupported_reason(device)
    if reason is None and config.cuda_graphs:
        reason = cuda_graphs.unsupported_reason(device)
    if reason is not None:
        record.status, record.error = "unsupported", reason
        return record
    if device.type == "cpu" and not cpu_has_native(config.precision):
        notes.append(f"this CPU has no native {config.precision} matmul: it is emulated and far slower than fp32")

    owns_model = model is None
    times = failure = None
    memory = PhaseMemory(device, step_starts_at_forward=False)
    if model is None:
        release_memory(device)
        baseline = baseline_memory_bytes(device, [config])
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
            with guarded(user_code, timeout_s) as rearm:
                torch.manual_seed(config.seed)
                if model is None:
                    model = build_model(config.model, device, config.model_factory)
                    if config.model_factory:
                        check_model_output(model, config.model, device, f"--model-factory {config.model_factory}")
                record.num_params = count_parameters(model)
                record.param_dtype = record.param_dtype or _built_dtype(model)
                times, profile = _measure(config, model, device, clock, record, notes, memory, memory_snapshot, rearm)
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
        # Throughput and MFU on the median step, the statistic every table leads with.
        record.tokens_per_s = per_second(config.tokens_per_step, record.median_ms)
        peak = _peak_or_note(device, env.device_name, config)
        record.peak_tflops, record.peak_source, record.peak_measured_at = peak.tflops, peak.source, peak.measured_at
        record.achieved_tflops, record.mfu = mfu(model_flops, record.median_ms, peak.tflops)
        notes += peak.notes
        _record_memory(record, memory, baseline)
    record.notes = "; ".join(notes) or None
    return record
