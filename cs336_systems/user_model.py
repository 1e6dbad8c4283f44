"""A user's own model behind --model-factory: loading the callable, fitting its keywords to the
ones the harness gives, building it and checking what it returns."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
from torch import nn

from .errors import UsageError
from .loading import fit_keywords, load_callable
from .usercode import UserCodeTimeout


class TokenShape(Protocol):
    """What the output check reads of a ModelConfig (models.py imports this module, not the reverse)."""

    vocab_size: int
    context_length: int


class ModelFactoryError(UsageError):
    """A user's --model-factory that cannot be imported, called or used."""


class ModelContractError(ModelFactoryError):
    """What the model is on any device: not a Module, built on the meta device, or logits that are
    not floating (B, T, V)."""


# what ModelConfig.factory_kwargs gives a factory
FACTORY_KEYWORDS = ("vocab_size", "context_length", "d_model", "num_layers", "num_heads", "d_ff", "rope_theta")
# and what build_user_model adds: assignment-1 constructors often require both (given only to a parameter of
# that name: a factory passing **kwargs on to a config would not expect them)
PLACEMENT_KEYWORDS = ("device", "dtype")
# other spellings of a keyword in students' constructors (the handout's model says rope_theta)
FACTORY_SYNONYMS = {"theta": "rope_theta", "rope_theta": "theta"}
BUILD_DTYPE = torch.float32  # what a model is built in; --param-dtype casts its parameters afterwards
# how a check says the user's own code raised (building the model, or in its forward): where that is the
# device's doing (a CUDA-only call on a CPU), the handout measures the built-in model instead
RAISED_BUILDING, RAISED_IN_FORWARD = "raised", "failed on int64 tokens of shape"


def raised_in_users_code(message: str) -> bool:
    """Whether a ModelFactoryError's line says the user's code raised, not that it broke the contract."""
    return any(f" {words} " in message for words in (RAISED_BUILDING, RAISED_IN_FORWARD))


def factory_keywords(factory: Callable, keywords: dict, spec: str) -> dict:
    """`keywords` as the factory's signature names them: its own parameters only, a documented
    synonym where it spells one differently (theta for rope_theta). A parameter without a default
    that none of them fills is a ModelFactoryError naming it. All of them when the signature
    takes **kwargs or cannot be read."""
    given, unfilled = fit_keywords(factory, keywords, synonyms=FACTORY_SYNONYMS, only_named=PLACEMENT_KEYWORDS)
    if unfilled:
        raise ModelFactoryError(
            f"--model-factory {spec}: cannot fill its parameter {unfilled[0]!r}; it is given "
            f"{', '.join(keywords)} (theta = rope_theta); give {unfilled[0]!r} a default or wrap the callable"
        )
    return given


def load_model_factory(spec: str) -> Callable[..., nn.Module]:
    """Resolve 'package.module:callable' (the callable may be a dotted attribute path); a parameter
    it has that no keyword fills is an error now, before any model is built."""
    factory = load_callable(spec, "--model-factory", ModelFactoryError)
    factory_keywords(factory, dict.fromkeys(FACTORY_KEYWORDS + PLACEMENT_KEYWORDS), spec)
    return factory


def build_user_model(spec: str, keywords: dict, device: torch.device | str) -> nn.Module:
    """The factory `spec` called with the keywords its signature takes, on `device`: `device` and
    `dtype` (BUILD_DTYPE) are given too where the signature names them."""
    placement = dict(device=torch.device(device), dtype=BUILD_DTYPE)
    with torch.device(device):
        factory = load_model_factory(spec)
        try:
            model = factory(**factory_keywords(factory, {**keywords, **placement}, spec))
        except (torch.OutOfMemoryError, MemoryError, UserCodeTimeout):
            raise
        except Exception as exc:
            raise ModelFactoryError(f"--model-factory {spec} {RAISED_BUILDING} {type(exc).__name__}: {exc}") from exc
    if not isinstance(model, nn.Module):
        what = f"the class {model.__name__} itself" if isinstance(model, type) else type(model).__name__
        raise ModelContractError(f"--model-factory {spec} returned {what}, expected a torch.nn.Module")
    if torch.device(device).type != "meta" and any(t.is_meta for t in (*model.parameters(), *model.buffers())):
        raise ModelContractError(
            f"--model-factory {spec} built its parameters on the meta device, not on the device it is given "
            f"({device}): they hold no values to train"
        )
    return model.to(device)


def check_model_output(model: nn.Module, config: TokenShape, device: torch.device | str, label: str) -> None:
    """One tiny forward pass: the model must map int64 (B, T) tokens to (B, T, V) logits."""
    seq_len = min(8, config.context_length)
    tokens = torch.randint(0, config.vocab_size, (2, seq_len), device=device)
    try:
        with torch.inference_mode():
            out = model(tokens)
    except (torch.OutOfMemoryError, MemoryError, UserCodeTimeout):
        raise
    except Exception as exc:
        raise ModelFactoryError(f"{label} {RAISED_IN_FORWARD} (2, {seq_len}): {exc}") from exc
    expected = (2, seq_len, config.vocab_size)
    if not isinstance(out, torch.Tensor):
        what = f"a {type(out).__name__} of {len(out)}" if isinstance(out, tuple | list) else type(out).__name__
        raise ModelContractError(
            f"{label} returned {what}, expected a logits tensor of shape {expected}; "
            "wrap it to return the logits alone (e.g. the first of (logits, aux_losses))"
        )
    if tuple(out.shape) != expected or not out.is_floating_point():
        raise ModelContractError(
            f"{label} returned {out.dtype} logits of shape {tuple(out.shape)}, expected floating (B, T, V) = {expected}"
        )
