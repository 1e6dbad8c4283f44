"""What one benchmark configuration is, and what identifies it.

`BenchmarkIdentity` declares, once, the columns that identify a configuration, in row order
(as torch.utils.benchmark's TaskSpec); `BenchmarkConfig.identity()` fills them, a
BenchmarkRecord is built from them (`BenchmarkRecord(**config.identity(), ...)`), and
`key()` is their one key (identity.row_key): resume skips a configuration whose key is
already in the output file, compare matches rows of two files on it.

A new setting is one field of BenchmarkConfig; if it changes what is measured, also a
column of BenchmarkIdentity with the same name (its value is read from the configuration,
or from its model), else a name in NOT_IDENTITY.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

from .anomalies import fast_path_flags
from .argtypes import MAX_INT, MAX_STEPS
from .identity import identity_field, row_key
from .models import ConfigError, ModelConfig
from .precision import PRECISIONS
from .timing import TIMERS

PASS_TYPES = ("forward", "forward-backward", "train-step")
COMPILE_SCOPES = ("model", "blocks")  # "model": torch.compile(model); "blocks": each block (regional)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # torch.compile's
COMPILE_CHOICES = {"off": (False,), "on": (True,), "both": (False, True)}
# where MFU's peak comes from (peak_flops.py): auto, the table for a known GPU, else this machine's
# calibrated peak; calibrate: measure now and keep it; measure: for this run only; table: the spec sheet
PEAK_CHOICES = ("auto", "table", "calibrate", "measure")


@dataclass(kw_only=True)
class ModelShape:
    """The model's identity columns, shared by every record of a Transformer LM (benchmark, DDP)."""

    model_size: str = identity_field()
    d_model: int = identity_field()
    d_ff: int = identity_field()
    num_layers: int = identity_field()
    num_heads: int = identity_field()
    vocab_size: int = identity_field()
    rope_theta: float = identity_field()
    attention: str = identity_field()
    model_factory: str | None = identity_field()


@dataclass(kw_only=True)
class BenchmarkIdentity(ModelShape):
    """The columns that identify one benchmark configuration, in row order (a mixin of
    results.BenchmarkRecord). Off (no checkpointing, torch's AdamW, not compiled) is None,
    so rows written before a column existed keep their key."""

    context_length: int = identity_field()
    batch_size: int = identity_field()
    pass_type: str = identity_field()
    precision: str = identity_field()
    compile: bool = identity_field()
    compile_scope: str | None = identity_field()
    compile_mode: str | None = identity_field()
    cuda_graphs: bool = identity_field()
    device: str = identity_field()
    timer: str = identity_field()
    warmup_steps: int = identity_field()
    measure_steps: int = identity_field()
    seed: int = identity_field()
    checkpoint_blocks: int | str | None = identity_field()  # None: off; K, sqrt or all
    optimizer_factory: str | None = identity_field()  # train-step: the user's --optimizer
    grad_accum_steps: int | None = identity_field()  # micro-batches per step; None: 1
    param_dtype: str | None = identity_field()  # bf16 parameters and gradients; None: fp32
    fused_projections: bool | None = identity_field()  # one QKV and one w1/w3 matmul; None: off
    target_iqr_pct: float | None = identity_field()  # measured until IQR/median <= this; None: measure_steps


IDENTITY_FIELDS = tuple(f.name for f in dataclasses.fields(BenchmarkIdentity))
MODEL_SHAPE_FIELDS = tuple(f.name for f in dataclasses.fields(ModelShape))
# Settings that change how a result is computed or reported, not what is measured.
NOT_IDENTITY = ("model", "peak", "peak_tflops", "profile_step", "max_measure_s")
PARAM_DTYPES = ("fp32", "bf16")  # --param-dtype: what the model's parameters and gradients are stored in


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
    grad_accum_steps: int = 1  # forward-backward micro-batches (of batch_size each) per step
    param_dtype: str = "fp32"  # PARAM_DTYPES; bf16: parameters and gradients in bf16, fp32 master weights
    target_iqr_pct: float | None = None  # measure until IQR/median is at most this (at least measure_steps)
    max_measure_s: float = 60.0  # ...and stop there, resolved or not (timing.time_steps)

    def __post_init__(self) -> None:
        check_benchmark_config(self)

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.context_length * self.grad_accum_steps

    @property
    def attention(self) -> str:
        """The built-in model's attention; a --model-factory model's is not ours to know."""
        return self.model.attention if self.model_factory is None else "n/a"

    def replace(self, **changes) -> BenchmarkConfig:
        return dataclasses.replace(self, **changes)

    def shape(self) -> dict[str, object]:
        """The model-shape columns (ModelShape) of this configuration."""
        return {name: self._column(name) for name in MODEL_SHAPE_FIELDS}

    def identity(self) -> dict[str, object]:
        """The identifying columns (BenchmarkIdentity) as a record of this configuration holds them."""
        return {name: self._column(name) for name in IDENTITY_FIELDS}

    def _column(self, name: str) -> object:
        if name == "model_size":
            return self.model.size_name
        if name in ("compile_scope", "compile_mode") and not self.compile:
            return None
        if name == "optimizer_factory" and self.pass_type != "train-step":
            return None
        if name == "grad_accum_steps":
            return self.grad_accum_steps if self.grad_accum_steps > 1 else None
        if name == "param_dtype":
            return self.param_dtype if self.param_dtype != "fp32" else None
        if name == "fused_projections":
            return True if self.model.fused_projections else None
        return getattr(self, name) if hasattr(self, name) else getattr(self.model, name)

    def fast_path(self) -> str | None:
        """The fast-path flags this configuration uses, as a user would type them, or None."""
        return fast_path_flags(self.identity())

    def key(self) -> tuple[str, ...]:
        return row_key(self.identity(), IDENTITY_FIELDS)

    def to_dict(self) -> dict[str, object]:
        """Plain data (JSON), read back by from_dict: how a child process gets its configuration."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> BenchmarkConfig:
        """The configuration `to_dict` gave; ConfigError (one line) on anything else."""
        if not isinstance(data, Mapping) or not isinstance(data.get("model"), Mapping):
            raise ConfigError("a configuration is a JSON object holding a 'model' object")
        unknown = sorted(set(data) - _names(cls)) + [
            f"model.{k}" for k in sorted(set(data["model"]) - _names(ModelConfig))
        ]
        if unknown:
            raise ConfigError(f"unknown configuration field(s): {', '.join(unknown)}")
        try:
            model = ModelConfig(**data["model"])
            return cls(**{**data, "model": model})
        except TypeError as exc:  # a required field missing
            raise ConfigError(f"incomplete configuration: {exc}") from None


# What each setting may hold (the same choices as its flag); contradictions are checked after these.
CHOICES = {
    "pass_type": PASS_TYPES,
    "precision": PRECISIONS,
    "compile_scope": COMPILE_SCOPES,
    "compile_mode": COMPILE_MODES,
    "timer": TIMERS,
    "peak": PEAK_CHOICES,
    "param_dtype": PARAM_DTYPES,
}
POSITIVE = ("context_length", "batch_size", "measure_steps", "grad_accum_steps")
NON_NEGATIVE = ("warmup_steps",)
SWITCHES = ("compile", "cuda_graphs", "profile_step")
CALLABLES = {"model_factory": "--model-factory", "optimizer_factory": "--optimizer"}


def check_benchmark_config(config: BenchmarkConfig) -> None:
    """A configuration refuses itself (ConfigError, one line) on a value its flag would refuse and on a
    contradiction between settings: flags, grids, --config files and planners get one validator."""
    if not isinstance(config.model, ModelConfig):
        raise ConfigError(f"model must be a ModelConfig, got {type(config.model).__name__}")
    for name, allowed in CHOICES.items():
        if getattr(config, name) not in allowed:
            raise ConfigError(f"{name} must be one of {', '.join(allowed)}; got {getattr(config, name)!r}")
    for name in (*POSITIVE, *NON_NEGATIVE, "seed"):
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or abs(value) > MAX_INT:
            raise ConfigError(f"{name} must be an integer of at most 2**40, got {value!r}")
        if value < (1 if name in POSITIVE else 0 if name in NON_NEGATIVE else -MAX_INT):
            raise ConfigError(f"{name} must be {'positive' if name in POSITIVE else 'zero or more'}, got {value}")
        if name in ("warmup_steps", "measure_steps") and value > MAX_STEPS:  # the bound of their flags (argtypes)
            raise ConfigError(f"{name} must be at most {MAX_STEPS:,}, got {value}")
    for name in SWITCHES:
        if not isinstance(getattr(config, name), bool):
            raise ConfigError(f"{name} must be true or false, got {getattr(config, name)!r}")
    for name in ("target_iqr_pct", "max_measure_s"):
        value = getattr(config, name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf
        ):
            raise ConfigError(f"{name} must be a positive number, got {value!r}")
    if config.peak_tflops is not None and (
        isinstance(config.peak_tflops, bool)
        or not isinstance(config.peak_tflops, int | float)
        or not 0 < config.peak_tflops < math.inf
    ):
        raise ConfigError(f"peak_tflops must be a positive number of TFLOP/s, got {config.peak_tflops!r}")
    if not isinstance(config.device, str) or not config.device.strip():
        raise ConfigError(f"device must name a device (auto, cpu, cuda or cuda:N), got {config.device!r}")
    for name, flag in CALLABLES.items():
        spec = getattr(config, name)
        if spec is not None and (not isinstance(spec, str) or ":" not in spec):
            raise ConfigError(f"{flag} must look like package.module:callable, got {spec!r}")
    # contradictions
    config.model.check_context(config.context_length)
    if config.param_dtype != "fp32" and config.precision != config.param_dtype:
        raise ConfigError(
            f"--param-dtype {config.param_dtype} runs under --precision {config.param_dtype} "
            f"(autocast keeps softmax and the loss in fp32); got --precision {config.precision}"
        )
    if config.cuda_graphs and (reason := cuda_graphs_refusal(config)):
        raise ConfigError(reason)
    if config.model_factory and config.model.fused_projections:
        raise ConfigError("--fused-projections changes the built-in model's projections; not a --model-factory model's")


def _names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


GRAPH_COMPILE_MODES = ("reduce-overhead", "max-autotune")  # these capture CUDA graphs themselves


def cuda_graphs_refusal(config: BenchmarkConfig) -> str | None:
    """Why --cuda-graphs (cuda_graphs.py) cannot capture this configuration, whatever the device
    (one line), or None."""
    if config.optimizer_factory is not None:
        return "--cuda-graphs captures torch's fused AdamW (capturable=True); it cannot capture --optimizer: drop one"
    if config.precision == "fp16":
        return "--cuda-graphs does not support fp16: GradScaler reads its inf check on the host, which capture forbids"
    if config.compile and config.compile_mode in GRAPH_COMPILE_MODES:
        return (
            f"--cuda-graphs with --compile-mode {config.compile_mode}: that mode captures CUDA graphs itself; pick one"
        )
    if config.grad_accum_steps > 1 or config.param_dtype != "fp32":
        return (
            "--cuda-graphs captures a one-batch step of fp32 parameters: not with --grad-accum-steps or --param-dtype"
        )
    return None
