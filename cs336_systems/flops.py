"""FLOPs per step, peak FLOP/s per device and precision, and MFU.

Analytic matmul FLOPs of one forward pass of the built-in model, per token
(docs/reference.md section 2):
    dense      2 * (L * (4*d^2 + 3*d*d_ff) + d*V)      projections, SwiGLU, LM head
    attention  2 * 2 * L * T * d                       QK^T and the weighted sum
The attention term counts the full T x T square, as FlopCounterMode and the PaLM/nanoGPT
MFU convention do; a causal kernel skips about half of it (`causal_discount=True`
gives that count). Backward is 2x forward, so forward-backward and a training step are
3x forward (the optimizer's elementwise work is not counted). Activation checkpointing
runs every block's forward once more during backward: `flops_per_step` counts that
recomputation (the work the device does), while MFU stays on model FLOPs (3x forward),
so checkpointing shows as lower MFU, not as more useful work.

MFU = achieved FLOP/s / peak FLOP/s, with the peak chosen for the device *and* the
precision in effect (hard-coding one GPU's peak gives >100% "MFU" on another). A known GPU's
peak is its spec sheet's; a CPU's (or an unknown GPU's) is measured once per machine, at a
quiet moment (other processes kept almost no core busy while it ran), and kept with its date and
that load (peak_flops.py),
so MFU stays comparable between runs; `--peak-tflops` gives one's own.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from .factory import build_model
from .models import ModelConfig
from .precision import PRECISION_TABLE, precision_mode
from .stats import per_second
from .timing import device_synchronizer
from .usercode import UserCodeTimeout

PASS_FLOP_MULTIPLIER = {"forward": 1, "forward-backward": 3, "train-step": 3}
# Dense peak TFLOP/s from the vendors' spec sheets (no sparsity), docs/reference.md section 2.
# Matched against the lower-cased device name: first entry whose every word is present
# and none of whose excluded words is, so "H100 PCIe" is not read as the SXM part and a
# laptop RTX 4090 is not read as the desktop card.
PEAK_TFLOPS_TABLE: tuple[tuple[tuple[str, ...], tuple[str, ...], dict[str, float]], ...] = (
    (("h100", "pcie"), (), {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0}),
    (("h100",), ("nvl", "pcie"), {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4}),
    (("h200",), ("nvl",), {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4}),
    (("a100",), (), {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0}),
    (("a10g",), (), {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0}),
    (("l4",), ("l40",), {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0}),
    (("rtx 4090",), ("laptop", "mobile"), {"fp32": 82.6, "tf32": 82.6, "bf16": 165.0}),
)


def forward_flops_per_token(config: ModelConfig, seq_len: int, causal_discount: bool = False) -> int:
    d, d_ff, V, L = config.d_model, config.d_ff, config.vocab_size, config.num_layers
    dense = 2 * (L * (4 * d * d + 3 * d * d_ff) + d * V)
    attention = 2 * 2 * L * seq_len * d
    return dense + (attention // 2 if causal_discount else attention)


def recompute_flops_per_step(config: ModelConfig, batch_size: int, seq_len: int, pass_type: str) -> int:
    """The blocks' forward once more (not the LM head) when checkpointing and backward runs."""
    if pass_type == "forward" or not config.checkpoint_group_size:
        return 0
    d, d_ff, L = config.d_model, config.d_ff, config.num_layers
    per_token = 2 * L * (4 * d * d + 3 * d * d_ff) + 2 * 2 * L * seq_len * d
    return per_token * batch_size * seq_len


def analytic_flops_per_step(
    config: ModelConfig, batch_size: int, seq_len: int, pass_type: str, causal_discount: bool = False
) -> int:
    per_token = forward_flops_per_token(config, seq_len, causal_discount)
    return PASS_FLOP_MULTIPLIER[pass_type] * per_token * batch_size * seq_len


# FlopCounterMode has no formula for the CPU flash-attention kernels SDPA dispatches to on
# a real CPU; count them with torch's own SDPA formulas (shapes in, FLOPs out).
_aten = torch.ops.aten
CPU_SDPA_FLOP_FORMULAS = {
    _aten._scaled_dot_product_flash_attention_for_cpu: lambda q, k, v, *args, out_shape=None, **kwargs: sdpa_flop_count(
        q, k, v
    ),
    _aten._scaled_dot_product_flash_attention_for_cpu_backward: lambda grad_out, q, k, v, *args, out_shape=None, **kwargs: (
        sdpa_backward_flop_count(grad_out, q, k, v)
    ),
}


def counted_flops_per_step(
    build: Callable[[], torch.nn.Module],
    vocab_size: int,
    batch_size: int,
    seq_len: int,
    pass_type: str,
    device: torch.device | str = "meta",
) -> int:
    """Matmul FLOPs of one step counted by FlopCounterMode, for any model.

    On the meta device nothing is computed; on a real device one step runs.
    """
    model = build()
    tokens = torch.randint(0, vocab_size, (batch_size, seq_len), device=device)
    counter = FlopCounterMode(display=False, custom_mapping=CPU_SDPA_FLOP_FORMULAS)
    with counter:
        if pass_type == "forward":
            with torch.no_grad():
                model(tokens)
        else:
            logits = model(tokens)
            F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1)).backward()
    return int(counter.get_total_flops())


@dataclass(frozen=True)
class StepFlops:
    flops_per_step: int  # what the device computes, checkpointing's recomputation included
    source: str  # "analytic" (built-in model) or "counted" (FlopCounterMode)
    model_flops_per_step: int | None = None  # without recomputation: the MFU numerator

    @property
    def model_flops(self) -> int:
        return self.flops_per_step if self.model_flops_per_step is None else self.model_flops_per_step


def flops_per_step(
    config: ModelConfig,
    batch_size: int,
    seq_len: int,
    pass_type: str,
    model_factory: str | None = None,
    device: torch.device | str = "meta",
) -> StepFlops | None:
    """Analytic for the built-in model; counted for a user's model (meta device first)."""
    if model_factory is None:
        model = analytic_flops_per_step(config, batch_size, seq_len, pass_type)
        extra = recompute_flops_per_step(config, batch_size, seq_len, pass_type)
        return StepFlops(model + extra, "analytic", model)
    for where in ("meta", device):
        try:
            count = counted_flops_per_step(
                lambda where=where: build_model(config, where, model_factory),
                config.vocab_size,
                batch_size,
                seq_len,
                pass_type,
                where,
            )
        except UserCodeTimeout:  # usercode.guarded's: the model hangs, on any device
            raise
        except Exception:  # a user's model need not support the meta device
            continue
        return StepFlops(count, "counted")
    return None


def table_peak_tflops(device_name: str, precision: str) -> float | None:
    name = device_name.lower()
    for words, excluded, peaks in PEAK_TFLOPS_TABLE:
        if all(w in name for w in words) and not any(x in name for x in excluded):
            return peaks[PRECISION_TABLE[precision].peak_column]
    return None


@functools.cache
def measure_peak_tflops(device: torch.device, precision: str) -> float:
    """A short square-matmul probe in the precision's dtype: the best sustained rate.

    The size doubles until one product takes long enough to time well (so emulated bf16
    on a CPU stays quick), then the median of several products gives the rate.
    """
    dtype = PRECISION_TABLE[precision].compute_dtype
    sync = device_synchronizer(device)
    target_s, max_n = (0.002, 8192) if device.type == "cuda" else (0.05, 2048)
    generator = torch.Generator(device=device).manual_seed(0)
    with precision_mode(precision, device):
        n = 256
        while True:
            a = torch.randn(n, n, device=device, dtype=dtype, generator=generator)
            b = torch.randn(n, n, device=device, dtype=dtype, generator=generator)
            # untimed first: the very first product pays for the library's set-up (a cuBLAS handle
            # took longer than the 2 ms target on an H200 and left the probe at n = 256: 0.8 TFLOP/s)
            _time_matmul(a, b, sync, repeats=1)
            elapsed = _time_matmul(a, b, sync, repeats=1)
            if elapsed >= target_s or n >= max_n:
                break
            n *= 2
        _time_matmul(a, b, sync, repeats=2)  # warm caches and kernels at the final size
        times = sorted(_time_matmul(a, b, sync, repeats=1) for _ in range(7))
    return 2 * n**3 / times[len(times) // 2] / 1e12


def _time_matmul(a: torch.Tensor, b: torch.Tensor, sync: Callable[[], None], repeats: int) -> float:
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        torch.mm(a, b)
    sync()
    return (time.perf_counter() - start) / repeats


def mfu(flops: int | None, median_ms: float | None, peak_tflops: float | None) -> tuple[float | None, float | None]:
    """(achieved TFLOP/s, model FLOPs utilisation) of a median step of `median_ms` against `peak_tflops`
    (peak_flops.resolve_peak's)."""
    achieved = per_second(flops or None, median_ms)
    if achieved is None:
        return None, None
    achieved /= 1e12
    return achieved, (achieved / peak_tflops if peak_tflops else None)
