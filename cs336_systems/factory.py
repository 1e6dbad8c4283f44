"""The model a run measures, built: the built-in Transformer LM (models.py) or a user's own
--model-factory model (user_model.py), on any device, and its parameter count without allocating."""

from __future__ import annotations

import torch
from torch import nn

from .checkpointing import checkpoint_blocks
from .models import ModelConfig, TransformerLM, count_parameters
from .user_model import FACTORY_KEYWORDS, build_user_model
from .usercode import UserCodeTimeout


def factory_kwargs(config: ModelConfig) -> dict:
    """The keyword arguments a user's --model-factory callable receives."""
    return {name: getattr(config, name) for name in FACTORY_KEYWORDS}


def build_model(
    config: ModelConfig,
    device: torch.device | str,
    model_factory: str | None = None,
) -> nn.Module:
    """Build the model directly on `device` (initialising 3B parameters on a GPU is fast). A
    --model-factory model's repeated blocks are checkpointed in groups where `config` asks
    (checkpointing.py); its other built-in options are refused by BenchmarkConfig."""
    if model_factory is None:
        with torch.device(device):
            return TransformerLM(config)
    model = build_user_model(model_factory, factory_kwargs(config), device)
    if config.checkpoint_blocks is not None:  # the built-in model checkpoints its own blocks
        checkpoint_blocks(model, config.checkpoint_blocks)
    return model


def count_parameters_for(config: ModelConfig, model_factory: str | None = None) -> int | None:
    """Parameter count without allocating: the model is built on the meta device.

    Returns None for a user's model that cannot be built on the meta device.
    """
    if model_factory is None:
        return count_parameters(build_model(config, "meta"))
    try:
        return count_parameters(build_model(config, "meta", model_factory))
    except UserCodeTimeout:  # usercode.guarded's: the factory hangs, on any device
        raise
    except Exception:  # a user's model need not support the meta device
        return None
