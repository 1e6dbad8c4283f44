"""--cuda-graphs: capture a whole step (forward, loss, backward, AdamW) once, then time its replays.

A replay launches the step's hundreds of kernels with one call, so a step the host could
not launch fast enough (small models, bf16 on an H100) runs at the GPU's pace. The recipe
is PyTorch's "whole network capture" (docs: CUDA semantics, CUDA Graphs):
  - inputs live in static buffers; a new batch is copied into them, never reallocated;
  - a few eager iterations run on a side stream first (lazy init, cuBLAS workspaces,
    AdamW's state), since none of that may happen during capture;
  - gradients are None when capture starts, so backward allocates them in the graph's
    private pool and each replay overwrites them (no accumulation across replays);
  - AdamW is built fused with capturable=True: its step count lives on the device, so the
    update needs no host read and can be replayed;
  - before capture the cache is emptied: during capture the caching allocator cannot free
    cached blocks to satisfy an allocation, so a large step that fits eagerly would run out
    of memory there.
A replay is one call, so a captured step has no per-phase times. A replay allocates nothing,
so the step's peak memory is the capture's (the graph's private pool holds the activations).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .optimizer import make_optimizer as make_train_optimizer

CAPTURE_WARMUP_ITERS = 3  # eager iterations on a side stream before capture (PyTorch's example uses 3)


def unsupported_reason(device: torch.device) -> str | None:
    """Why --cuda-graphs cannot run on `device` (one line), or None."""
    if device.type != "cuda":
        return f"--cuda-graphs needs a CUDA device (got {device.type}): CUDA graphs capture CUDA kernels"
    return None


@dataclass
class StaticBatch:
    tokens: torch.Tensor
    targets: torch.Tensor

    def load(self, tokens: torch.Tensor, targets: torch.Tensor) -> None:
        """A new batch, copied into the captured buffers."""
        self.tokens.copy_(tokens)
        self.targets.copy_(targets)


def step_body(
    model: nn.Module,
    batch: StaticBatch,
    pass_type: str,
    optimizer: torch.optim.Optimizer | None,
    autocast: Callable[[], object],
) -> Callable[[], torch.Tensor]:
    """The step to capture: what step.make_step does, minus zero_grad (grads stay graph-owned)."""

    def body() -> torch.Tensor:
        grad = torch.no_grad() if pass_type == "forward" else torch.enable_grad()
        with grad, autocast():
            logits = model(batch.tokens)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch.targets.reshape(-1))
        if pass_type == "forward":
            return loss
        loss.backward()
        if pass_type == "train-step":
            optimizer.step()
        return loss

    return body


class CapturedStep:
    """`body` captured in one CUDA graph; calling it replays the graph. `loss` is the
    static output tensor, refreshed by each replay. `phase(name)` wraps the eager iterations
    ("eager") and the capture ("capture"), so a caller can read each one's peak memory;
    `cuda` is torch.cuda (a test passes a fake)."""

    def __init__(
        self,
        body: Callable[[], torch.Tensor],
        model: nn.Module,
        warmup_iters: int = CAPTURE_WARMUP_ITERS,
        phase: Callable[[str], contextlib.AbstractContextManager] = lambda name: contextlib.nullcontext(),
        cuda=torch.cuda,
    ):
        # The graph reads what the body closes over (the static batch, the optimizer's state) by
        # address, and holds no reference to it: keep the body, or those blocks are freed and reused
        # and the replays read garbage (token ids out of range, a device-side assert).
        self.body = body
        with phase("eager"):
            side = cuda.Stream()
            side.wait_stream(cuda.current_stream())
            with cuda.stream(side):
                for _ in range(warmup_iters):
                    model.zero_grad(set_to_none=True)
                    body()
            cuda.current_stream().wait_stream(side)
            model.zero_grad(set_to_none=True)
        # Free the eager iterations' cached blocks now: capture cannot release them on OOM.
        gc.collect()
        cuda.synchronize()
        cuda.empty_cache()
        with phase("capture"):
            self.graph = cuda.CUDAGraph()
            with cuda.graph(self.graph):
                self.loss = body()

    def __call__(self) -> None:
        self.graph.replay()


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    """AdamW with capturable=True (optimizer.make_optimizer)."""
    return make_train_optimizer(model, next(model.parameters()).device, capturable=True)
