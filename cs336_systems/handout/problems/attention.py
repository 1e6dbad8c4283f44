"""The handout's attention problems: PyTorch attention, torch.compile, your FlashAttention-2."""

from __future__ import annotations

from ...tools import module_name
from ..parameters import Options
from ..plan import Step
from ..target import Target
from .model import sizes, sweep


def attention_step(options: Options, name: str, problem: str, part: str, flags: dict) -> Step:
    """One attention_bench run: its rows (CSV, JSONL, Markdown) and its plot."""
    flags = {
        **flags,
        "--device": options.device,
        "--output": [f"{name}.csv", f"{name}.jsonl", f"{name}.md"],
        "--plot": f"{name}.png",
    }
    return Step(
        name,
        problem,
        part,
        module_name("attention_bench"),
        flags,
        kind="attention",
        reads=(f"{name}.csv",),
        figures=(f"{name}.png",),
    )


def pytorch_attention_grid(options: Options, implementation: str) -> dict:
    """attention_bench's flags for pytorch_attention's grid of shapes, run by `implementation`."""
    scale = options.scale
    return {
        "--implementations": [implementation],
        "--batch-size": scale.attention_batch,
        "--head-dims": list(scale.attention_head_dims),
        "--context-lengths": list(scale.attention_contexts),
        "--warmup-steps": 5,
        "--measure-steps": scale.attention_measure,
    }


def pytorch_attention(options: Options, target: Target) -> list[Step]:
    step = attention_step(
        options,
        "pytorch_attention",
        "pytorch_attention",
        f"(a) naive attention, batch {options.scale.attention_batch}, one head, forward and backward",
        pytorch_attention_grid(options, "naive"),
    )
    step.reason = (
        "runs every shape, those predicted not to fit too: the handout asks where attention runs "
        "out of memory, and attention_bench records an out-of-memory as an oom row"
    )
    return [step]


def torch_compile(options: Options, target: Target) -> list[Step]:
    scale = options.scale
    attention = attention_step(
        options,
        "torch_compile-attention",
        "torch_compile",
        "(a) torch.compile'd attention on the pytorch_attention grid",
        pytorch_attention_grid(options, "compiled"),
    )
    attention.reason = "runs every shape (out-of-memory is a row, as in pytorch_attention)"
    steps = [attention]
    for size in sizes(options):
        steps += sweep(
            options,
            target,
            "torch_compile",
            "b",
            "(b) compiled model",
            size,
            {
                "--context-lengths": [scale.timing_context],
                "--pass-types": ["forward", "train-step"],
                "--precisions": ["fp32"],
                "--compile": "both",
            },
        )
    return steps


def flash_benchmarking(options: Options, target: Target) -> list[Step]:
    scale = options.scale
    implementations = ["naive", "flash-triton" if target.type == "cuda" else "flash-pytorch"]
    step = attention_step(
        options,
        "flash_benchmarking",
        "flash_benchmarking",
        f"(a) your FlashAttention-2 ({implementations[1]}) against PyTorch attention, batch 1, causal",
        {
            "--implementations": implementations,
            "--adapters": options.adapters or "tests/adapters.py",  # the command kept where it is skipped
            "--layout": "bsd",
            "--batch-size": 1,
            "--head-dims": list(scale.flash_head_dims),
            "--context-lengths": list(scale.flash_contexts),
            "--precisions": ["bf16", "fp32"],
            "--timer": "do-bench" if target.type == "cuda" else "host",
            "--warmup-steps": 5,
            "--measure-steps": scale.attention_measure,
        },
    )
    if not options.adapters:
        step.skip("needs your FlashAttention-2: --adapters tests/adapters.py")
    elif target.type != "cuda":
        step.reductions.append(
            "no GPU: your PyTorch FlashAttention-2 (flash-pytorch) instead of the Triton one, "
            "host timer instead of do_bench"
        )
    elif not target.triton:
        step.skip("flash-triton needs Triton, which is not installed")
    return [step]
