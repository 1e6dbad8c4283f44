"""python -m cs336_systems.attention_bench: attention alone, forward, backward and both, per shape,
each row checked against the fp32 naive attention.

  config.py           AttentionConfig, implementations, tolerances
  implementations.py  the functions timed: built-in, from the adapters, or a user's callable
  correctness.py      the fp32 reference (chunked, so it fits wherever the inputs fit) and the check
  dobench.py          --timer do-bench: Triton's do_bench or the fallback
  record.py           the row: AttentionRecord and its Markdown view
  measure.py          run_attention: inputs, the check, the timed passes, memory, what autograd saves
  figure.py           time against sequence length, out-of-memory points marked
  cli.py              the flags and main

What each row holds and how it is checked: docs/attention.md; the flags: --help.
"""

from cs336_systems.attention_bench.cli import build_parser, configs_from_args, main
from cs336_systems.attention_bench.config import (
    IMPLEMENTATIONS,
    PASSES,
    TENSOR_DTYPES,
    TOLERANCES,
    AttentionConfig,
)
from cs336_systems.attention_bench.correctness import check, reference
from cs336_systems.attention_bench.figure import draw, plot
from cs336_systems.attention_bench.implementations import attention_for, attention_function
from cs336_systems.attention_bench.measure import run_attention, saved_tensor_bytes
from cs336_systems.attention_bench.record import ATTENTION_FIELDS, AttentionRecord

__all__ = [
    "ATTENTION_FIELDS",
    "IMPLEMENTATIONS",
    "PASSES",
    "TENSOR_DTYPES",
    "TOLERANCES",
    "AttentionConfig",
    "AttentionRecord",
    "attention_for",
    "attention_function",
    "build_parser",
    "check",
    "configs_from_args",
    "main",
    "draw",
    "plot",
    "reference",
    "run_attention",
    "saved_tensor_bytes",
]
