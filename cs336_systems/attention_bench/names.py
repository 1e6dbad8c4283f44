"""The names attention_bench's flags choose from, torch-free: its flags are read before torch is
imported, so a mistyped one is told at once."""

BUILTIN_IMPLEMENTATIONS = ("naive", "sdpa", "compiled")
# the student's FlashAttention-2 from --adapters: implementation name -> Adapters.flash_function kind
FLASH_IMPLEMENTATIONS = {"flash-pytorch": "pytorch", "flash-triton": "triton"}
IMPLEMENTATIONS = BUILTIN_IMPLEMENTATIONS + tuple(FLASH_IMPLEMENTATIONS)  # and any package.module:callable
PASSES = ("forward", "backward", "end_to_end")
LAYOUTS = ("bhsd", "bsd")  # (batch, heads, seq, d) as SDPA wants; (batch, seq, d) as the official tests call


def is_custom(implementation: str) -> bool:
    """A `package.module:callable` implementation, called as f(q, k, v, is_causal)."""
    return ":" in implementation
