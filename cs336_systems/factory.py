"""The model a run measures, built: the built-in Transformer LM (models.py) or a user's own
--model-factory model (user_model.py), on any device, and its parameter count without allocating."""

from __future__ import annotations

import torch
from torch import nn

from .checkpointing import NoBlocks, checkpoint_blocks, repeated_blocks
from .device import release_memory
from .models import ModelConfig, TransformerLM, count_parameters
from .user_model import (
    FACTORY_KEYWORDS,
    ModelContractError,
    ModelFactoryError,
    build_user_model,
    check_model_output,
    load_model_factory,
)
from .usercode import UserCodeError, UserCodeTimeout, guarded, import_limit_s


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


def check_user_model(config: ModelConfig, spec: str, device: torch.device) -> None:
    """A --model-factory model dry-built before any measurement or rank starts, as every tool checks it:
    one layer of it on `device` (the factory raising, exiting or hanging past the import limit, returning
    no Module, building on the meta device), then its logits (floating (B, T, V), not a tuple). A
    ModelFactoryError (one line) otherwise. A sweep of child processes runs it in a child of its own
    (child.check_user_model_in_child)."""
    label = f"--model-factory {spec}"
    load_model_factory(spec)
    # what a step needs of it, in a fraction of the memory; two layers where its blocks are to be checkpointed
    checkpointed = config.checkpoint_group_size > 0
    probe = {**factory_kwargs(config), "num_layers": 2 if checkpointed else 1}
    try:
        with guarded(label, import_limit_s()):
            try:
                model = build_user_model(spec, probe, device)
            except ModelContractError:
                raise
            except ModelFactoryError:  # a model whose layers come in groups: as the run builds it
                model = build_user_model(spec, factory_kwargs(config), device)
            check_model_output(model, config, device, label)
        if checkpointed:
            try:
                repeated_blocks(model)
            except NoBlocks as exc:
                raise ModelFactoryError(f"{label}: {exc}, which --checkpoint-blocks needs") from None
    except (UserCodeError, UserCodeTimeout) as exc:
        raise ModelFactoryError(f"{exc} (building it to check its logits, before any step)") from None
    except (torch.OutOfMemoryError, MemoryError):  # too large to try here: the rows will say so
        pass
    finally:
        model = None
        release_memory(device)
