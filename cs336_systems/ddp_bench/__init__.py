"""python -m cs336_systems.ddp_bench: our training step under data parallelism, and what it scales to.

  strategies.py  how each strategy wraps the model, builds the optimizer and syncs gradients
  accounting.py  bytes of parameters / gradients / optimizer state per rank, and their prediction
  trainer.py     one rank's step under a strategy: the correctness check, memory and timing
  record.py      the row: DdpRecord, learning-rate scaling, efficiency, its Markdown view
  cli.py         the flags and main (the launch and row loop are cs336_systems.distributed.driver's)

The strategies, the check and every column (comm_ms, scaling_efficiency, compute_slowdown, ...):
docs/distributed.md; the flags: --help.
"""

from .cli import build_parser, main, units_for
from .record import (
    DdpRecord,
    attach_baseline,
    record_for,
    scaled_learning_rates,
    scaling_efficiency,
)
from .strategies import STRATEGIES
from .trainer import DdpUnit, Trainer, ddp_worker, reference_step, time_interleaved

__all__ = [
    "STRATEGIES",
    "DdpRecord",
    "DdpUnit",
    "Trainer",
    "attach_baseline",
    "build_parser",
    "ddp_worker",
    "main",
    "record_for",
    "reference_step",
    "scaled_learning_rates",
    "scaling_efficiency",
    "time_interleaved",
    "units_for",
]
