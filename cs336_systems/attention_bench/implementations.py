"""The attention functions attention_bench times, each as f(q, k, v) -> out for one configuration."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..adapters import Adapters, load_adapters
from ..layers import naive_causal_attention
from ..loading import load_callable
from .config import FLASH_IMPLEMENTATIONS, IMPLEMENTATIONS, AttentionConfig, is_custom

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = True) -> torch.Tensor:
    """The handout's attention (models.naive_causal_attention, with its NVTX ranges) or its unmasked twin."""
    if is_causal:
        return naive_causal_attention(q, k, v)
    probs = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    return probs.to(v.dtype) @ v


def _call_user(function: Callable | type, is_causal: bool) -> Attend:
    """An autograd.Function class is called as Fn.apply(q, k, v, is_causal), anything else as f(q, k, v, is_causal)."""
    if isinstance(function, type) and issubclass(function, torch.autograd.Function):
        return lambda q, k, v: function.apply(q, k, v, is_causal)
    return lambda q, k, v: function(q, k, v, is_causal)


def heads_in_batch(attend: Attend) -> Attend:
    """(batch, heads, seq, d) inputs handed over as (batch x heads, seq, d), the shape the official
    tests call the adapters with; the output is unfolded back. 3-D inputs pass as they are."""

    def folded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if q.dim() != 4:
            return attend(q, k, v)
        batch, heads = q.shape[:2]
        out = attend(*(t.reshape(batch * heads, *t.shape[2:]) for t in (q, k, v)))
        return out.reshape(batch, heads, *out.shape[1:]) if out.dim() == 3 else out

    return folded


def attention_function(implementation: str, *, causal: bool = True, adapters: Adapters | str | None = None) -> Attend:
    """f(q, k, v) for `implementation`. The adapters' own exceptions propagate: NotImplementedAdapter
    (the row is skipped), BadAdapter (not an autograd Function: an error row)."""
    if implementation == "naive":
        return lambda q, k, v: naive_attention(q, k, v, causal)
    if implementation == "sdpa":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if implementation == "compiled":
        torch._dynamo.reset()  # a fresh compile per configuration, so compile_s is comparable
        compiled = torch.compile(naive_attention)
        return lambda q, k, v: compiled(q, k, v, causal)
    if implementation in FLASH_IMPLEMENTATIONS:
        if adapters is None:
            raise ValueError(f"{implementation} comes from --adapters MODULE, and none was given")
        if isinstance(adapters, str):
            adapters = load_adapters(adapters)
        return heads_in_batch(_call_user(adapters.flash_function(FLASH_IMPLEMENTATIONS[implementation]), causal))
    if is_custom(implementation):
        return _call_user(load_callable(implementation, "--implementations"), causal)
    raise ValueError(
        f"unknown implementation {implementation!r}; choose one of {IMPLEMENTATIONS} or package.module:callable"
    )


def attention_for(config: AttentionConfig, adapters: Adapters | None = None) -> Attend:
    return attention_function(config.implementation, causal=config.causal, adapters=adapters or config.adapters)
