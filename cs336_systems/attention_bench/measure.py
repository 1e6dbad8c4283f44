"""Measure one attention configuration: inputs, the timed forward and backward, memory and what
autograd saves. Out of memory (or any failure) is a row, never a raise."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch._functorch.config  # donated_buffer, patched around each row (run_attention)

from ..adapters import Adapters, NotImplementedAdapter
from ..contention import Load, machine_load, with_load
from ..device import compile_unsupported_reason, failure_status, release_memory, resolve_device
from ..memory import PhaseMemory, current_memory_bytes, rss_high_water_mark_available
from ..precision import cpu_has_native, precision_mode, unsupported_reason
from ..results import Environment, collect_environment, fill_timing
from ..stats import NOISE, per_second, summarize
from ..step import compiling
from ..timing import HostTimer, device_synchronizer, make_timer
from ..usercode import DEFAULT_TIMEOUT, StepLimits, guarded
from .config import FLASH_IMPLEMENTATIONS, PASSES, TENSOR_DTYPES, AttentionConfig
from .correctness import Verdict, check, judge_causal, reference
from .dobench import TRITON, do_bench_backend
from .implementations import attention_for
from .passes import Samples, clear_grads, do_bench_passes, timed_passes
from .record import AttentionRecord, new_record


def sdpa_backend_name(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = True) -> str | None:
    """Which kernel F.scaled_dot_product_attention dispatches to for these inputs (private torch API)."""
    try:
        from torch.nn.attention import SDPBackend

        return SDPBackend(torch._fused_sdp_choice(q, k, v, is_causal=is_causal)).name.lower()
    except Exception:  # private API: absent or changed in other torch versions
        return None


class SavedForBackward(torch.autograd.graph.saved_tensors_hooks):
    """Inside, the distinct storages autograd saves for backward (a custom autograd.Function's and a
    compiled function's too), by address."""

    def __init__(self):
        self.storages: dict[int, int] = {}
        super().__init__(self._pack, lambda tensor: tensor)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        self.storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    def bytes_with(self, *tensors: torch.Tensor) -> int:
        """The saved storages' bytes and those of `tensors`, each storage once."""
        also = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
        return sum({**self.storages, **also}.values())


def saved_tensor_bytes(function: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> int:
    """Bytes of the distinct storages autograd saves for backward in one call of `function`."""
    saved = SavedForBackward()
    with saved:
        out = function(*inputs)
    del out
    return saved.bytes_with()


def make_inputs(config: AttentionConfig, device: torch.device) -> tuple[torch.Tensor, ...]:
    """q, k, v (requiring grad) and the output gradient, seeded."""
    generator = torch.Generator(device=device).manual_seed(config.seed)
    dtype = TENSOR_DTYPES[config.precision]
    q, k, v, grad_out = (torch.randn(config.shape, generator=generator, device=device, dtype=dtype) for _ in range(4))
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), grad_out


class WrongOutput(Exception):
    """The implementation returned something that cannot be attention's output."""


def _check_output(out: object, q: torch.Tensor) -> None:
    if not isinstance(out, torch.Tensor):
        raise WrongOutput(f"returned {type(out).__name__}, not a tensor")
    if out.shape != q.shape:
        raise WrongOutput(f"output shape {tuple(out.shape)}, expected {tuple(q.shape)} (that of q)")
    if out.dtype != q.dtype or out.device != q.device:  # fp64 or a CPU copy would be timed as if it were not
        raise WrongOutput(f"output is {out.dtype} on {out.device}, expected {q.dtype} on {q.device} (that of q)")
    if not torch.isfinite(out).all():
        raise WrongOutput("output has NaN or infinite values")


class NotHere(Exception):
    """The implementation exists but cannot run on this device."""


@dataclass(frozen=True)
class Run:
    """What every phase of one configuration's run reads."""

    config: AttentionConfig
    device: torch.device
    clock: Callable[[], float]
    adapters: Adapters | None
    counts_memory: bool  # the record has a memory source (the CUDA allocator, or RSS)


@dataclass
class Measured:
    """What a run saw, kept as each phase returns it: a failure keeps what came before (the compile
    time, the memory, the check, the passes already timed). `phase` names the part running now, for an
    error row; _fill puts the rest into the record."""

    phase: str = "setup"
    notes: list[str] = field(default_factory=list)
    compile_s: float | None = None
    sdpa_backend: str | None = None
    memory_before_backward_bytes: int | None = None
    forward_peak_bytes: int | None = None
    backward_peak_bytes: int | None = None
    verdict: Verdict | None = None
    timer_used: str | None = None
    passes: dict[str, Samples] = field(default_factory=dict)  # each pass's (measured, warmup)
    saved_for_backward_bytes: int | None = None
    load: Load | None = None  # how busy other processes kept the machine meanwhile
    failure: tuple[str, str] | None = None  # (status, error)


class Attend:
    """The implementation under test, called once per step (each call rearms --timeout); the PyTorch
    flash may be swapped for its non-causal call after the check (correctness.judge_causal)."""

    def __init__(self, function: Callable, rearm: Callable[[], None]):
        self.function, self.rearm = function, rearm

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.rearm()
        return self.function(q, k, v)


def _compile_s(run: Run, attend: Attend, timer: HostTimer) -> float:
    """Compile on inputs of the same shape that are freed before memory is counted: forward, backward."""
    q, k, v, grad_out = make_inputs(run.config, run.device)
    held = {}
    compile_ms = timer.time_ms(lambda: held.setdefault("out", attend(q, k, v)))
    compile_ms += timer.time_ms(lambda: held.pop("out").backward(grad_out))
    return compile_ms / 1e3


def _untimed_pass(
    run: Run, attend: Attend, inputs: tuple[torch.Tensor, ...], baseline: int, seen: Measured
) -> torch.Tensor:
    """One forward and backward outside the clock: memory before backward and the peak of each pass
    (above `baseline`, the memory in use before the inputs were made), and the output (returned) and
    gradients the check compares with the reference."""
    device, (q, k, v, grad_out) = run.device, inputs
    sync = device_synchronizer(device)
    memory = PhaseMemory(device) if run.counts_memory else None
    seen.phase = "forward"
    saved = SavedForBackward() if memory and device.type == "cpu" else None
    with memory.phase("forward") if memory else contextlib.nullcontext(), saved or contextlib.nullcontext():
        out = attend(q, k, v)
        sync()
    _check_output(out, q)
    if saved is not None:  # a CPU has no allocator to ask (its RSS moves with malloc's arenas): the live
        # tensors the CUDA allocator would count, from the inputs on: inputs, what autograd saved, the output
        seen.memory_before_backward_bytes = saved.bytes_with(*inputs, out)
    elif memory:
        seen.memory_before_backward_bytes = current_memory_bytes(device) - baseline
    seen.phase = "backward"
    with memory.phase("backward") if memory else contextlib.nullcontext():
        out.backward(grad_out)
        sync()
    if memory:
        seen.forward_peak_bytes = memory.steps[-1]["forward"][0] - baseline
        seen.backward_peak_bytes = memory.steps[-1]["backward"][0] - baseline
    return out.detach()


def _check(run: Run, inputs: tuple[torch.Tensor, ...], out: torch.Tensor) -> tuple[Verdict, Callable | None]:
    """The output and gradients against the fp32 reference; and the non-causal call to time instead
    where a PyTorch flash is judged non-causal (correctness.judge_causal), else None."""
    config, (q, k, v, grad_out) = run.config, inputs
    try:
        expected_out, expected_grads = reference(q, k, v, grad_out, config.causal)
        result = check(out, (q.grad, k.grad, v.grad), expected_out, expected_grads, config.precision)
        del expected_out, expected_grads
    except torch.OutOfMemoryError:
        return Verdict(notes=("not checked: the fp32 reference ran out of memory",)), None
    if not (result.wrong and config.causal and config.implementation in FLASH_IMPLEMENTATIONS):
        return Verdict.of(result), None
    noncausal = attention_for(dataclasses.replace(config, causal=False), run.adapters)

    def run_noncausal() -> tuple[torch.Tensor, tuple]:
        fresh = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        plain_out = noncausal(*fresh)
        plain_out.backward(grad_out)
        return plain_out.detach(), tuple(t.grad for t in fresh)

    verdict = judge_causal(config, inputs, out, result, run_noncausal)
    return verdict, noncausal if verdict.noncausal else None


def _measure(run: Run, rearm: Callable[[], None], seen: Measured) -> None:
    """Compile (timed apart), one untimed pass for memory and the check, then each pass timed, then
    what autograd saves. Each phase's result goes into `seen` as soon as it returns."""
    config, device = run.config, run.device
    seen.phase = "compile" if config.implementation == "compiled" else "setup"
    # the adapter is asked first: not implemented beats not here
    attend = Attend(attention_for(config, run.adapters), rearm)
    if config.implementation == "flash-triton" and device.type != "cuda":
        raise NotHere("flash-triton: Triton kernels need a CUDA device")
    if config.implementation == "compiled":
        timer = HostTimer(run.clock, device_synchronizer(device))
        seen.compile_s = compiling(lambda: _compile_s(run, attend, timer), seen.notes)

    seen.phase = "setup"
    release_memory(device)
    baseline = current_memory_bytes(device) if run.counts_memory else 0
    q, k, v, grad_out = make_inputs(config, device)
    inputs = (q, k, v)
    if config.implementation == "sdpa":
        seen.sdpa_backend = sdpa_backend_name(q, k, v, config.causal)
    out = _untimed_pass(run, attend, (q, k, v, grad_out), baseline, seen)

    seen.phase = "check"
    rearm()  # our own reference is not the user's step; it gets the limit afresh (its first run imports)
    seen.verdict, noncausal = _check(run, (q, k, v, grad_out), out)
    seen.notes += seen.verdict.notes
    if noncausal is not None:
        attend.function = noncausal
    del out
    release_memory(device)
    rearm()

    clear_grads(inputs)
    if config.timer == "do-bench":
        seen.timer_used, do_bench, why = do_bench_backend(device)
        if why:
            seen.notes.append(why)
    else:
        seen.timer_used, do_bench = config.timer, None
    if do_bench is not None:
        passes = do_bench_passes(do_bench, attend, inputs, grad_out)
    else:
        passes = timed_passes(config, make_timer(seen.timer_used, device, run.clock), attend, inputs, grad_out)
    for name, timed in passes.items():
        seen.phase = name
        seen.passes[name] = timed()

    seen.phase = "saved-tensors count"
    clear_grads(inputs)
    seen.saved_for_backward_bytes = saved_tensor_bytes(attend, *inputs)


def _fill(record: AttentionRecord, seen: Measured) -> None:
    """What the run saw, into its record: the one place a measured row is filled."""
    record.compile_s, record.sdpa_backend = seen.compile_s, seen.sdpa_backend
    record.memory_before_backward_bytes = seen.memory_before_backward_bytes
    record.forward_peak_bytes, record.backward_peak_bytes = seen.forward_peak_bytes, seen.backward_peak_bytes
    if seen.verdict is not None:
        record.max_abs_err_out, record.max_abs_err_grad = seen.verdict.max_abs_err_out, seen.verdict.max_abs_err_grad
        record.check_tolerance = seen.verdict.tolerance
        if seen.verdict.wrong:
            record.status, record.error = "wrong", seen.verdict.wrong
    record.timer_used = seen.timer_used
    for name, (measured, warmup) in seen.passes.items():
        _keep(record, name, measured, warmup)
    record.saved_for_backward_bytes = seen.saved_for_backward_bytes
    record.environment = with_load(record.environment, seen.load)
    if seen.failure is not None:
        record.status, record.error = seen.failure


def _keep(record: AttentionRecord, prefix: str, measured: Sequence[float], warmup: Sequence[float]) -> None:
    setattr(record, f"{prefix}_samples_ms", list(measured))
    setattr(record, f"{prefix}_warmup_ms", list(warmup))
    _add_summary(record, prefix, measured)


def _add_summary(record: AttentionRecord, prefix: str, samples: Sequence[float]) -> None:
    summary = summarize(samples)
    setattr(record, f"{prefix}_steps", summary.n)
    fill_timing(record, summary, prefix=f"{prefix}_")
    flops = {"forward": 1, "backward": 2, "end_to_end": 3}[prefix] * record.forward_flops
    setattr(record, f"{prefix}_tflops", per_second(flops, summary.median) / 1e12)


def _notes(config: AttentionConfig, record: AttentionRecord, device: torch.device) -> list[str]:
    notes = []
    for name in PASSES:
        measured = getattr(record, f"{name}_steps")
        if measured is not None and measured < config.measure_steps and record.timer_used != TRITON:
            notes.append(
                f"{name}: {measured} of {config.measure_steps} steps (the {config.max_seconds:g} s budget ran out)"
            )
        spread = NOISE["median"].spread_of(record.to_row(), f"{name}_")
        if NOISE["median"].is_noisy(spread):
            notes.append(f"{name}: {NOISE['median'].warning(spread)}")
    if device.type == "cpu" and not cpu_has_native(config.precision):
        notes.append(f"this CPU has no native {config.precision} matmul: it is emulated and far slower than fp32")
    return notes


def run_attention(
    config: AttentionConfig,
    *,
    environment: Environment | None = None,
    clock: Callable[[], float] = time.perf_counter,
    memory_limit_bytes: int | None = None,
    adapters: Adapters | None = None,
    timeout_s: float | StepLimits | None = DEFAULT_TIMEOUT,
) -> AttentionRecord:
    """Measure one configuration. Out of memory (or any failure) is a row, never a raise; an
    adapter that raises NotImplementedError is a 'skipped' row, a wrong output a 'wrong' row.
    The implementation runs inside usercode.guarded: exiting is an 'error' row, a call or step
    longer than `timeout_s` a 'timeout' row."""
    device = resolve_device(config.device)
    env = environment or collect_environment(device)
    record = new_record(config, device, env)
    record.memory_limit_bytes = memory_limit_bytes
    if device.type == "cuda":
        record.memory_source = "cuda_allocator"
    elif rss_high_water_mark_available():  # before backward: the inputs, saved tensors and output (SavedForBackward)
        record.memory_source = "rss peaks; live tensors before backward"
    reason = unsupported_reason(config.precision, device)
    if reason is None and config.implementation == "compiled":
        reason = compile_unsupported_reason(device)
    if reason is not None:
        record.status, record.error = "unsupported", reason
        return record

    seen = Measured()
    run = Run(config, device, clock, adapters, counts_memory=record.memory_source is not None)
    # do_bench times backward again and again over one retained graph (retain_graph=True), which a
    # compiled backward that donates its buffers refuses (seen with torch 2.11 on CUDA)
    with precision_mode(config.precision, device) as state, torch._functorch.config.patch(donated_buffer=False):
        record.matmul_precision, record.cuda_matmul_allow_tf32 = state.matmul_precision, state.cuda_matmul_allow_tf32
        try:
            with guarded(config.implementation, timeout_s) as rearm, machine_load(device) as load:
                _measure(run, rearm, seen)
            seen.load = load.load
        except NotImplementedAdapter as exc:
            seen.failure = ("skipped", str(exc))
        except NotHere as exc:
            seen.failure = ("unsupported", str(exc))
        except WrongOutput as exc:
            seen.failure = ("wrong", f"{seen.phase}: {exc}")
        except Exception as exc:  # any failure is a row; OOM is told apart from the rest
            status, detail = failure_status(exc)
            seen.failure = (status, f"{seen.phase}: {detail}")
        finally:
            release_memory(device)  # the failed step's tensors died with the exception
    _fill(record, seen)
    record.notes = "; ".join(seen.notes + _notes(config, record, device)) or None
    return record
