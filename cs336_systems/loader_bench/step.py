"""The training step the loader feeds: a calibrated sleep or a tiny Transformer LM, and its phase timer."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..models import ModelConfig, TransformerLM
from ..optimizer import make_optimizer
from .config import BenchConfig

TINY_MODEL_MAX_CONTEXT = 128


def tiny_model_config(item_bytes: int) -> ModelConfig:
    """A 2-layer byte-level LM: items' first bytes are its tokens (vocabulary 256)."""
    context = min(TINY_MODEL_MAX_CONTEXT, item_bytes - 1)
    return ModelConfig(d_model=128, d_ff=512, num_layers=2, num_heads=4, vocab_size=256, context_length=context)


def cuda_sleep_cycles_per_ms(device: torch.device) -> float:
    """GPU clock cycles per millisecond of torch.cuda._sleep, measured with CUDA events."""
    with torch.cuda.device(device):
        torch.cuda._sleep(1000)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 20_000_000
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        return cycles / start.elapsed_time(end)


def compute_description(bench: BenchConfig, device: torch.device) -> str:
    if bench.compute == "tiny-model":
        c = tiny_model_config(bench.item_bytes)
        return f"tiny-model train step (d_model {c.d_model}, {c.num_layers} layers, context {c.context_length})"
    if device.type == "cuda" and hasattr(torch.cuda, "_sleep"):
        return f"GPU spin kernel {bench.compute_ms:g} ms (stand-in)"
    return f"host sleep {bench.compute_ms:g} ms (stand-in: CPU idle, like waiting on a GPU)"


def make_compute(bench: BenchConfig, device: torch.device) -> Callable[[object], None]:
    """The training step fed by the loader (see compute_description)."""
    if bench.compute == "tiny-model":
        config = tiny_model_config(bench.item_bytes)
        torch.manual_seed(bench.seed)
        model = TransformerLM(config).to(device)
        optimizer = make_optimizer(model, device)

        def train_step(batch: torch.Tensor) -> None:
            tokens = batch[:, : config.context_length + 1].long()
            optimizer.zero_grad(set_to_none=True)
            logits = model(tokens[:, :-1])
            F.cross_entropy(logits.reshape(-1, config.vocab_size), tokens[:, 1:].reshape(-1)).backward()
            optimizer.step()

        dummy = torch.randint(0, 256, (bench.batch_size, config.context_length + 1), device=device, dtype=torch.uint8)
        train_step(dummy)  # untimed: creates the optimizer state
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return train_step
    seconds = bench.compute_ms / 1e3
    if device.type == "cuda" and hasattr(torch.cuda, "_sleep"):
        # a kernel that spins for a fixed number of GPU cycles: the GPU is busy, the host is free
        cycles = int(bench.compute_ms * cuda_sleep_cycles_per_ms(device))
        return lambda batch: torch.cuda._sleep(cycles)
    return lambda batch: time.sleep(seconds)


class PhaseTimer:
    """Durations of the copy and compute phases of every step.

    CPU: host clock around each phase. CUDA: an event pair per phase, read only after
    `collect()` synchronizes at the end of the epoch, so timing does not stall the loop.
    """

    def __init__(self, device: torch.device, clock: Callable[[], float] = time.perf_counter):
        self.device, self.clock = device, clock
        self._pending: dict[str, list] = {"h2d": [], "compute": []}

    def time(self, phase: str, fn: Callable[[], object]):
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            result = fn()
            end.record()
            self._pending[phase].append((start, end))
            return result
        start = self.clock()
        result = fn()
        self._pending[phase].append(self.clock() - start)
        return result

    def collect(self) -> dict[str, list[float]]:
        """Milliseconds per phase since the last collect."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            out = {phase: [s.elapsed_time(e) for s, e in pairs] for phase, pairs in self._pending.items()}
        else:
            out = {phase: [1e3 * seconds for seconds in values] for phase, values in self._pending.items()}
        self._pending = {phase: [] for phase in self._pending}
        return out
