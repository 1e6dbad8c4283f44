"""Run one benchmark configuration: build, step, time, record.

Flow: BenchmarkConfig -> model -> step function (step.py) -> time_steps -> BenchmarkRecord.
Each phase of a run returns what it saw into one `Measured`, which `_fill` puts into the record in
one place. Out-of-memory anywhere (building, first step, measured steps) is a result with
status 'oom', never a crash; the memory is released so a sweep can go on.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from . import cuda_graphs, nvtx, process_state
from .config import BenchmarkConfig
from .contention import Load, machine_load, with_load
from .device import compile_unsupported_reason, failure_status, release_memory, resolve_device
from .factory import build_model, count_parameters_for
from .flops import flops_per_step, mfu
from .memory import (
    PhaseMemory,
    baseline_memory_bytes,
    cuda_memory_history,
    current_memory_bytes,
    estimate_config,
    memory_columns,
    tensor_bytes,
)
from .models import count_parameters
from .optimizer import (
    OPTIMIZER_UNCHANGED_NOTE,
    OptimizerFactoryError,
    make_optimizer,
    optimizer_name,
    parameter_sample,
)
from .peak_flops import Peak, resolve_peak
from .precision import (
    PARAM_CASTS,
    PrecisionState,
    built_dtype,
    cpu_has_native,
    parameters_in,
    precision_mode,
    unsupported_reason,
)
from .profiling import StepProfile, profile_step
from .progress import StepHeartbeat
from .results import BenchmarkRecord, Environment, collect_environment
from .results.records import NONFINITE_LOSS_NOTE
from .stats import per_second, summarize
from .step import CUDA_GRAPH_NOTE, captured_step, combine_phases, compiled, compiling, describe_config, make_step
from .timing import (
    HostTimer,
    PhaseRecorder,
    StepTimes,
    device_synchronizer,
    make_phase_recorder,
    make_timer,
    time_steps,
)
from .user_model import ModelFactoryError, check_model_output
from .usercode import DEFAULT_TIMEOUT, StepLimits, UserCodeError, UserCodeTimeout, guarded

OPTIMIZER_STATE_NOTE = "first measured step includes creating the AdamW state (no warmup step ran before it)"


@dataclass(frozen=True)
class Run:
    """What every phase of one configuration's run reads."""

    config: BenchmarkConfig
    device: torch.device
    clock: Callable[[], float]
    memory_snapshot: str | None  # CUDA: the allocator's history over the measured steps, dumped here
    user_code: str  # what a failure inside usercode.guarded is blamed on
    timeout_s: float | StepLimits | None
    heartbeat: StepHeartbeat  # says what the run does next, and that a slow one lives


@dataclass
class Measured:
    """What a run saw, kept as each phase returns it: a run that fails part-way keeps what came before
    (the optimizer it made, its compile time, its notes). _fill puts it into the record."""

    memory: PhaseMemory  # peaks per phase of the first and the steady-state step
    baseline_bytes: int  # memory in use before the model was built
    notes: list[str]
    precision: PrecisionState | None = None
    num_params: int | None = None  # counted on the built model
    built_dtype: str | None = None  # precision.built_dtype
    optimizer: str | None = None
    compile_s: float | None = None
    times: StepTimes | None = None
    load: Load | None = None  # how busy other processes kept the machine over the measured steps
    wrong: str | None = None  # why the row measured another step than its configuration's (times kept)
    changed: dict = field(default_factory=dict)  # process settings the user's code changed (process_state)
    profile: StepProfile | None = None
    failure: tuple[str, str] | None = None  # (status, error)


@dataclass
class Steps:
    """The step the timer calls and, for memory, the same step traced (None for a CUDA graph: its
    replay is traced whole); `losses`: the traced steps' (untimed), first and last."""

    step: Callable[[], None]
    traced: Callable[[], None] | None = None
    phases: PhaseRecorder | None = None
    losses: list[torch.Tensor] = field(default_factory=list)


def _eager_steps(run: Run, runnable: nn.Module, optimizer, memory: PhaseMemory, rearm: Callable[[], None]) -> Steps:
    """The eager step: its first call traced for memory, the others plain; each call rearms --timeout."""
    config, device = run.config, run.device
    # do_bench calls the step many times per sample: its phases would add up over those calls
    phases = make_phase_recorder(device, run.clock) if config.timer != "do-bench" else None
    # phases.phase innermost: memory instrumentation stays outside the phase times
    timed_phases = [phases.phase] if phases is not None else []
    losses: list[torch.Tensor] = []
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

    return Steps(step, traced, phases, losses)


def _time(run: Run, steps: Steps, memory: PhaseMemory) -> tuple[StepTimes, Load | None]:
    """The warmup and measured steps; memory, the allocator's history and the machine's load over them."""
    config, device = run.config, run.device
    during = contextlib.ExitStack()
    during.enter_context(memory.whole())
    during.enter_context(cuda_memory_history(run.memory_snapshot, device))
    load = during.enter_context(machine_load(device))  # how busy other processes kept the machine
    run.heartbeat.phase("the warmup steps, then the measured ones" if config.warmup_steps else "the measured steps")
    times = time_steps(
        steps.step,
        warmup_steps=config.warmup_steps,
        measure_steps=config.measure_steps,
        timer=make_timer(config.timer, device, run.clock),
        during_measurement=during,
        phases=steps.phases,
        target_iqr_pct=config.target_iqr_pct,
        max_measure_s=config.max_measure_s,
        after_step=run.heartbeat,
    )
    return times, load.load


def _steady_step(run: Run, model: nn.Module, steps: Steps, memory: PhaseMemory) -> list[str]:
    """One more step, traced: the steady state's memory and last loss. Its notes: an optimizer that
    changed nothing."""
    memory.new_step()
    run.heartbeat.phase("one more step, traced: the steady state's memory")
    if steps.traced is None:  # one more replay, traced as a whole step
        with memory.phase("step"):
            steps.step()
        steps.losses.append(steps.step.loss.detach().clone())  # the replay's static output
        return []
    before = parameter_sample(model) if run.config.pass_type == "train-step" else None
    steps.traced()
    if before is not None and all(torch.equal(a, b) for a, b in zip(before, parameter_sample(model))):
        return [OPTIMIZER_UNCHANGED_NOTE]
    return []


def _measure(run: Run, model: nn.Module, rearm: Callable[[], None], seen: Measured) -> None:
    """Compile (if asked, timed apart), then the warmup and measured steps, then the
    profiled step (if asked): its cost stays outside the timed steps. Each phase's result
    goes into `seen` as soon as it returns, so a later failure keeps it.

    Memory is traced per phase on the first step run and on one extra, untimed step after
    the measured ones (the steady state); the measured steps themselves carry only one
    peak reset before them and one read after, so the instrumentation costs them nothing.
    Phase times come from the measured steps themselves (timing.make_phase_recorder).
    """
    config, device, memory = run.config, run.device, seen.memory
    model.train(config.pass_type != "forward")
    synchronize = device_synchronizer(device)
    with contextlib.ExitStack() as stack:
        stack.enter_context(parameters_in(model, PARAM_CASTS[config.param_dtype]))
        runnable = (
            stack.enter_context(compiled(model, config.compile_scope, config.compile_mode)) if config.compile else model
        )
        if config.cuda_graphs:
            memory.new_step()
            captured, optimizer = captured_step(config, runnable, device, memory.phase)
            seen.optimizer = optimizer_name(optimizer) if optimizer is not None else None
            seen.notes.append(CUDA_GRAPH_NOTE)
            steps = Steps(captured)
        else:
            optimizer = (
                make_optimizer(model, device, config.optimizer_factory, master_weights=config.param_dtype != "fp32")
                if config.pass_type == "train-step"
                else None
            )
            seen.optimizer = optimizer_name(optimizer) if optimizer is not None else None
            steps = _eager_steps(run, runnable, optimizer, memory, rearm)
            if config.compile:
                run.heartbeat.phase("compiling: the first step, timed apart as compile_s")
                seen.compile_s = (
                    compiling(lambda: HostTimer(run.clock, synchronize).time_ms(steps.step), seen.notes) / 1e3
                )
            elif config.pass_type == "train-step" and config.warmup_steps == 0 and config.timer != "do-bench":
                seen.notes.append(OPTIMIZER_STATE_NOTE)  # do_bench's own first calls create the state, untimed
        seen.times, seen.load = _time(run, steps, memory)
        seen.notes += _steady_step(run, model, steps, memory)
        synchronize()
        if steps.losses and not torch.isfinite(steps.losses[-1]).item():  # the model computes garbage
            seen.wrong = f"{NONFINITE_LOSS_NOTE} after the measured steps (times kept)"
        trained = [p for p in model.parameters() if p.requires_grad] if config.pass_type != "forward" else []
        # no .grad after the step, and (train-step: an optimizer may set them to None) no parameter changed
        unchanged = config.pass_type != "train-step" or OPTIMIZER_UNCHANGED_NOTE in seen.notes
        if steps.traced is not None and trained and unchanged and all(p.grad is None for p in trained):
            seen.wrong = "backward reached no parameter of the model (every .grad stayed None; times kept)"
        if config.profile_step:
            run.heartbeat.phase("one more step under torch.profiler: kernels_per_step, device_busy_pct")
            median_ms = summarize(seen.times.measured_ms).median
            seen.profile = profile_step(steps.step, device, synchronize, step_ms=median_ms, clock=run.clock)


def _peak_or_note(device: torch.device, device_name: str, config: BenchmarkConfig) -> Peak:
    """The MFU denominator; finding it never costs the measured row (a probe that fails, an
    unusable cache): no MFU, and a note saying why."""
    try:
        return resolve_peak(device, device_name, config.precision, config.peak, config.peak_tflops)
    except Exception as exc:  # the measured times stand without an MFU
        return Peak(None, "unknown", notes=(f"no MFU: finding the peak failed ({type(exc).__name__}: {exc})",))


def _user_code(config: BenchmarkConfig) -> str:
    """What a failure inside usercode.guarded is blamed on: the user's factories, else the step."""
    specs = (("--model-factory", config.model_factory), ("--optimizer", config.optimizer_factory))
    return " or ".join(f"{flag} {spec}" for flag, spec in specs if spec) or "the step"


def _unsupported_reason(config: BenchmarkConfig, device: torch.device) -> str | None:
    """What depends on the device (the configuration refused its own contradictions when it was made)."""
    reason = unsupported_reason(config.precision, device)
    if reason is None and config.compile:
        reason = compile_unsupported_reason(device)
    if reason is None and config.cuda_graphs:
        reason = cuda_graphs.unsupported_reason(device)
    return reason


def _baseline(
    config: BenchmarkConfig, model: nn.Module | None, device: torch.device, given: int | None
) -> tuple[int, list[str]]:
    """The memory in use before the model was built, and a note where it is estimated."""
    if model is None:
        release_memory(device)
        return baseline_memory_bytes(device, [config]), []
    if given is not None:
        return given, []
    estimated = current_memory_bytes(device) - tensor_bytes(model)
    return estimated, ["memory baseline estimated as memory in use minus the reused model's parameters"]


def _build_and_measure(run: Run, model: nn.Module | None, seen: Measured) -> None:
    """Build the model (unless given), then measure it; any failure is `seen.failure`, and the memory
    of a failed step is released either way."""
    config, device = run.config, run.device
    owns_model = model is None
    with precision_mode(config.precision, device) as state:
        seen.precision = state
        try:
            with guarded(run.user_code, run.timeout_s, seen.changed) as rearm:
                torch.manual_seed(config.seed)
                if model is None:
                    run.heartbeat.phase("building the model")
                    model = build_model(config.model, device, config.model_factory)
                    if config.model_factory:
                        check_model_output(model, config.model, device, f"--model-factory {config.model_factory}")
                seen.num_params, seen.built_dtype = count_parameters(model), built_dtype(model)
                _measure(run, model, rearm, seen)
        except (ModelFactoryError, OptimizerFactoryError) as exc:
            seen.failure = ("error", str(exc))
        except Exception as exc:  # any failure is a row; OOM is told apart from the rest
            seen.failure = failure_status(exc)
        finally:
            # Drop every reference to the failed step's tensors before freeing memory.
            if model is not None:
                model.zero_grad(set_to_none=True)
            if owns_model:
                model = None
            release_memory(device)


def _fill(record: BenchmarkRecord, run: Run, seen: Measured, model_flops: float | None) -> None:
    """What the run saw, into its record: the one place a measured row is filled."""
    state = seen.precision
    matmul = seen.changed.get(process_state.MATMUL, state.matmul_precision)  # in effect over the measured steps
    record.autocast_dtype, record.matmul_precision = state.autocast_dtype, matmul
    record.cuda_matmul_allow_tf32, record.cudnn_allow_tf32 = matmul != "highest", state.cudnn_allow_tf32
    record.grad_scaler = state.grad_scaler
    if seen.num_params is not None:
        record.num_params, record.param_dtype = seen.num_params, record.param_dtype or seen.built_dtype
    record.optimizer, record.compile_s = seen.optimizer, seen.compile_s
    if seen.times is not None:
        record.environment = with_load(record.environment, seen.load)
        record.iqr_target_reached = seen.times.target_reached
    changed_error, changed_notes = process_state.verdict(seen.changed, run.user_code)
    notes = seen.notes + changed_notes
    if seen.failure is not None:
        record.status, record.error = seen.failure
    else:
        if seen.wrong or changed_error:
            record.status, record.error = "wrong", f"{changed_error} (times kept)" if changed_error else seen.wrong
        times = seen.times
        record.step_ms, record.warmup_step_ms = list(times.measured_ms), list(times.warmup_ms)
        record.add_summary(summarize(times.measured_ms))
        record.add_phases(times.phase_ms)
        if seen.profile is not None:
            record.add_profile(seen.profile)
        # Throughput and MFU on the median step, the statistic every table leads with.
        record.tokens_per_s = per_second(run.config.tokens_per_step, record.median_ms)
        run.heartbeat.phase(f"the MFU peak (--peak {run.config.peak}: as given, kept or probed)")
        peak = _peak_or_note(run.device, record.environment.device_name, run.config)
        record.peak_tflops, record.peak_source, record.peak_measured_at = peak.tflops, peak.source, peak.measured_at
        record.peak_low = peak.low
        record.achieved_tflops, record.mfu = mfu(model_flops, record.median_ms, peak.tflops)
        notes += peak.notes
        for column, value in memory_columns(seen.memory, seen.baseline_bytes).items():
            setattr(record, column, value)
    record.notes = "; ".join(notes) or None


def run_benchmark(
    config: BenchmarkConfig,
    *,
    model: nn.Module | None = None,
    environment: Environment | None = None,
    clock: Callable[[], float] = time.perf_counter,
    memory_baseline_bytes: int | None = None,
    memory_snapshot: str | None = None,
    timeout_s: float | StepLimits | None = DEFAULT_TIMEOUT,
    announce: bool = False,
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
    heartbeat = StepHeartbeat(describe_config(config), announce=announce)  # a line as each phase starts, with announce
    run = Run(config, device, clock, memory_snapshot, _user_code(config), timeout_s, heartbeat)
    try:
        with guarded(run.user_code, timeout_s):  # a user's factory is built on the meta device here
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
    if step_flops is not None:
        record.flops_per_step, record.flops_source = step_flops.flops_per_step, step_flops.source
    if config.model_factory is None:
        record.predicted_memory_bytes = estimate_config(config, device.type).peak_bytes
    if reason := _unsupported_reason(config, device):
        record.status, record.error = "unsupported", reason
        return record

    notes = ["NVTX ranges on (ranges cost about 1 us each on the host)"] if nvtx.is_enabled() else []
    if device.type == "cpu" and not cpu_has_native(config.precision):
        notes.append(f"this CPU has no native {config.precision} matmul: it is emulated and far slower than fp32")
    baseline, baseline_notes = _baseline(config, model, device, memory_baseline_bytes)
    seen = Measured(PhaseMemory(device, step_starts_at_forward=False), baseline, [*notes, *baseline_notes])
    with heartbeat.running():
        _build_and_measure(run, model, seen)
        _fill(record, run, seen, step_flops.model_flops if step_flops is not None else None)
    return record
