"""The Transformer LM's layers, as the CS336 handout writes them (models.py assembles the model):
RMSNorm in fp32, RoPE, causal multi-head attention (the handout's naive one or SDPA), SwiGLU, the
pre-norm block, and the fast path's fused projections (one QKV matmul, one w1/w3 matmul).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from . import nvtx


class BlockShape(Protocol):
    """What a block reads of a models.ModelConfig (models.py imports this module, not the reverse)."""

    d_model: int
    d_ff: int
    num_heads: int
    context_length: int
    rope_theta: float
    attention: str
    fused_projections: bool

    @property
    def head_dim(self) -> int: ...


class RMSNorm(nn.Module):
    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 whatever the activation dtype, as the handout does. Written
        # out rather than F.rms_norm so what autograd saves (x, normed, 1/rms) is the
        # same on every device, which keeps the memory estimator exact.
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * normed).to(x.dtype)


class RotaryEmbedding(nn.Module):
    """RoPE in the rotate-half layout: the handout's interleaved pairs up to a fixed
    permutation of the query/key features, with contiguous slices instead of strided ones."""

    def __init__(self, head_dim: int, context_length: int, theta: float):
        super().__init__()
        # computed on the CPU, then moved to the model's device: arange on the meta device (where
        # count_parameters_for builds the model) would import torch._dynamo, a second per process
        cpu = torch.device("cpu")
        inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float32, device=cpu) / head_dim)
        angles = torch.outer(torch.arange(context_length, dtype=torch.float32, device=cpu), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        device = torch.get_default_device()
        self.register_buffer("cos", angles.cos().to(device), persistent=False)
        self.register_buffer("sin", angles.sin().to(device), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq_len = x.shape[-2]
        cos = self.cos[:seq_len].to(x.dtype)
        sin = self.sin[:seq_len].to(x.dtype)
        first, second = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-second, first), dim=-1) * sin


def naive_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The handout's attention: explicit scores, causal mask, softmax, weighted sum."""
    seq_len = q.shape[-2]
    with nvtx.range("attention/scores"):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
    with nvtx.range("attention/softmax"):
        probs = torch.softmax(scores, dim=-1)
    with nvtx.range("attention/weighted_sum"):
        return probs.to(v.dtype) @ v


def sdpa_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


ATTENTION_FUNCTIONS: dict[str, Callable[..., torch.Tensor]] = {
    "naive": naive_causal_attention,
    "sdpa": sdpa_causal_attention,
}


class CausalSelfAttention(nn.Module):
    def __init__(self, config: BlockShape):
        super().__init__()
        d = config.d_model
        self.num_heads = config.num_heads
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.output_proj = nn.Linear(d, d, bias=False)
        self.rope = RotaryEmbedding(config.head_dim, config.context_length, config.rope_theta)
        self.attend = ATTENTION_FUNCTIONS[config.attention]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (
            rearrange(proj(x), "b t (h d) -> b h t d", h=self.num_heads)
            for proj in (self.q_proj, self.k_proj, self.v_proj)
        )
        out = self.attend(self.rope(q), self.rope(k), v)
        return self.output_proj(rearrange(out, "b h t d -> b t (h d)"))


class FusedLinear(nn.Linear):
    """Several bias-free projections of one input stacked into one weight (`parts` outputs of
    `part_features` each): one matmul instead of `parts`. Initialised as the separate ones."""

    def __init__(self, in_features: int, part_features: int, parts: int):
        super().__init__(in_features, part_features * parts, bias=False)
        self.part_features = part_features


class FusedCausalSelfAttention(CausalSelfAttention):
    """CausalSelfAttention with q, k and v from one (d, 3d) matmul."""

    def __init__(self, config: BlockShape):
        nn.Module.__init__(self)
        d = config.d_model
        self.num_heads = config.num_heads
        self.qkv_proj = FusedLinear(d, d, 3)
        self.output_proj = nn.Linear(d, d, bias=False)
        self.rope = RotaryEmbedding(config.head_dim, config.context_length, config.rope_theta)
        self.attend = ATTENTION_FUNCTIONS[config.attention]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = rearrange(self.qkv_proj(x), "b t (three h d) -> three b h t d", three=3, h=self.num_heads)
        out = self.attend(self.rope(q), self.rope(k), v)
        return self.output_proj(rearrange(out, "b h t d -> b t (h d)"))


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=False)
        self.w2 = nn.Linear(d_ff, d_model, bias=False)
        self.w3 = nn.Linear(d_model, d_ff, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class FusedSwiGLU(nn.Module):
    """SwiGLU with w1 and w3 as one (d, 2 d_ff) matmul: w2(silu(a) * b), [a, b] = w13 x."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w13 = FusedLinear(d_model, d_ff, 2)
        self.w2 = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


class TransformerBlock(nn.Module):
    def __init__(self, config: BlockShape):
        super().__init__()
        fused = config.fused_projections
        self.ln1 = RMSNorm(config.d_model)
        self.attn = (FusedCausalSelfAttention if fused else CausalSelfAttention)(config)
        self.ln2 = RMSNorm(config.d_model)
        self.ffn = (FusedSwiGLU if fused else SwiGLU)(config.d_model, config.d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.ffn(self.ln2(x))
