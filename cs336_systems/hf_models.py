"""HuggingFace transformers models as --model-factory callables (needs `transformers`).

    cs336-bench benchmark --model-factory cs336_systems.hf_models:llama --model-size small

`llama` builds a LlamaForCausalLM with the shape of the built-in model: untied
embedding and LM head, RMSNorm eps 1e-5, RoPE theta, SwiGLU d_ff, no biases, SDPA
attention. It has exactly the built-in model's parameter count, so the two can be timed
against each other step for step.
"""

from __future__ import annotations

import torch
from torch import nn


class LogitsOnly(nn.Module):
    """Adapts a HuggingFace causal LM to the harness contract: tokens (B, T) -> logits (B, T, V)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=tokens, use_cache=False).logits


def llama(vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=d_model,
        intermediate_size=d_ff,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=context_length,
        rms_norm_eps=1e-5,
        rope_theta=rope_theta,
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
        attn_implementation="sdpa",
    )
    return LogitsOnly(LlamaForCausalLM(config))
