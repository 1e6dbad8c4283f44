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
quiet moment, and kept with its date and the load average it was measured at (`PeakCache`),
so MFU stays comparable between runs; `--peak-tflops` gives one's own. The row's `peak_source`
says which: table, calibrated (this machine's kept measurement), measured (this run's only),
user or unknown.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from .models import ModelConfig, build_model
from .precision import PRECISION_TABLE, precision_mode
from .stats import per_second
from .timing import device_synchronizer
from .usercode import UserCodeTimeout

PASS_FLOP_MULTIPLIER = {"forward": 1, "forward-backward": 3, "train-step": 3}
# auto: the table for a known GPU, else this machine's calibrated peak (calibrated now if it has none);
# calibrate: measure now and keep it as this machine's; measure: measure now, for this run only;
# table: the spec sheet or nothing
PEAK_CHOICES = ("auto", "table", "calibrate", "measure")
PEAK_CACHE_ENV = "CS336_BENCH_CACHE"  # the directory of the calibrated peaks; default ~/.cache/cs336-bench
# A calibration is kept only when the 1-minute load average is at most this per core (or at least
# QUIET_LOAD_FLOOR): a matmul probe sharing the cores with another job reads low, and MFU high.
QUIET_LOAD_PER_CORE = 0.25
QUIET_LOAD_FLOOR = 0.5

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


@dataclass(frozen=True)
class Peak:
    tflops: float | None
    source: str  # "table", "calibrated", "measured", "user" or "unknown"
    measured_at: str | None = None  # calibrated or measured: when (UTC, ISO 8601)
    notes: tuple[str, ...] = ()  # for the row: a calibration not kept, or kept at a busy moment


def load_average() -> float:
    """The 1-minute load average (0 where the system has none)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


def quiet_load(cores: int | None = None) -> float:
    """The highest 1-minute load average at which a calibration is kept."""
    return max(QUIET_LOAD_FLOOR, QUIET_LOAD_PER_CORE * (cores or os.cpu_count() or 1))


@dataclass
class PeakCache:
    """This machine's calibrated peaks, one JSON file: a key per (host, device, precision, threads,
    torch version), each holding the TFLOP/s, when it was measured and the load average then."""

    path: Path = field(
        default_factory=lambda: (
            Path(os.environ.get(PEAK_CACHE_ENV) or Path.home() / ".cache" / "cs336-bench") / "peak_tflops.json"
        )
    )

    @staticmethod
    def key(device: torch.device, device_name: str, precision: str) -> str:
        threads = f" threads={torch.get_num_threads()}" if device.type == "cpu" else ""
        return f"{socket.gethostname()} {device_name} {precision}{threads} torch={torch.__version__}"

    def entries(self) -> dict[str, dict]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):  # none yet, or unreadable: calibrate again
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, key: str) -> dict | None:
        entry = self.entries().get(key)
        return entry if isinstance(entry, dict) and isinstance(entry.get("tflops"), (int, float)) else None

    def put(self, key: str, entry: dict) -> None:
        from .results.files import write_whole  # the one writer of whole files (results imports no flops)

        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_whole(self.path, json.dumps({**self.entries(), key: entry}, indent=1, sort_keys=True) + "\n")


def resolve_peak(
    device: torch.device,
    device_name: str,
    precision: str,
    peak: str = "auto",
    peak_tflops: float | None = None,
    cache: PeakCache | None = None,
) -> Peak:
    """The MFU denominator (PEAK_CHOICES): `peak_tflops` (user) wins; a known GPU's is the table's;
    otherwise this machine's calibrated peak, measured and kept the first time (at a quiet moment)."""
    if peak_tflops is not None:
        return Peak(peak_tflops, "user")
    if peak in ("auto", "table") and device.type == "cuda":
        value = table_peak_tflops(device_name, precision)
        if value is not None:
            return Peak(value, "table")
    if peak == "table":
        return Peak(None, "unknown")
    now = lambda: datetime.now(timezone.utc).isoformat(timespec="seconds")  # noqa: E731
    if peak == "measure":
        return Peak(measure_peak_tflops(device, precision), "measured", now())
    cache = cache or PeakCache()
    key = cache.key(device, device_name, precision)
    kept = cache.get(key)
    if kept is not None and peak == "auto":
        return Peak(float(kept["tflops"]), "calibrated", kept.get("measured_at"))
    load, cores = load_average(), os.cpu_count() or 1
    value, measured_at = measure_peak_tflops(device, precision), now()
    busy = load > quiet_load(cores)
    if busy and peak == "auto":
        note = (
            f"MFU peak measured for this run only, at load average {load:.1f} on {cores} cores (a busy machine "
            "reads a low peak); `--peak calibrate` at a quiet moment keeps one for this machine"
        )
        return Peak(value, "measured", measured_at, (note,))
    entry = {"tflops": value, "measured_at": measured_at, "load_average": round(load, 2), "cores": cores}
    cache.put(key, entry)
    notes = (f"MFU peak calibrated at load average {load:.1f} on {cores} cores: it may read low",) if busy else ()
    return Peak(value, "calibrated", measured_at, notes)


def mfu(flops: int | None, median_ms: float | None, peak: Peak) -> tuple[float | None, float | None]:
    """(achieved TFLOP/s, model FLOPs utilisation) of a median step of `median_ms`."""
    achieved = per_second(flops or None, median_ms)
    if achieved is None:
        return None, None
    achieved /= 1e12
    return achieved, (achieved / peak.tflops if peak.tflops else None)
