"""python -m cs336_systems.attention_bench: attention alone, forward, backward and both, per shape,
each row checked against the fp32 naive attention.

    python -m cs336_systems.attention_bench --head-dims 16 32 64 128 \\
        --context-lengths 256 1024 4096 8192 16384 --implementations naive sdpa compiled \\
        --output results/attention.csv --output results/attention.md
    # the student's FlashAttention-2 from their official adapters module, on Triton's do_bench:
    python -m cs336_systems.attention_bench --adapters tests/adapters.py --timer do-bench \\
        --implementations flash-pytorch flash-triton sdpa --precisions bf16 fp32

Causal attention (--no-causal: unmasked), batch 1 and one head by default as in the handout:
q, k, v of shape (batch, heads, seq, d), or (batch, seq, d) with --layout bsd, as the official
tests call the adapters; all requiring grad.
  naive          the handout's attention: scores, causal mask, softmax, weighted sum
  sdpa           F.scaled_dot_product_attention(is_causal=...)
  compiled       torch.compile(naive); the first forward and backward calls (where the two
                 graphs are compiled) are timed apart as compile_s
  flash-pytorch  get_flashattention_autograd_function_pytorch() of --adapters, called as
  flash-triton   Fn.apply(q, k, v, is_causal) (the _triton one); an adapter that raises
                 NotImplementedError gives a 'skipped' row
  pkg.mod:fn     any callable f(q, k, v, is_causal), or an autograd.Function class

One row per (precision, head dim, seq len, implementation):
  check           once, outside the timed loop: the untimed forward's output and its gradients
                  against fp32 naive attention on the same inputs (correctness.py): max_abs_err_out,
                  max_abs_err_grad (largest of dq, dk, dv); status 'wrong' above the tolerance of
                  config.TOLERANCES (a wrong shape or a non-tensor output too)
  forward_*_ms    forward passes with autograd recording (as in training), each timed alone;
                  the output and its graph are freed between steps, outside the clock
  backward_*_ms   backward against a fixed random output gradient, each after an untimed
                  fresh forward
  end_to_end_*_ms forward and backward together in one timed step
  timer_used      --timer do-bench runs triton.testing.do_bench where it can (dobench.py)
  memory_before_backward_bytes  memory in use after a forward, before its backward, counted
                  from just before the inputs were made (CUDA: allocator bytes; CPU: RSS growth)
  saved_for_backward_bytes      distinct storages autograd saved (q, k, v included): exact
  forward_flops   matmuls only, 4*B*H*T^2*d (QK^T and PV over the full T x T square, the
                  convention of flops.py); backward_flops = 2x forward
An out-of-memory error is a row with status 'oom' (what was measured before it is kept) and
the sweep goes on; so is any other failure of an implementation ('error'). A plot (time vs
sequence length, one panel per head dim) is saved beside the outputs.

  config.py           AttentionConfig, implementations, tolerances
  implementations.py  the functions timed: built-in, from the adapters, or a user's callable
  correctness.py      the fp32 reference (chunked, so it fits wherever the inputs fit) and the check
  dobench.py          --timer do-bench: Triton's do_bench or the fallback
  record.py           the row: AttentionRecord and its Markdown view
  measure.py          run_attention: inputs, the check, the timed passes, memory, what autograd saves
  figure.py           time against sequence length, out-of-memory points marked
  cli.py              the flags and main
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
