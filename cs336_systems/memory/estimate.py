"""The memory of one step of the built-in model, predicted before it runs.

The estimate follows the built-in model op by op: what autograd saves for backward in
each block component (read off with saved-tensor hooks and pinned by tests), the
autocast weight copies, the logits and loss, then a timeline of one step (forward
saves, backward frees activations as gradients appear, the optimizer step) whose
maximum is the predicted peak of the allocator. N = batch * context tokens. With
activation checkpointing the forward keeps only each group's input, and backward
rebuilds one group's residuals at a time (models.TransformerLM.forward).

The fast path: with K micro-batches per step (grad_accum_steps) the gradients are already
held through the second micro-batch's forward and backward (each new gradient is a
transient added into them). With bf16 parameters (param_dtype) weights, gradients and the
residual stream are bf16, autocast makes no weight copies, and the optimizer holds fp32
master weights beside its fp32 moments (plus fp32 gradient copies during its step). Fused
projections keep the whole QKV output alive while attention saves v, a view of it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..models import ModelConfig, formula_num_params
from ..precision import PRECISION_TABLE
from ..search import search_boundary

if TYPE_CHECKING:
    from ..config import BenchmarkConfig

FP32 = 4
HALF = 2  # bytes of an autocast dtype (bf16, fp16: precision.PRECISION_TABLE)
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


def _block(m: ModelConfig, batch: int, seq: int, precision: str, device_type: str, param_dtype: str = "fp32") -> _Layer:
    N, d, f, H = batch * seq, m.d_model, m.d_ff, m.num_heads
    autocast = PRECISION_TABLE[precision].autocast_dtype is not None
    act = HALF if autocast else FP32  # dtype of matmul outputs
    param = HALF if param_dtype == "bf16" else FP32  # bytes of a parameter, its gradient and the residual stream
    scores = batch * H * seq * seq
    casts = (2 if m.fused_projections else 3 + 2) if autocast and param == FP32 else 0
    saved = {
        # input (the residual stream's dtype), normed (fp32) and 1/rms, for both norms
        "rmsnorm": 2 * (N * d * (param + FP32) + N * FP32),
        # one norm output shared by q/k/v and one by w1/w3; autocast casts fp32 ones per projection
        "projection inputs": casts * N * d * HALF if casts else 2 * N * d * param,
    }
    if m.fused_projections:
        saved["fused QKV output (kept whole by v)"] = 2 * N * d * act
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
        weight_copies=matmul_params * HALF if autocast and param == FP32 else 0,
        forward_transient=2 * N * d * act + (scores * FP32 if m.attention == "naive" else 0),
        backward_transient=max(3 * N * f * act, attention_transient) + 2 * N * d * param + d * f * (param + act),
        gradients=(matmul_params + 2 * d) * param,
    )


def block_saved_bytes(m: ModelConfig, batch: int, seq: int, precision: str, device_type: str) -> dict[str, int]:
    """What one block saves for backward, per component (python -m cs336_systems.residuals shows the tensors)."""
    layer = _block(m, batch, seq, precision, device_type)
    return {**layer.saved, **({"autocast weight copies": layer.weight_copies} if layer.weight_copies else {})}


def _checkpoint_groups(m: ModelConfig) -> list[int]:
    """Blocks per checkpointed group, first to last ([] when off): K, K, ..., the rest."""
    size = m.checkpoint_group_size
    if not size:
        return []
    return [min(size, m.num_layers - start) for start in range(0, m.num_layers, size)]


def estimate_memory(
    m: ModelConfig,
    batch_size: int,
    context_length: int,
    pass_type: str,
    precision: str = "fp32",
    device_type: str = "cuda",
    device_memory_bytes: int | None = None,
    first_step: bool = False,
    grad_accum_steps: int = 1,
    param_dtype: str = "fp32",
) -> MemoryEstimate:
    """Predict the peak of one step (steady state unless `first_step`) of the built-in model;
    `batch_size` is one micro-batch's when `grad_accum_steps` > 1."""
    N, d, V = batch_size * context_length, m.d_model, m.vocab_size
    autocast = PRECISION_TABLE[precision].autocast_dtype is not None
    act = HALF if autocast else FP32
    param = HALF if param_dtype == "bf16" else FP32
    params = formula_num_params(m)
    weights = params * param
    gradients = params * param if pass_type != "forward" else 0
    masters = params * FP32 if param != FP32 else 0  # fp32 master weights (optimizer.MasterWeights)
    optimizer = OPTIMIZER_STATES * params * FP32 + masters if pass_type == "train-step" else 0
    layer = _block(m, batch_size, context_length, precision, device_type, param_dtype)

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

    head_copy = d * V * HALF if autocast and param == FP32 else 0
    final_saved = N * d * (param + FP32) + N * FP32 + N * d * act  # final norm, lm_head input
    logits = N * V * act  # held by the step until backward ends
    log_probs = N * V * FP32  # saved by cross-entropy's log-softmax, fp32 under autocast too
    saved = sum(layer.saved.values())
    groups = _checkpoint_groups(m)
    for micro_batch in range(min(grad_accum_steps, 2)):  # the second and later ones start with gradients held
        held = micro_batch > 0
        _forward_backward(
            timeline,
            base + (gradients if held else 0),
            held,
            m,
            N,
            layer,
            groups,
            saved,
            head_copy,
            final_saved,
            logits,
            log_probs,
            autocast,
            param,
        )
    if pass_type == "train-step":
        # the optimizer step; bf16 parameters: their gradients cast to fp32 copies for it
        timeline.append(("optimizer step", weights + gradients + optimizer + masters))

    if groups:
        # kept through forward: the group inputs; one group's residuals are rebuilt at a time
        activations = {"checkpointed group inputs": len(groups) * N * d * param}
        activations.update({f"{name} (one group, rebuilt)": value * max(groups) for name, value in layer.saved.items()})
    else:
        activations = {name: value * m.num_layers for name, value in layer.saved.items()}
    activations["final norm and LM-head input"] = final_saved
    weight_copies = layer.weight_copies * m.num_layers + head_copy
    return _estimate(
        weights,
        gradients,
        optimizer,
        activations,
        weight_copies,
        logits + log_probs,
        timeline,
        device_type,
        device_memory_bytes,
    )


def _forward_backward(
    timeline, mem, held, m, N, layer, groups, saved, head_copy, final_saved, logits, log_probs, autocast, param
) -> int:
    """One micro-batch's forward and backward onto `timeline`, from `mem` in use; `held`: the
    gradients exist already (each new one is a transient added into them). Returns mem after."""
    d, V = m.d_model, m.vocab_size
    act = HALF if autocast else FP32
    keep = 0 if held else 1  # new gradients stay (first micro-batch) or are added and freed
    if groups:
        # Checkpointed: each group keeps only its input (the residual stream); autocast's
        # weight-cast cache still holds every block's copies until autocast exits.
        for size in groups:
            timeline.append(("forward", mem + size * layer.weight_copies + layer.forward_transient))
            mem += N * d * param + size * layer.weight_copies
        cache = layer.weight_copies * m.num_layers
    else:
        for _ in range(m.num_layers):
            timeline.append(("forward", mem + saved + layer.weight_copies + layer.forward_transient))
            mem += saved + layer.weight_copies
        cache = 0
    mem += final_saved + head_copy + logits + log_probs
    timeline.append(("end of forward", mem + (N * V * FP32 if autocast else 0)))
    mem -= cache  # checkpointed: the weight casts were cached, not saved; freed as autocast exits
    # loss backward: gradients of the log-probabilities and of the logits, the head's gradient
    loss_grads = 2 * N * V * FP32 + (N * V * HALF if autocast else 0)
    timeline.append(("backward (loss and LM head)", mem + loss_grads + d * V * (param + act)))
    mem += keep * d * V * param - final_saved - head_copy - log_probs
    for size in reversed(groups or [1] * m.num_layers):
        if groups:
            # the group's forward runs again, saving its blocks' residuals (and weight casts)
            timeline.append(
                ("backward (recompute)", mem + size * (saved + layer.weight_copies) + layer.forward_transient)
            )
            mem += size * (saved + layer.weight_copies)
        for _ in range(size):
            timeline.append(("backward (blocks)", mem + layer.backward_transient + layer.gradients))
            mem += keep * layer.gradients - saved - layer.weight_copies
        if groups:
            mem -= N * d * param  # the group's input, kept by the checkpoint, goes with its graph
    embedding_grad = V * d * param
    timeline.append(("backward (embedding)", mem + embedding_grad + N * d * param))
    return mem + keep * (embedding_grad + d * param) - logits


# estimate_memory's arguments that a BenchmarkConfig holds under the same names
CONFIG_ARGUMENTS = ("batch_size", "context_length", "pass_type", "precision", "grad_accum_steps", "param_dtype")


def estimate_config(config: BenchmarkConfig, device_type: str) -> MemoryEstimate:
    """estimate_memory of one benchmark configuration's step (its micro-batches and parameter dtype too)."""
    step = {name: getattr(config, name) for name in CONFIG_ARGUMENTS}
    return estimate_memory(config.model, device_type=device_type, **step)


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


FIND_MAX_LIMIT = 1 << 20  # the prediction search stops here


def find_max_by_prediction(
    estimate_for, dimension: str, start: int, device_memory_bytes: int, limit: int = FIND_MAX_LIMIT
) -> int | None:
    """Largest value of `dimension` (up to `limit`) whose predicted total fits."""

    def status(value: int) -> str:
        return "ok" if estimate_for(value).total_bytes <= device_memory_bytes else "oom"

    return search_boundary(status, start, limit, resolution=1, dimension=dimension).largest_ok
