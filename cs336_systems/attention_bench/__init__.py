"""python -m cs336_systems.attention_bench: attention alone, forward and backward, per shape.

    python -m cs336_systems.attention_bench --head-dims 16 32 64 128 \\
        --context-lengths 256 1024 4096 8192 16384 --batch-size 8 --measure-steps 100 \\
        --implementations naive sdpa compiled --output results/attention.csv --output results/attention.md

Single-head causal attention as in the handout: q, k, v of shape (batch, 1, seq, head_dim)
requiring grad (the head axis of 1 lets SDPA use its fused kernels, which want 4-D inputs).
  naive     models.naive_causal_attention: scores, causal mask, softmax, weighted sum
  sdpa      models.sdpa_causal_attention: F.scaled_dot_product_attention(is_causal=True)
  compiled  torch.compile(naive); the first forward and backward calls (where the two
            graphs are compiled) are timed apart as compile_s

One row per (head dim, seq len, implementation):
  forward_*_ms    forward passes with autograd recording (as in training), each timed alone;
                  the output and its graph are freed between steps, outside the clock
  backward_*_ms   backward against a fixed random output gradient, each after an untimed
                  fresh forward
  memory_before_backward_bytes  memory in use after a forward, before its backward, counted
                  from just before the inputs were made (CUDA: allocator bytes; CPU: RSS growth)
  saved_for_backward_bytes      distinct storages autograd saved (q, k, v included): exact
  forward_flops   matmuls only, 4*B*T^2*d (QK^T and PV over the full T x T square, the
                  convention of flops.py); backward_flops = 2x forward
An out-of-memory error is a row with status 'oom' (what was measured before it is kept) and
the sweep goes on. A plot (time vs sequence length, one panel per head dim) is saved beside
the outputs.

  config.py   AttentionConfig: one shape and implementation
  record.py   the row: AttentionRecord and its Markdown view
  measure.py  run_attention: inputs, the timed passes, memory, what autograd saves
  figure.py   time against sequence length, out-of-memory points marked
  cli.py      the flags and main
"""

from cs336_systems.attention_bench.cli import build_parser, configs_from_args, main
from cs336_systems.attention_bench.config import IMPLEMENTATIONS, PASSES, TENSOR_DTYPES, AttentionConfig
from cs336_systems.attention_bench.figure import draw, plot
from cs336_systems.attention_bench.measure import attention_function, run_attention, saved_tensor_bytes
from cs336_systems.attention_bench.record import ATTENTION_FIELDS, AttentionRecord

__all__ = [
    "ATTENTION_FIELDS",
    "IMPLEMENTATIONS",
    "PASSES",
    "TENSOR_DTYPES",
    "AttentionConfig",
    "AttentionRecord",
    "attention_function",
    "build_parser",
    "configs_from_args",
    "main",
    "draw",
    "plot",
    "run_attention",
    "saved_tensor_bytes",
]
