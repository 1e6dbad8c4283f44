"""What one benchmark configuration is, and what identifies it.

`BenchmarkConfig.key()` is the configuration's identity (as torch.utils.benchmark's
TaskSpec): resume skips a configuration whose key is already in the output file, and
compare matches rows of two files on it. `row_key` computes the same key from a row read
back from CSV / JSONL, so one spelling per value whatever the file format.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from .models import ModelConfig
from .results.records import identity_value

PASS_TYPES = ("forward", "forward-backward", "train-step")
COMPILE_SCOPES = ("model", "blocks")  # "model": torch.compile(model); "blocks": each block (regional)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # torch.compile's
COMPILE_CHOICES = {"off": (False,), "on": (True,), "both": (False, True)}

# The row columns that identify a configuration, in record order (results.BenchmarkRecord).
IDENTITY_FIELDS = (
    "model_size", "d_model", "d_ff", "num_layers", "num_heads", "vocab_size", "rope_theta", "attention",
    "model_factory", "context_length", "batch_size", "pass_type", "precision", "compile", "compile_scope",
    "compile_mode", "cuda_graphs", "device", "timer", "warmup_steps", "measure_steps", "seed", "checkpoint_blocks",
    "optimizer_factory",
)  # fmt: skip
# Off (no checkpointing, torch's AdamW) is None, so rows written before these columns existed keep their key.


@dataclass(frozen=True)
class BenchmarkConfig:
    model: ModelConfig
    context_length: int = 512
    batch_size: int = 4
    pass_type: str = "forward-backward"
    precision: str = "fp32"
    compile: bool = False
    compile_scope: str = "model"
    compile_mode: str = "default"  # torch.compile's mode (COMPILE_MODES)
    cuda_graphs: bool = False  # capture the whole step in a CUDA graph and time its replays
    device: str = "cpu"
    timer: str = "host"
    warmup_steps: int = 5
    measure_steps: int = 10
    seed: int = 0
    model_factory: str | None = None
    optimizer_factory: str | None = None  # train-step: 'package.module:callable' instead of torch's AdamW
    peak: str = "auto"  # where the MFU denominator comes from: auto, table or measure
    peak_tflops: float | None = None  # a user's own peak, overriding `peak`
    profile_step: bool = True  # one extra step under torch.profiler after the measured ones

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.context_length

    @property
    def attention(self) -> str:
        """The built-in model's attention; a --model-factory model's is not ours to know."""
        return self.model.attention if self.model_factory is None else "n/a"

    def replace(self, **changes) -> BenchmarkConfig:
        return dataclasses.replace(self, **changes)

    def identity(self) -> dict[str, object]:
        """The identifying columns as a record of this configuration holds them."""
        m = self.model
        return {
            "model_size": m.size_name, "d_model": m.d_model, "d_ff": m.d_ff, "num_layers": m.num_layers,
            "num_heads": m.num_heads, "vocab_size": m.vocab_size, "rope_theta": m.rope_theta,
            "attention": self.attention, "model_factory": self.model_factory, "context_length": self.context_length,
            "batch_size": self.batch_size, "pass_type": self.pass_type, "precision": self.precision,
            "compile": self.compile, "compile_scope": self.compile_scope if self.compile else None,
            "compile_mode": self.compile_mode if self.compile else None, "cuda_graphs": self.cuda_graphs,
            "device": self.device, "timer": self.timer, "warmup_steps": self.warmup_steps,
            "measure_steps": self.measure_steps, "seed": self.seed, "checkpoint_blocks": m.checkpoint_blocks,
            "optimizer_factory": self.optimizer_factory if self.pass_type == "train-step" else None,
        }  # fmt: skip

    def key(self) -> tuple[str, ...]:
        return row_key(self.identity())


def _normal(value: object) -> str:
    """identity_value, plus: "n/a" (a --model-factory row's attention) is one of pandas' default NA
    strings, read back as NaN, so it spells as the empty value."""
    return "" if isinstance(value, str) and value == "n/a" else identity_value(value)


def row_key(row: Mapping[str, object]) -> tuple[str, ...]:
    """The identity of the configuration a result row (or `BenchmarkConfig.identity()`) holds."""
    return tuple(_normal(row.get(name)) for name in IDENTITY_FIELDS)
