"""Each row's correctness check: the implementation's output and gradients against the fp32 naive
attention on the same inputs, computed once, outside the timed loop."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from .config import TOLERANCES, AttentionConfig

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


@dataclass(frozen=True)
class Verdict:
    """What a row's check found, for its record: the errors against the reference and the tolerance,
    `wrong` (a 'wrong' row's error, else None), notes, and `noncausal`: the implementation is timed
    with is_causal=False (judge_causal)."""

    max_abs_err_out: float | None = None
    max_abs_err_grad: float | None = None
    tolerance: float | None = None
    wrong: str | None = None
    notes: tuple[str, ...] = ()
    noncausal: bool = False

    @classmethod
    def of(cls, result: Check) -> Verdict:
        wrong = result.message() if result.wrong else None
        return cls(result.max_abs_err_out, result.max_abs_err_grad, result.tolerance, wrong)


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


def judge_causal(
    config: AttentionConfig,
    inputs: tuple[torch.Tensor, ...],
    out: torch.Tensor,
    causal_result: Check,
    run_noncausal: Callable[[], tuple[torch.Tensor, tuple]],
) -> Verdict:
    """A flash adapter wrong against causal attention. The handout lets the PyTorch FlashAttention-2
    ignore is_causal (its official test is non-causal): that one is run again with is_causal=False
    (`run_noncausal`) and judged, as its test judges it, non-causal; then it is timed non-causal. The
    Triton one is tested both ways: wrong, saying what it does with is_causal."""
    q, k, v, grad_out = inputs
    found = Verdict.of(causal_result)
    behaviour = is_causal_behaviour(out, (q.grad, k.grad, v.grad), inputs, config.precision)
    if config.implementation != "flash-pytorch":
        return dataclasses.replace(found, wrong=f"{behaviour + ': ' if behaviour else ''}{causal_result.message()}")
    plain_out, plain_grads = run_noncausal()
    expected_out, expected_grads = reference(q, k, v, grad_out, False)
    plain = check(plain_out, plain_grads, expected_out, expected_grads, config.precision)
    if plain.wrong:
        return dataclasses.replace(found, wrong=f"{causal_result.message()}; with is_causal=False too")
    note = (
        f"{behaviour or 'with is_causal=True it differs from causal attention'}; checked and timed with "
        "is_causal=False, as its official test runs the PyTorch version (the handout lets it ignore is_causal)"
    )
    return dataclasses.replace(
        found,
        max_abs_err_out=plain.max_abs_err_out,
        max_abs_err_grad=plain.max_abs_err_grad,
        wrong=None,
        notes=(note,),
        noncausal=True,
    )
