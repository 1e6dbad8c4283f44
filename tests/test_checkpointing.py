"""Checkpointing a model that is not ours (checkpointing.py): the student's repeated blocks wrapped
in groups compute the same function and keep only each group's input for backward."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cs336_systems.checkpointing import NoBlocks, checkpoint_blocks, group_size
from tests.helpers import tiny_model_config


class Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x, scale):  # the loop passes another argument besides x, as RoPE positions are
        return x + self.down(torch.relu(self.up(x))) * scale


class StudentModel(nn.Module):
    """Shaped like a student's: an embedding, a ModuleList of blocks in its own loop, a head."""

    def __init__(self, layers: int = 6, d: int = 8):
        super().__init__()
        self.embed, self.head = nn.Embedding(11, d), nn.Linear(d, 11)
        self.layers = nn.ModuleList(Block(d) for _ in range(layers))

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, 0.5)
        return self.head(x)


def saved_bytes(model: nn.Module, tokens: torch.Tensor) -> int:
    """Bytes autograd keeps for backward over one forward (each storage once)."""
    seen: dict[int, int] = {}

    def pack(tensor):
        seen[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(tokens).sum()
    return sum(n for ptr, n in seen.items() if ptr not in params)


@pytest.mark.parametrize("words, size", [(1, 1), (2, 2), ("sqrt", 3), ("all", 6)])
def test_groups_compute_the_same_function_and_keep_less(words, size):
    torch.manual_seed(0)
    plain = StudentModel()
    wrapped = StudentModel()
    wrapped.load_state_dict(plain.state_dict())
    assert checkpoint_blocks(wrapped, words) == ("layers", 6, size) and group_size(words, 6) == size
    tokens = torch.randint(0, 11, (2, 32))
    torch.testing.assert_close(wrapped(tokens), plain(tokens))
    plain(tokens).sum().backward()
    wrapped(tokens).sum().backward()
    grads = {name: p.grad for name, p in plain.named_parameters()}
    for (name, p), original in zip(wrapped.named_parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(p.grad, original.grad, msg=name)
    assert len(grads) == len(list(wrapped.parameters()))
    assert saved_bytes(wrapped, tokens) < saved_bytes(plain, tokens) / 2


def test_a_model_without_repeated_blocks_is_said_so():
    with pytest.raises(NoBlocks, match="no nn.ModuleList of repeated blocks"):
        checkpoint_blocks(nn.Sequential(nn.Linear(2, 2)), 1)


def test_the_students_fixture_model_is_checkpointed_through_the_factory(monkeypatch, fresh_cs336_basics):
    from cs336_systems.config import BenchmarkConfig
    from cs336_systems.runner import run_benchmark
    from tests.helpers import FIXTURES, tiny_model_config

    factory = "cs336_basics.model:BasicsTransformerLM"
    monkeypatch.syspath_prepend(str(FIXTURES / "student_repo"))
    config = BenchmarkConfig(
        model=tiny_model_config(checkpoint_blocks="all"),
        model_factory=factory,
        context_length=16,
        batch_size=2,
        pass_type="train-step",
        device="cpu",
        warmup_steps=1,
        measure_steps=2,
        peak_tflops=1.0,
        profile_step=False,
    )
    record = run_benchmark(config)
    assert record.status == "ok", record.error
    assert record.checkpoint_blocks == "all"


def test_a_factory_model_without_repeated_blocks_is_refused_before_any_step_when_checkpointing(fixtures_on_path):
    """--checkpoint-blocks with a model that has no list of blocks failed at its first step (exit 1, four
    lines); the dry build now checks it on two layers, in one line."""
    from cs336_systems.factory import check_user_model
    from cs336_systems.user_model import ModelFactoryError

    spec = "hostile.models:assignment1"
    check_user_model(tiny_model_config(), spec, torch.device("cpu"))  # no checkpointing: fine
    with pytest.raises(ModelFactoryError, match="Tiny has no nn.ModuleList of repeated blocks to checkpoint, which"):
        check_user_model(tiny_model_config(checkpoint_blocks=1), spec, torch.device("cpu"))
