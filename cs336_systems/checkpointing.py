"""Activation checkpointing of a model that is not ours: its repeated blocks (the longest nn.ModuleList
of one class, the Transformer's layers) wrapped in groups of K, each group one torch.utils.checkpoint,
whatever the model's own forward does with them.

The model's loop calls its blocks one by one (`for layer in self.layers: x = layer(x, ...)`), so the
first block of each group is replaced by the group checkpointed as one and the others by a pass-through:
the loop runs unchanged, and only each group's input is kept for backward, as the built-in model does.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class NoBlocks(ValueError):
    """The model has no list of repeated blocks to checkpoint."""


def repeated_blocks(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """(name, list) of the model's longest nn.ModuleList whose modules are all of one class (at least two)."""
    found = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.ModuleList) and len(module) > 1 and len({type(m) for m in module}) == 1
    ]
    if not found:
        raise NoBlocks(f"{type(model).__name__} has no nn.ModuleList of repeated blocks to checkpoint")
    return max(found, key=lambda item: len(item[1]))


def group_size(words: int | str, num_blocks: int) -> int:
    """--checkpoint-blocks as a group size: K, sqrt (ceil(sqrt(N))) or all."""
    if words == "sqrt":
        return math.ceil(math.sqrt(num_blocks))
    if words == "all":
        return num_blocks
    return int(words)


class CheckpointedGroup(nn.Module):
    """Blocks run one after the other inside one torch.utils.checkpoint; each gets the first block's
    other arguments (positions, masks) as the model's loop passes them."""

    def __init__(self, blocks: list[nn.Module]):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor, *args, **kwargs):
        if not torch.is_grad_enabled():
            return self._run(x, *args, **kwargs)
        return checkpoint(self._run, x, *args, use_reentrant=False, preserve_rng_state=False, **kwargs)

    def _run(self, x: torch.Tensor, *args, **kwargs):
        for block in self.blocks:
            x = block(x, *args, **kwargs)
        return x


class PassThrough(nn.Module):
    """A block already run by its group: the model's loop hands its input straight on."""

    def forward(self, x: torch.Tensor, *args, **kwargs):
        return x


def checkpoint_blocks(model: nn.Module, words: int | str) -> tuple[str, int, int]:
    """Wrap `model`'s repeated blocks in groups (in place); (the list's name, its blocks, the group size)."""
    name, blocks = repeated_blocks(model)
    size = group_size(words, len(blocks))
    members = list(blocks)
    for start in range(0, len(members), size):
        group = members[start : start + size]
        blocks[start] = CheckpointedGroup(group)
        for index in range(start + 1, start + len(group)):
            blocks[index] = PassThrough()
    return name, len(members), size
