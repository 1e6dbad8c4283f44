"""The CS336 Transformer LM and its table of named sizes (factory.py builds it, or a user's own model).

Architecture (CS336 assignment 2): pre-norm blocks, RMSNorm computed in fp32,
causal multi-head self-attention with RoPE, SwiGLU feed-forward, no biases,
untied embedding and LM head, final RMSNorm.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from . import nvtx
from .errors import UsageError
from .layers import RMSNorm, TransformerBlock
from .size_tables import NEWEST_SIZE_TABLE, SIZE_TABLES, choose_size_table

ATTENTION_KINDS = ("naive", "sdpa")
DEFAULT_VOCAB_SIZE = 10_000
DEFAULT_ROPE_THETA = 10_000.0
DEFAULT_CONTEXT_LENGTH = 512
CUSTOM_SIZE_NAME = "custom"

# A size is a name looked up in its edition's table (size_tables.py) and nowhere else.
DEFAULT_SIZE_TABLE = NEWEST_SIZE_TABLE  # a ModelConfig built from a shape, not from a name
CHECKPOINT_WORDS = ("sqrt", "all")  # --checkpoint-blocks besides a number of blocks K (0 = off)


# Sane upper bounds, each tens of times the largest published model's (d_model 16384, d_ff 53248,
# 126 layers, 128 heads, a 256k vocabulary, a 10M context): past them a shape is a typo, and torch's
# size arithmetic overflows into a traceback instead of an honest out-of-memory row.
MODEL_LIMITS = {
    "d_model": 2**20,
    "d_ff": 2**22,
    "num_layers": 2**14,
    "num_heads": 2**14,
    "vocab_size": 2**24,
    "context_length": 2**28,
}


class ConfigError(UsageError):
    """A model shape or option the user asked for that cannot be built."""


def size_table(edition: str) -> dict[str, dict[str, int]]:
    try:
        return SIZE_TABLES[str(edition)]
    except KeyError:
        raise ConfigError(f"unknown size table {edition!r}; choose one of: {', '.join(SIZE_TABLES)}") from None


def canonical_size_name(name: str, edition: str) -> str:
    """Map a size name to its key in the edition's table, ignoring case ('XL' -> 'xl')."""
    sizes = size_table(edition)
    by_lower = {key.lower(): key for key in sizes}
    try:
        return by_lower[name.lower()]
    except KeyError:
        choices = ", ".join(sizes)
        elsewhere = [e for e, table in SIZE_TABLES.items() if name.lower() in {key.lower() for key in table}]
        hint = f" ({name} is in the {elsewhere[0]} table: --size-table {elsewhere[0]})" if elsewhere else ""
        raise ConfigError(f"unknown model size {name!r}; choose one of: {choices}{hint}") from None


def checkpoint_group_size(checkpoint_blocks: int | str | None, num_layers: int) -> int:
    """Blocks per checkpointed group: 0 (off), K, ceil(sqrt(num_layers)) or num_layers."""
    if checkpoint_blocks in (None, 0, "0"):
        return 0
    if checkpoint_blocks == "sqrt":
        return math.isqrt(num_layers - 1) + 1  # ceil(sqrt(L))
    if checkpoint_blocks == "all":
        return num_layers
    return int(checkpoint_blocks)


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a Transformer LM. `context_length` is the longest sequence it supports."""

    d_model: int
    d_ff: int
    num_layers: int
    num_heads: int
    vocab_size: int = DEFAULT_VOCAB_SIZE
    context_length: int = DEFAULT_CONTEXT_LENGTH
    rope_theta: float = DEFAULT_ROPE_THETA
    attention: str = "sdpa"
    size_name: str = CUSTOM_SIZE_NAME
    size_table: str = DEFAULT_SIZE_TABLE
    # Activation checkpointing: None (off), K blocks per group, "sqrt" or "all" (one group).
    checkpoint_blocks: int | str | None = None
    # One matmul for q, k and v and one for SwiGLU's w1 and w3 (the same function, fewer kernels)
    fused_projections: bool = False

    @classmethod
    def from_size(cls, size: str, size_table: str | None = None, **overrides) -> ModelConfig:
        """A named size of `size_table` with optional overrides; the name becomes 'custom' if the shape changes.
        Without a table: the one that has the name, else the newest (size_tables.choose_size_table; the
        CLIs also read the student's repository, a library call does not)."""
        edition = choose_size_table(size_table, [size], read_repository=False).edition
        name = canonical_size_name(size, edition)
        shape = dict(SIZE_TABLES[edition][name])
        given = {key: value for key, value in overrides.items() if value is not None}
        changed = any(given.get(key, shape[key]) != shape[key] for key in shape)
        if given.get("vocab_size", DEFAULT_VOCAB_SIZE) != DEFAULT_VOCAB_SIZE:
            changed = True
        shape.update(given)
        shape["size_name"] = CUSTOM_SIZE_NAME if changed else name
        shape["size_table"] = edition
        if shape.get("checkpoint_blocks") in (0, "0"):
            shape["checkpoint_blocks"] = None
        config = cls(**shape)
        config.validate()
        return config

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def checkpoint_group_size(self) -> int:
        return checkpoint_group_size(self.checkpoint_blocks, self.num_layers)

    def __post_init__(self) -> None:
        self.validate()  # a shape refuses itself, whoever builds it: flags, a grid, a --config file

    def validate(self) -> None:
        for field in ("d_model", "d_ff", "num_layers", "num_heads", "vocab_size", "context_length"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(f"{field} must be an integer, got {value!r}")
            if getattr(self, field) <= 0:
                raise ConfigError(f"{field} must be positive, got {getattr(self, field)}")
            if getattr(self, field) > MODEL_LIMITS[field]:
                raise ConfigError(
                    f"{field} must be at most {MODEL_LIMITS[field]} (far past any published model), "
                    f"got {getattr(self, field)}"
                )
        if isinstance(self.rope_theta, bool) or not isinstance(self.rope_theta, int | float) or not self.rope_theta > 0:
            raise ConfigError(f"rope_theta must be a positive number, got {self.rope_theta!r}")
        if not isinstance(self.size_name, str) or not isinstance(self.fused_projections, bool):
            raise ConfigError(
                f"size_name must be text and fused_projections true or false, got {self.size_name!r}, "
                f"{self.fused_projections!r}"
            )
        if self.d_model % self.num_heads:
            raise ConfigError(f"d_model {self.d_model} is not divisible by num_heads {self.num_heads}")
        if self.head_dim % 2:
            raise ConfigError(f"RoPE needs an even head dimension, got d_model/num_heads = {self.head_dim}")
        if not isinstance(self.attention, str) or self.attention not in ATTENTION_KINDS:
            raise ConfigError(f"attention must be one of {ATTENTION_KINDS}, got {self.attention!r}")
        size_table(self.size_table)
        blocks = self.checkpoint_blocks
        if blocks is not None and blocks not in CHECKPOINT_WORDS:
            if not str(blocks).isdigit():
                raise ConfigError(f"--checkpoint-blocks must be 0, a number of blocks, sqrt or all; got {blocks!r}")
            if int(blocks) > self.num_layers:
                raise ConfigError(f"--checkpoint-blocks {blocks} is more than the model's {self.num_layers} layers")

    def check_context(self, requested: int, what: str | None = None) -> None:
        """Refuse a sequence longer than the model was built for (RoPE tables, masks)."""
        if requested > self.context_length:
            what = what or f"--context-length {requested}"
            raise ConfigError(
                f"{what} is longer than the model supports (it is longer than --max-context-length "
                f"{self.context_length})"
            )

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)


def formula_num_params(config: ModelConfig) -> int:
    """P = 2*V*d + L*(4*d^2 + 3*d*d_ff + 2*d) + d  (docs/reference.md section 1)."""
    d, d_ff, V, L = config.d_model, config.d_ff, config.vocab_size, config.num_layers
    return 2 * V * d + L * (4 * d * d + 3 * d * d_ff + 2 * d) + d


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


class TransformerLM(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        config.validate()
        self.config = config
        # reset_parameters below initialises it: nn.Embedding's own normal_ would import torch._dynamo
        # (a second) on the meta device, where count_parameters_for builds the model
        weight = torch.empty(config.vocab_size, config.d_model)
        self.token_embeddings = nn.Embedding(config.vocab_size, config.d_model, _weight=weight)
        self.layers = nn.ModuleList(TransformerBlock(config) for _ in range(config.num_layers))
        self.ln_final = RMSNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        # The handout's initialisation: truncated normals at +-3 std.
        for module in self.modules():
            if isinstance(module, nn.Linear):
                out_features = getattr(module, "part_features", module.out_features)  # FusedLinear: per part
                std = math.sqrt(2.0 / (module.in_features + out_features))
                nn.init.trunc_normal_(module.weight, std=std, a=-3 * std, b=3 * std)
            elif isinstance(module, nn.Embedding):
                nn.init.trunc_normal_(module.weight, std=1.0, a=-3.0, b=3.0)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.shape[-1] > self.config.context_length:
            raise ValueError(
                f"sequence length {tokens.shape[-1]} exceeds the model's context length {self.config.context_length}"
            )
        x = self.token_embeddings(tokens)
        group = self.config.checkpoint_group_size
        if not group or not torch.is_grad_enabled():
            for index, layer in enumerate(self.layers):
                with nvtx.block(index):
                    x = layer(x)
        else:
            # Only each group's input is kept; its blocks' residuals are rebuilt in backward.
            for start in range(0, len(self.layers), group):
                blocks = self.layers[start : start + group]
                with nvtx.block(start):
                    # The blocks draw no random numbers: saving and restoring the RNG state is
                    # wasted work, and under CUDA-graph capture it registers generator state too.
                    x = checkpoint(_run_blocks, blocks, x, use_reentrant=False, preserve_rng_state=False)
        return self.lm_head(self.ln_final(x))


def _run_blocks(blocks: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
    for block in blocks:
        x = block(x)
    return x
