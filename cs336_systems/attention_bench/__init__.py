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

from .cli import build_parser, configs_from_args, main
from .config import (
    IMPLEMENTATIONS,
    PASSES,
    TENSOR_DTYPES,
    TOLERANCES,
    AttentionConfig,
)
from .correctness import check, reference
from .figure import draw, plot
from .implementations import attention_for, attention_function
from .measure import run_attention, saved_tensor_bytes
from .record import ATTENTION_FIELDS, AttentionRecord

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
