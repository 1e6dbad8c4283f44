"""python -m cs336_systems.attention_bench: attention alone, forward, backward and both, per shape,
each row checked against the fp32 naive attention.

  config.py           AttentionConfig, implementations, tolerances
  implementations.py  the functions timed: built-in, from the adapters, or a user's callable
  correctness.py      the fp32 reference (chunked, so it fits wherever the inputs fit) and the check
  dobench.py          --timer do-bench: Triton's do_bench or the fallback
  record.py           the row: AttentionRecord and its Markdown view
  measure.py          run_attention: inputs, the check, the timed passes, memory, what autograd saves
  figure.py           time against sequence length, out-of-memory points marked
  names.py            the names the flags choose from (torch-free)
  grid.py             the configurations the flags ask for
  cli.py              the flags and main (read before torch is imported)
  run.py              the grid's rows: measured, written, shown

What each row holds and how it is checked: docs/attention.md; the flags: --help.
"""

import importlib

# Each name from the module that defines it, imported on first use: `python -m ...attention_bench` reads
# its flags before torch is imported.
_HOMES = {
    "build_parser": "cli",
    "configs_from_args": "cli",
    "main": "cli",
    "IMPLEMENTATIONS": "config",
    "PASSES": "config",
    "TENSOR_DTYPES": "config",
    "TOLERANCES": "config",
    "AttentionConfig": "config",
    "check": "correctness",
    "reference": "correctness",
    "draw": "figure",
    "plot": "figure",
    "attention_for": "implementations",
    "attention_function": "implementations",
    "run_attention": "measure",
    "saved_tensor_bytes": "measure",
    "ATTENTION_FIELDS": "record",
    "AttentionRecord": "record",
}


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)


__all__ = sorted(_HOMES)
