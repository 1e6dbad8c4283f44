"""attention_bench's grid: the implementations asked for, and every configuration of the flags
(torch-free to import: AttentionConfig is imported when a grid is made)."""

from __future__ import annotations

from .names import BUILTIN_IMPLEMENTATIONS, FLASH_IMPLEMENTATIONS


def default_implementations(adapters: str | None) -> list[str]:
    return list(BUILTIN_IMPLEMENTATIONS) + (list(FLASH_IMPLEMENTATIONS) if adapters else [])


def configs_from_args(args, device) -> list:
    """Every configuration of the grid (AttentionConfig): the flags that set one field for all of them,
    then per configuration the grid's values, the resolved device and the flash-only adapters."""
    from .config import AttentionConfig

    implementations = args.implementations or default_implementations(args.adapters)
    flags = dict(
        batch_size=args.batch_size,
        num_heads=args.num_heads,
        layout=args.layout,
        causal=args.causal,
        timer=args.timer,
        warmup_steps=args.warmup_steps,
        measure_steps=args.measure_steps,
        max_seconds=args.max_seconds,
        seed=args.seed,
    )
    return [
        AttentionConfig(
            **{
                **flags,
                "implementation": implementation,
                "head_dim": head_dim,
                "context_length": context_length,
                "precision": precision,
                "device": str(device),
                "adapters": args.adapters if implementation in FLASH_IMPLEMENTATIONS else None,
            }
        )
        for precision in args.precisions
        for head_dim in args.head_dims
        for context_length in args.context_lengths
        for implementation in implementations
    ]
