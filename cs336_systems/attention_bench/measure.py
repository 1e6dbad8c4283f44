"""Measure one attention configuration: inputs, the timed forward and backward, memory and what
autograd saves. Out of memory (or any failure) is a row, never a raise."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Sequence

import torch
import torch._functorch.config  # donated_buffer, patched around each row (run_attention)

from ..adapters import Adapters, NotImplementedAdapter
from ..contention import machine_load, with_load
from ..device import compile_unsupported_reason, failure_status, release_memory, resolve_device
from ..memory import PhaseMemory, current_memory_bytes, rss_high_water_mark_available
from ..precision import cpu_has_native, precision_mode, unsupported_reason
from ..results import Environment, collect_environment, fill_timing
from ..stats import NOISE, per_second, summarize
from ..timing import HostTimer, UntimedSetup, device_synchronizer, make_timer, time_steps
from ..usercode import DEFAULT_TIMEOUT, StepLimits, guarded
from .config import FLASH_IMPLEMENTATIONS, PASSES, TENSOR_DTYPES, AttentionConfig
from .correctness import check, reference
from .dobench import TRITON, do_bench_backend, do_bench_samples
from .implementations import attention_for
from .record import AttentionRecord, new_record


def sdpa_backend_name(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = True) -> str | None:
    """Which kernel F.scaled_dot_product_attention dispatches to for these inputs (private torch API)."""
    try:
        from torch.nn.attention import SDPBackend

        return SDPBackend(torch._fused_sdp_choice(q, k, v, is_causal=is_causal)).name.lower()
    except Exception:  # private API: absent or changed in other torch versions
        return None


def saved_tensor_bytes(function: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> int:
    """Bytes of the distinct storages autograd saves for backward in one call of `function`."""
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = function(*inputs)
    del out
    return sum(storages.values())


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


class _Phase:
    """The part of a configuration running now, named in an error row, and notes on the way."""

    def __init__(self) -> None:
        self.name = "setup"
        self.notes: list[str] = []


def _measure(
    config: AttentionConfig,
    device: torch.device,
    record: AttentionRecord,
    phase: _Phase,
    clock: Callable[[], float],
    adapters: Adapters | None,
    rearm: Callable[[], None] = lambda: None,
) -> None:
    sync = device_synchronizer(device)
    phase.name = "compile" if config.implementation == "compiled" else "setup"
    # the adapter is asked first: not implemented beats not here
    user_attend = [attention_for(config, adapters)]  # the PyTorch flash may be timed non-causal (_judge_causal)

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        rearm()  # every step calls it once: each gets the whole --timeout (one setitimer call)
        return user_attend[0](q, k, v)

    if config.implementation == "flash-triton" and device.type != "cuda":
        raise NotHere("flash-triton: Triton kernels need a CUDA device")
    if config.implementation == "compiled":
        # Compile on inputs of the same shape that are freed before memory is counted.
        q, k, v, grad_out = make_inputs(config, device)
        held = {}
        host = HostTimer(clock, sync)
        compile_ms = host.time_ms(lambda: held.setdefault("out", attend(q, k, v)))
        compile_ms += host.time_ms(lambda: held.pop("out").backward(grad_out))
        record.compile_s = compile_ms / 1e3
        del q, k, v, grad_out, held

    phase.name = "setup"
    release_memory(device)
    baseline = current_memory_bytes(device) if record.memory_source else 0
    q, k, v, grad_out = make_inputs(config, device)
    inputs = (q, k, v)
    if config.implementation == "sdpa":
        record.sdpa_backend = sdpa_backend_name(q, k, v, config.causal)

    # One untimed forward and backward: memory before backward, the peak of each pass, and the
    # output and gradients the check compares with the reference.
    phase.name = "forward"
    memory = PhaseMemory(device) if record.memory_source else None
    with memory.phase("forward") if memory else contextlib.nullcontext():
        out = attend(*inputs)
        sync()
    _check_output(out, q)
    if memory:
        record.memory_before_backward_bytes = current_memory_bytes(device) - baseline
    phase.name = "backward"
    with memory.phase("backward") if memory else contextlib.nullcontext():
        out.backward(grad_out)
        sync()
    out = out.detach()
    if memory:
        record.forward_peak_bytes = memory.steps[-1]["forward"][0] - baseline
        record.backward_peak_bytes = memory.steps[-1]["backward"][0] - baseline

    phase.name = "check"
    rearm()  # our own reference is not the user's step; it gets the limit afresh (its first run imports)
    try:
        expected_out, expected_grads = reference(q, k, v, grad_out, config.causal)
        result = check(out, (q.grad, k.grad, v.grad), expected_out, expected_grads, config.precision)
        del expected_out, expected_grads
    except torch.OutOfMemoryError:
        phase.notes.append("not checked: the fp32 reference ran out of memory")
    else:
        record.max_abs_err_out, record.max_abs_err_grad = result.max_abs_err_out, result.max_abs_err_grad
        record.check_tolerance = result.tolerance
        if result.wrong and config.causal and config.implementation in FLASH_IMPLEMENTATIONS:
            noncausal = attention_for(dataclasses.replace(config, causal=False), adapters)

            def run_noncausal() -> tuple[torch.Tensor, tuple]:
                fresh = [t.detach().clone().requires_grad_() for t in (q, k, v)]
                plain_out = noncausal(*fresh)
                plain_out.backward(grad_out)
                return plain_out.detach(), tuple(t.grad for t in fresh)

            if _judge_causal(config, record, phase, (q, k, v, grad_out), out, result, run_noncausal):
                user_attend[0] = noncausal
        elif result.wrong:
            record.status, record.error = "wrong", result.message()
    del out
    release_memory(device)
    rearm()

    def clear_grads() -> None:
        for tensor in inputs:
            tensor.grad = None

    clear_grads()
    if config.timer == "do-bench":
        record.timer_used, do_bench, why = do_bench_backend(device)
        if why:
            phase.notes.append(why)
    else:
        record.timer_used, do_bench = config.timer, None
    if do_bench is not None:
        phase.name = "forward"
        forward = do_bench_samples(do_bench, lambda: attend(*inputs), inputs)
        _keep(record, "forward", forward, [])
        phase.name = "backward"
        out = attend(*inputs)
        backward = do_bench_samples(do_bench, lambda: out.backward(grad_out, retain_graph=True), inputs)
        del out
        _keep(record, "backward", backward, [])
        phase.name = "end_to_end"
        end_to_end = do_bench_samples(do_bench, lambda: attend(*inputs).backward(grad_out), inputs)
        _keep(record, "end_to_end", end_to_end, [])
    else:
        timer = make_timer(record.timer_used, device, clock)
        budget = dict(
            warmup_steps=config.warmup_steps, measure_steps=config.measure_steps, budget_s=config.max_seconds or None
        )
        phase.name = "forward"
        held = {}  # each output is freed before the next step starts, outside the clock
        forward = time_steps(
            lambda: held.__setitem__("out", attend(*inputs)), timer=UntimedSetup(timer, held.clear), **budget
        )
        held.clear()
        _keep(record, "forward", forward.measured_ms, forward.warmup_ms)

        phase.name = "backward"
        state = {}

        def fresh_forward() -> None:
            clear_grads()
            state["out"] = attend(*inputs)

        backward = time_steps(
            lambda: state.pop("out").backward(grad_out), timer=UntimedSetup(timer, fresh_forward), **budget
        )
        _keep(record, "backward", backward.measured_ms, backward.warmup_ms)

        phase.name = "end_to_end"
        end_to_end = time_steps(
            lambda: attend(*inputs).backward(grad_out), timer=UntimedSetup(timer, clear_grads), **budget
        )
        _keep(record, "end_to_end", end_to_end.measured_ms, end_to_end.warmup_ms)

    phase.name = "saved-tensors count"
    clear_grads()
    record.saved_for_backward_bytes = saved_tensor_bytes(attend, *inputs)


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
    if device.type == "cpu" and hasattr(os, "getloadavg"):
        load, ours = os.getloadavg()[0], torch.get_num_threads()
        if load > ours + 1:
            notes.append(
                f"load average {load:.1f} with {ours} threads of ours: other processes competed for the CPU, "
                "so times may be inflated"
            )
    return notes


def is_causal_behaviour(out, grads, inputs, precision: str) -> str | None:
    """What an implementation called with is_causal=True did with it, forward and backward, in one line:
    each pass compared with causal and with non-causal attention ('applies it', 'ignores it', or 'matches
    neither'); None when neither pass matches either (it is simply wrong). A FlashAttention-2 that ignores
    it in its forward and applies it in its backward (real students' code) is told apart so."""
    q, k, v, grad_out = inputs
    verdicts, matched = [], False
    for name in ("forward", "backward"):
        said = "matches neither causal nor non-causal attention"
        for causal, words in ((True, "applies it"), (False, "ignores it")):
            expected_out, expected_grads = reference(q, k, v, grad_out, causal)
            failures = check(out, grads, expected_out, expected_grads, precision).failures
            if not [f for f in failures if f.startswith("out") == (name == "forward")]:
                said, matched = words, True
                break
        verdicts.append(f"its {name} {said}")
    return "with is_causal=True " + " and ".join(verdicts) if matched else None


def _judge_causal(config, record, phase, inputs, out, causal_result, run_noncausal) -> bool:
    """A flash adapter wrong against causal attention. The handout lets the PyTorch FlashAttention-2
    ignore is_causal (its official test is non-causal): that one is run again with is_causal=False and
    judged, as its test judges it, non-causal; True when it is then timed non-causal. The Triton one is
    tested both ways: wrong, saying what it does with is_causal."""
    q, k, v, grad_out = inputs
    behaviour = is_causal_behaviour(out, (q.grad, k.grad, v.grad), inputs, config.precision)
    if config.implementation != "flash-pytorch":
        record.status, record.error = "wrong", f"{behaviour + ': ' if behaviour else ''}{causal_result.message()}"
        return False
    plain_out, plain_grads = run_noncausal()
    expected_out, expected_grads = reference(q, k, v, grad_out, False)
    plain = check(plain_out, plain_grads, expected_out, expected_grads, config.precision)
    if plain.wrong:
        record.status, record.error = "wrong", f"{causal_result.message()}; with is_causal=False too"
        return False
    record.max_abs_err_out, record.max_abs_err_grad = plain.max_abs_err_out, plain.max_abs_err_grad
    phase.notes.append(
        f"{behaviour or 'with is_causal=True it differs from causal attention'}; checked and timed with "
        "is_causal=False, as its official test runs the PyTorch version (the handout lets it ignore is_causal)"
    )
    return True


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
    elif rss_high_water_mark_available():
        record.memory_source = "rss"
    reason = unsupported_reason(config.precision, device)
    if reason is None and config.implementation == "compiled":
        reason = compile_unsupported_reason(device)
    if reason is not None:
        record.status, record.error = "unsupported", reason
        return record

    phase = _Phase()
    # do_bench times backward again and again over one retained graph (retain_graph=True), which a
    # compiled backward that donates its buffers refuses (seen with torch 2.11 on CUDA)
    with precision_mode(config.precision, device) as state, torch._functorch.config.patch(donated_buffer=False):
        record.matmul_precision, record.cuda_matmul_allow_tf32 = state.matmul_precision, state.cuda_matmul_allow_tf32
        try:
            with guarded(config.implementation, timeout_s) as rearm, machine_load(device) as load:
                _measure(config, device, record, phase, clock, adapters, rearm)
            record.environment = with_load(record.environment, load.load)
        except NotImplementedAdapter as exc:
            record.status, record.error = "skipped", str(exc)
        except NotHere as exc:
            record.status, record.error = "unsupported", str(exc)
        except WrongOutput as exc:
            record.status, record.error = "wrong", f"{phase.name}: {exc}"
        except Exception as exc:  # any failure is a row; OOM is told apart from the rest
            record.status, detail = failure_status(exc)
            record.error = f"{phase.name}: {detail}"
        finally:
            release_memory(device)  # the failed step's tensors died with the exception
    record.notes = "; ".join(phase.notes + _notes(config, record, device)) or None
    return record
