"""Each row's correctness check: the implementation's output and gradients against the fp32 naive
attention on the same inputs, computed once, outside the timed loop."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from .config import TOLERANCES

REFERENCE_CHUNK_ELEMENTS = 2**26  # query rows per chunk x keys: 256 MiB of fp32 scores at a time


def _rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, is_causal: bool) -> torch.Tensor:
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if is_causal:
        rows = torch.arange(start, start + q.shape[-2], device=q.device)[:, None]
        scores = scores.masked_fill(torch.arange(k.shape[-2], device=q.device)[None, :] > rows, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor, is_causal: bool
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """fp32 naive attention and its (dq, dk, dv). Query rows go in chunks, each checkpointed, so the
    reference never holds more than one chunk's scores: it fits wherever the inputs do."""
    q, k, v = (t.detach().float().requires_grad_() for t in (q, k, v))
    batch_heads = math.prod(q.shape[:-2])
    chunk = max(1, REFERENCE_CHUNK_ELEMENTS // (k.shape[-2] * batch_heads))
    with torch.enable_grad():
        pieces = [
            checkpoint(_rows, q[..., start : start + chunk, :], k, v, start, is_causal, use_reentrant=False)
            for start in range(0, q.shape[-2], chunk)
        ]
        out = torch.cat(pieces, dim=-2)
        grads = torch.autograd.grad(out, (q, k, v), grad_out.float())
    return out.detach(), grads


@dataclass(frozen=True)
class Check:
    max_abs_err_out: float
    max_abs_err_grad: float
    tolerance: float
    failures: tuple[str, ...]  # one "name: error > allowed" per tensor over its tolerance

    @property
    def wrong(self) -> bool:
        return bool(self.failures)

    def message(self) -> str:
        return "differs from the fp32 naive reference: " + ", ".join(self.failures)


def check(
    out: torch.Tensor,
    grads: tuple[torch.Tensor | None, ...],
    expected_out: torch.Tensor,
    expected_grads: tuple[torch.Tensor, ...],
    precision: str,
) -> Check:
    tolerance = TOLERANCES[precision]
    failures, grad_errors = [], []
    for name, got, expected in zip(("out", "dq", "dk", "dv"), (out, *grads), (expected_out, *expected_grads)):
        if got is None:
            failures.append(f"{name}: no gradient")
            continue
        error = (got.detach().float() - expected).abs().max().item()
        allowed = tolerance * max(1.0, expected.abs().max().item())
        if name != "out":
            grad_errors.append(error)
        if not error <= allowed:  # NaN fails too
            failures.append(f"{name}: {error:.3g} > {allowed:.3g}")
    out_error = (out.detach().float() - expected_out).abs().max().item()
    return Check(out_error, max(grad_errors, default=math.nan), tolerance, tuple(failures))
