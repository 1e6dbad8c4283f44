"""Memory: predicted before a run, measured per phase during it.

    python -m cs336_systems.memory --model-size xl --context-length 512 --batch-size 4 \\
        --precision fp32 --pass-type forward-backward --device-memory 16GiB

The estimate follows the built-in model op by op: what autograd saves for backward in
each block component (read off with saved-tensor hooks and pinned by tests), the
autocast weight copies, the logits and loss, then a timeline of one step (forward
saves, backward frees activations as gradients appear, the optimizer step) whose
maximum is the predicted peak of the allocator. N = batch * context tokens.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import dataclasses
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from cs336_systems.models import ModelConfig, formula_num_params

FP32 = 4
HALF = 2
OPTIMIZER_STATES = 2  # AdamW: exp_avg and exp_avg_sq, fp32
CUDA_CONTEXT_BYTES = 512 * 2**20  # CUDA context + cuBLAS workspaces, outside the allocator's counters
FRAGMENTATION = 0.05  # caching-allocator slack (reserved - allocated) allowed for in the verdict


@dataclass(frozen=True)
class MemoryEstimate:
    """A budget in bytes. `peak_bytes` is the predicted allocator high-water mark."""

    parameters: int
    gradients: int
    optimizer_state: int
    activations: dict[str, int]  # saved for backward, per block component, summed over layers
    autocast_weight_copies: int
    logits_and_loss: int
    peak_bytes: int
    peak_phase: str
    workspace_margin: int
    device_memory_bytes: int | None = None
    timeline: tuple[tuple[str, int], ...] = field(default=(), repr=False)

    @property
    def total_bytes(self) -> int:
        """What the device must hold: the peak plus the workspace margin."""
        return self.peak_bytes + self.workspace_margin

    @property
    def fits(self) -> bool | None:
        return None if self.device_memory_bytes is None else self.total_bytes <= self.device_memory_bytes

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out.pop("timeline")
        out.update(total_bytes=self.total_bytes, fits=self.fits, activations_total=sum(self.activations.values()))
        return out


@dataclass(frozen=True)
class _Layer:
    """Bytes one block saves for backward, and its transient peaks."""

    saved: dict[str, int]
    weight_copies: int
    forward_transient: int
    backward_transient: int
    gradients: int


def _block(m: ModelConfig, batch: int, seq: int, precision: str, device_type: str) -> _Layer:
    N, d, f, H = batch * seq, m.d_model, m.d_ff, m.num_heads
    autocast = precision in ("bf16", "fp16")
    act = HALF if autocast else FP32  # dtype of matmul outputs
    scores = batch * H * seq * seq
    saved = {
        # input, normed (fp32) and 1/rms, for both norms; the residual stream stays fp32
        "rmsnorm": 2 * (2 * N * d * FP32 + N * FP32),
        # fp32: one norm output shared by q/k/v and one by w1/w3; autocast casts it per projection
        "projection inputs": (3 + 2) * N * d * HALF if autocast else 2 * N * d * FP32,
    }
    if m.attention == "sdpa":
        # q and k after RoPE, v, output, and the log-sum-exp per row (fp32)
        saved["attention (sdpa)"] = 4 * N * d * act + batch * H * seq * FP32
        attention_transient = 3 * N * d * act  # dq, dk, dv
    else:
        # q, k, v, the T x T probabilities, the causal mask, and the output copy for output_proj.
        # CUDA autocast runs softmax in fp32 and keeps a half copy for the matmul; CPU autocast
        # runs softmax in half.
        probs = scores * FP32 if not autocast else scores * (FP32 + HALF if device_type == "cuda" else HALF)
        saved["attention (naive)"] = 4 * N * d * act + probs + seq * seq
        attention_transient = 2 * scores * (FP32 if not autocast or device_type == "cuda" else HALF)
    if autocast:
        saved["rope cos/sin copies"] = 4 * seq * m.head_dim * HALF
    # w1 x, silu(w1 x), w3 x, and their product (the input of w2)
    saved["swiglu"] = 4 * N * f * act
    matmul_params = 4 * d * d + 3 * d * f
    return _Layer(
        saved=saved,
        weight_copies=matmul_params * HALF if autocast else 0,
        forward_transient=2 * N * d * act + (scores * FP32 if m.attention == "naive" else 0),
        backward_transient=max(3 * N * f * act, attention_transient) + 2 * N * d * FP32 + d * f * (FP32 + act),
        gradients=(matmul_params + 2 * d) * FP32,
    )


def estimate_memory(
    m: ModelConfig,
    batch_size: int,
    context_length: int,
    pass_type: str,
    precision: str = "fp32",
    device_type: str = "cuda",
    device_memory_bytes: int | None = None,
    first_step: bool = False,
) -> MemoryEstimate:
    """Predict the peak of one step (steady state unless `first_step`) of the built-in model."""
    N, d, V = batch_size * context_length, m.d_model, m.vocab_size
    autocast = precision in ("bf16", "fp16")
    act = HALF if autocast else FP32
    params = formula_num_params(m)
    weights = params * FP32
    gradients = params * FP32 if pass_type != "forward" else 0
    optimizer = OPTIMIZER_STATES * params * FP32 if pass_type == "train-step" else 0
    layer = _block(m, batch_size, context_length, precision, device_type)

    base = weights + (optimizer if not first_step else 0)
    timeline = [("before the step", base)]
    if pass_type == "forward":
        # inference mode: nothing is saved; the largest layer transient, then the logits
        layer_peak = 4 * N * m.d_ff * act + 2 * N * d * FP32
        head = N * V * act + (N * V * FP32 if autocast else 0)
        peak = base + max(layer_peak, head + N * d * FP32)
        timeline.append(("forward", peak))
        activations = {}
        return _estimate(weights, 0, 0, activations, 0, head, timeline, device_type, device_memory_bytes)

    head_copy = d * V * HALF if autocast else 0
    final_saved = 2 * N * d * FP32 + N * FP32 + N * d * act  # final norm, lm_head input
    logits = N * V * act  # held by the step until backward ends
    log_probs = N * V * FP32  # saved by cross-entropy's log-softmax, fp32 under autocast too
    mem = base
    for _ in range(m.num_layers):
        timeline.append(("forward", mem + sum(layer.saved.values()) + layer.weight_copies + layer.forward_transient))
        mem += sum(layer.saved.values()) + layer.weight_copies
    mem += final_saved + head_copy + logits + log_probs
    timeline.append(("end of forward", mem + (N * V * FP32 if autocast else 0)))
    # loss backward: gradients of the log-probabilities and of the logits, the head's gradient
    loss_grads = 2 * N * V * FP32 + (N * V * HALF if autocast else 0)
    timeline.append(("backward (loss and LM head)", mem + loss_grads + d * V * (FP32 + act)))
    mem += d * V * FP32 - final_saved - head_copy - log_probs
    for _ in range(m.num_layers):
        timeline.append(("backward (blocks)", mem + layer.backward_transient + layer.gradients))
        mem += layer.gradients - sum(layer.saved.values()) - layer.weight_copies
    embedding_grad = V * d * FP32
    timeline.append(("backward (embedding)", mem + embedding_grad + N * d * FP32))
    mem += embedding_grad + d * FP32 - logits
    if pass_type == "train-step":
        timeline.append(("optimizer step", weights + gradients + optimizer))

    activations = {name: value * m.num_layers for name, value in layer.saved.items()}
    activations["final norm and LM-head input"] = final_saved
    weight_copies = layer.weight_copies * m.num_layers + head_copy
    return _estimate(
        weights, gradients, optimizer, activations, weight_copies, logits + log_probs, timeline, device_type,
        device_memory_bytes,
    )  # fmt: skip


def _estimate(weights, gradients, optimizer, activations, copies, head, timeline, device_type, device_memory):
    phase, peak = max(timeline, key=lambda point: point[1])
    margin = int(FRAGMENTATION * peak) + (CUDA_CONTEXT_BYTES if device_type == "cuda" else 0)
    return MemoryEstimate(
        parameters=weights,
        gradients=gradients,
        optimizer_state=optimizer,
        activations=activations,
        autocast_weight_copies=copies,
        logits_and_loss=head,
        peak_bytes=int(peak),
        peak_phase=phase,
        workspace_margin=margin,
        device_memory_bytes=device_memory,
        timeline=tuple(timeline),
    )


# -- measured --------------------------------------------------------------------------


def _rss_status(field_name: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field_name):
                return int(line.split()[1]) * 1024
    raise OSError(f"no {field_name} in /proc/self/status")


M_MMAP_THRESHOLD = -3  # glibc mallopt parameter


def pin_mmap_threshold(threshold_bytes: int = 128 * 1024) -> bool:
    """Make glibc serve every allocation >= `threshold_bytes` with mmap and return it on free.

    By default glibc raises its mmap threshold after the first large free (up to 32 MiB),
    so activation-sized tensors come from the heap and stay resident after they are freed:
    RSS then exceeds live tensor memory (by ~27% for a d_model-1024 step here). Pinning the
    threshold (same as MALLOC_MMAP_THRESHOLD_=131072) makes RSS track live memory, at the
    price of page faults (~9% slower CPU steps here). Returns False where not glibc.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, threshold_bytes))
    except (OSError, AttributeError):
        return False


def current_memory_bytes(device: torch.device) -> int:
    """Allocated bytes on a CUDA device, resident set size of this process on CPU."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    return _rss_status("VmRSS:")


def rss_high_water_mark_available() -> bool:
    try:
        _reset_rss_high_water_mark()
        _rss_status("VmHWM:")
    except OSError:
        return False
    return True


def _reset_rss_high_water_mark() -> None:
    # Linux: writing 5 to clear_refs resets VmHWM to the current RSS (O(1), ~5 us here).
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


class PhaseMemory:
    """Peak memory of each phase (forward, backward, optimizer) of every step.

    CUDA: the caching allocator's max allocated / reserved, reset at each phase start
    (host-side counters: no synchronisation, no effect on timing). CPU: the kernel's
    RSS high-water mark (VmHWM), reset through /proc/self/clear_refs at each phase start:
    exact, not sampled; it counts every page the process touched, allocator slack included.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.steps: list[dict[str, tuple[int, int | None]]] = []
        self.measured_peak: tuple[int, int | None] | None = None
        self.source = "cuda_allocator" if device.type == "cuda" else "rss_high_water_mark"

    def _reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            _reset_rss_high_water_mark()

    def _peak(self) -> tuple[int, int | None]:
        if self.device.type == "cuda":
            stats = torch.cuda.memory_stats(self.device)  # one call: it builds the whole dict
            return stats.get("allocated_bytes.all.peak", 0), stats.get("reserved_bytes.all.peak", 0)
        return _rss_status("VmHWM:"), None

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """The peak of one phase of a step; a 'forward' phase starts a new step."""
        if name == "forward" or not self.steps:
            self.steps.append({})
        self._reset()
        yield
        self.steps[-1][name] = self._peak()

    @contextlib.contextmanager
    def whole(self) -> Iterator[None]:
        """The peak over a span of steps (the measured ones), into `measured_peak`."""
        self._reset()
        yield
        self.measured_peak = self._peak()


def step_peak(step: dict[str, tuple[int, int | None]]) -> tuple[int, int | None]:
    allocated = max(value[0] for value in step.values())
    reserved = [value[1] for value in step.values() if value[1] is not None]
    return allocated, (max(reserved) if reserved else None)


# -- CLI -------------------------------------------------------------------------------


def format_estimate(estimate: MemoryEstimate, title: str) -> str:
    from tabulate import tabulate

    from cs336_systems.units import format_bytes

    rows = [
        ("parameters (fp32)", estimate.parameters),
        ("gradients (fp32)", estimate.gradients),
        ("optimizer state (AdamW, fp32)", estimate.optimizer_state),
        *((f"activations saved for backward: {name}", value) for name, value in estimate.activations.items()),
        ("autocast weight copies", estimate.autocast_weight_copies),
        ("logits and loss", estimate.logits_and_loss),
    ]
    body = [(name, format_bytes(value), value) for name, value in rows if value]
    body += [
        (f"peak of the step timeline (at: {estimate.peak_phase})", format_bytes(estimate.peak_bytes), estimate.peak_bytes),
        ("workspace margin (context, workspaces, fragmentation)", format_bytes(estimate.workspace_margin),
         estimate.workspace_margin),
        ("total", format_bytes(estimate.total_bytes), estimate.total_bytes),
    ]  # fmt: skip
    table = tabulate(body, headers=["component", "size", "bytes"], tablefmt="github", disable_numparse=True)
    lines = [f"# Memory estimate: {title}", "", table, ""]
    lines.append(
        "Components do not simply add up: gradients appear while backward frees activations, "
        "so the peak comes from the step timeline."
    )
    if estimate.fits is not None:
        verdict = "fits" if estimate.fits else "does NOT fit"
        lines.append(
            f"Verdict: {verdict} in {format_bytes(estimate.device_memory_bytes)} "
            f"(needs {format_bytes(estimate.total_bytes)})."
        )
    return "\n".join(lines)


def find_max_by_prediction(
    estimate_for, dimension: str, start: int, device_memory_bytes: int, limit: int = 1 << 20
) -> int | None:
    """Largest value of `dimension` whose predicted total fits (doubling, then bisection)."""

    def fits(value: int) -> bool:
        return estimate_for(value).total_bytes <= device_memory_bytes

    if not fits(1):
        return None
    low, high = 1, max(2, start)
    while high <= limit and fits(high):
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def main(argv: list[str] | None = None) -> int:
    from cs336_systems.cli import (
        ATTENTION_KINDS,
        PASS_TYPE_CHOICES,
        PRECISIONS,
        ArgumentParser,
        add_shape_arguments,
        fail,
        model_config_from_args,
        positive_int,
    )
    from cs336_systems.models import ConfigError
    from cs336_systems.units import format_bytes, parse_bytes

    prog = "python -m cs336_systems.memory"
    parser = ArgumentParser(prog=prog, description="Predict the memory of one step of the built-in model.")
    parser.add_argument("--model-size", default="small")
    parser.add_argument("--context-length", type=positive_int, default=512)
    parser.add_argument("--batch-size", type=positive_int, default=4)
    parser.add_argument("--pass-type", choices=PASS_TYPE_CHOICES, default="forward-backward")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32")
    parser.add_argument("--attention", choices=ATTENTION_KINDS, default="sdpa")
    parser.add_argument("--device-type", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--device-memory", help="e.g. 16GiB, 80GB: gives a fits / does not fit verdict")
    parser.add_argument("--first-step", action="store_true", help="the first train-step (no optimizer state yet)")
    parser.add_argument("--find-max", choices=("batch-size", "context-length"))
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    add_shape_arguments(parser)
    args = parser.parse_args(argv)
    try:
        device_memory = parse_bytes(args.device_memory) if args.device_memory else None
        if args.find_max and device_memory is None:
            raise ValueError("--find-max needs --device-memory")
        if args.model_factory:
            raise ValueError("the estimator models the built-in Transformer only; drop --model-factory")

        def estimate_for(batch: int, context: int) -> MemoryEstimate:
            model = model_config_from_args(args, args.model_size, context, args.attention)
            if context > model.context_length:
                raise ConfigError(f"--context-length {context} is longer than --max-context-length")
            return estimate_memory(
                model, batch, context, args.pass_type, args.precision, args.device_type, device_memory,
                first_step=args.first_step,
            )  # fmt: skip

        estimate = estimate_for(args.batch_size, args.context_length)
    except (ConfigError, ValueError) as exc:
        return fail(prog, str(exc))

    largest = None
    if args.find_max == "batch-size":
        largest = find_max_by_prediction(lambda b: estimate_for(b, args.context_length), "batch-size",
                                         args.batch_size, device_memory)  # fmt: skip
    elif args.find_max == "context-length":
        args.max_context_length = None
        largest = find_max_by_prediction(lambda t: estimate_for(args.batch_size, t), "context-length",
                                         args.context_length, device_memory)  # fmt: skip
    other = "naive" if args.attention == "sdpa" else "sdpa"
    args.attention, chosen = other, args.attention
    alternative = estimate_for(args.batch_size, args.context_length)
    args.attention = chosen
    title = (
        f"{args.model_size} context {args.context_length} batch {args.batch_size} {args.pass_type} "
        f"{args.precision} {args.attention} on {args.device_type}"
    )
    if args.json:
        out = {"config": title, **estimate.as_dict(), f"total_bytes_with_{other}_attention": alternative.total_bytes}
        if args.find_max:
            out["find_max"] = {"dimension": args.find_max, "largest_that_fits": largest}
        print(json.dumps(out))
    else:
        print(format_estimate(estimate, title))
        print(
            f"With --attention {other} instead: {format_bytes(alternative.total_bytes)} "
            f"(activations {format_bytes(sum(alternative.activations.values()))})."
        )
        if args.find_max:
            print(f"Largest {args.find_max} that fits by prediction: {largest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
