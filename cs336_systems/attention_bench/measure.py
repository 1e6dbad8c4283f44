"""Measure one attention configuration: inputs, the timed forward and backward, memory and what
autograd saves. Out of memory (or any failure) is a row, never a raise."""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Sequence

import torch

from cs336_systems.attention_bench.config import IMPLEMENTATIONS, PASSES, TENSOR_DTYPES, AttentionConfig
from cs336_systems.attention_bench.record import AttentionRecord, new_record
from cs336_systems.device import compile_unsupported_reason, failure_status, release_memory, resolve_device
from cs336_systems.memory import PhaseMemory, current_memory_bytes, rss_high_water_mark_available
from cs336_systems.models import naive_causal_attention, sdpa_causal_attention
from cs336_systems.precision import cpu_has_native, precision_mode, unsupported_reason
from cs336_systems.results import Environment, collect_environment, fill_timing
from cs336_systems.stats import is_noisy, summarize
from cs336_systems.timing import HostTimer, UntimedSetup, device_synchronizer, make_timer, time_steps


def sdpa_backend_name(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """Which kernel F.scaled_dot_product_attention dispatches to for these inputs (private torch API)."""
    try:
        from torch.nn.attention import SDPBackend

        return SDPBackend(torch._fused_sdp_choice(q, k, v, is_causal=True)).name.lower()
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
    shape = (config.batch_size, 1, config.seq_len, config.head_dim)
    dtype = TENSOR_DTYPES[config.precision]
    q, k, v, grad_out = (torch.randn(shape, generator=generator, device=device, dtype=dtype) for _ in range(4))
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), grad_out


def attention_function(implementation: str) -> Callable[..., torch.Tensor]:
    if implementation == "naive":
        return naive_causal_attention
    if implementation == "sdpa":
        return sdpa_causal_attention
    if implementation == "compiled":
        torch._dynamo.reset()  # a fresh compile per configuration, so compile_s is comparable
        return torch.compile(naive_causal_attention)
    raise ValueError(f"unknown implementation {implementation!r}; choose one of {IMPLEMENTATIONS}")


class _Phase:
    """The part of a configuration running now, named in an error row."""

    name = "setup"


def _measure(
    config: AttentionConfig,
    device: torch.device,
    record: AttentionRecord,
    phase: _Phase,
    clock: Callable[[], float],
) -> None:
    sync = device_synchronizer(device)
    phase.name = "compile" if config.implementation == "compiled" else "setup"
    attend = attention_function(config.implementation)
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
        record.sdpa_backend = sdpa_backend_name(q, k, v)

    # One untimed forward and backward: memory before backward and the peak of each pass.
    phase.name = "forward"
    memory = PhaseMemory(device) if record.memory_source else None
    with memory.phase("forward") if memory else contextlib.nullcontext():
        out = attend(*inputs)
        sync()
    if memory:
        record.memory_before_backward_bytes = current_memory_bytes(device) - baseline
    phase.name = "backward"
    with memory.phase("backward") if memory else contextlib.nullcontext():
        out.backward(grad_out)
        sync()
    del out
    if memory:
        record.forward_peak_bytes = memory.steps[-1]["forward"][0] - baseline
        record.backward_peak_bytes = memory.steps[-1]["backward"][0] - baseline

    timer = make_timer(config.timer, device, clock)
    budget = dict(warmup_steps=config.warmup_steps, measure_steps=config.steps, budget_s=config.max_seconds or None)
    phase.name = "forward"
    held = {}  # each output is freed before the next step starts, outside the clock
    forward = time_steps(
        lambda: held.__setitem__("out", attend(*inputs)), timer=UntimedSetup(timer, held.clear), **budget
    )
    held.clear()
    record.forward_ms, record.forward_warmup_ms = list(forward.measured_ms), list(forward.warmup_ms)
    _add_summary(record, "forward", forward.measured_ms)

    phase.name = "backward"
    state = {}

    def fresh_forward() -> None:
        for tensor in inputs:
            tensor.grad = None
        state["out"] = attend(*inputs)

    backward = time_steps(
        lambda: state.pop("out").backward(grad_out), timer=UntimedSetup(timer, fresh_forward), **budget
    )
    record.backward_ms, record.backward_warmup_ms = list(backward.measured_ms), list(backward.warmup_ms)
    _add_summary(record, "backward", backward.measured_ms)

    phase.name = "saved-tensors count"
    record.saved_for_backward_bytes = saved_tensor_bytes(attend, *inputs)


def _add_summary(record: AttentionRecord, prefix: str, samples: Sequence[float]) -> None:
    summary = summarize(samples)
    setattr(record, f"{prefix}_steps", summary.n)
    fill_timing(record, summary, prefix=f"{prefix}_")
    flops = record.forward_flops if prefix == "forward" else record.backward_flops
    setattr(record, f"{prefix}_tflops", flops / (summary.mean / 1e3) / 1e12)


def _notes(config: AttentionConfig, record: AttentionRecord, device: torch.device) -> list[str]:
    notes = []
    for name in PASSES:
        measured = getattr(record, f"{name}_steps")
        if measured is not None and measured < config.steps:
            notes.append(f"{name}: {measured} of {config.steps} steps (the {config.max_seconds:g} s budget ran out)")
        cv = getattr(record, f"{name}_cv_pct")
        if is_noisy(None if cv is None or math.isnan(cv) else cv):
            notes.append(f"{name} CV {cv:.1f}% > 10%: treat its mean with care")
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


def run_attention(
    config: AttentionConfig,
    *,
    environment: Environment | None = None,
    clock: Callable[[], float] = time.perf_counter,
    memory_limit_bytes: int | None = None,
) -> AttentionRecord:
    """Measure one configuration. Out of memory (or any failure) is a row, never a raise."""
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
    with precision_mode(config.precision, device) as state:
        record.matmul_precision, record.cuda_matmul_allow_tf32 = state.matmul_precision, state.cuda_matmul_allow_tf32
        try:
            _measure(config, device, record, phase, clock)
        except Exception as exc:  # any failure is a row; OOM is told apart from the rest
            record.status, detail = failure_status(exc)
            record.error = f"{phase.name}: {detail}"
        finally:
            release_memory(device)  # the failed step's tensors died with the exception
    record.notes = "; ".join(_notes(config, record, device)) or None
    return record
