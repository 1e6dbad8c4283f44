from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from cs336_systems.config import BenchmarkConfig
from cs336_systems.models import ModelConfig

FIXTURES = Path(__file__).parent / "fixtures"
# the tiny model's shape flags, shared by every CLI test (each adds its own run flags)
TINY_SHAPE = ["--d-model", "32", "--d-ff", "64", "--num-layers", "2", "--num-heads", "2", "--vocab-size", "97"]
REPO = Path(__file__).resolve().parent.parent

torch.set_num_threads(min(2, os.cpu_count() or 1))


def tiny_model_config(**changes) -> ModelConfig:
    shape = dict(d_model=32, d_ff=64, num_layers=2, num_heads=2, vocab_size=97, context_length=16)
    shape.update(changes)
    return ModelConfig(**shape)


def tiny_benchmark_config(**changes) -> BenchmarkConfig:
    model_changes = {k: changes.pop(k) for k in list(changes) if k in ("attention", "vocab_size", "d_model")}
    base = dict(
        model=tiny_model_config(**model_changes),
        context_length=16,
        batch_size=2,
        warmup_steps=1,
        measure_steps=3,
        device="cpu",
    )
    base.update(changes)
    return BenchmarkConfig(**base)


@pytest.fixture
def fixtures_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    return FIXTURES


def child_env() -> dict[str, str]:
    """Environment for a child python that imports this checkout and the test fixtures."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(FIXTURES), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    return env


PYTHON = sys.executable
