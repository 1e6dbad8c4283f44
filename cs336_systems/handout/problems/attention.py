"""The handout's attention problems: PyTorch attention, torch.compile, your FlashAttention-2, the leaderboard."""

from __future__ import annotations

from ...tools import module_name
from ..parameters import Options
from ..plan import Step
from ..target import Target
from .model import sizes, sweep


def _attention_step(options: Options, target: Target, name: str, problem: str, part: str, flags: dict) -> Step:
    flags = {
        **flags,
        "--device": options.device,
        "--output": [f"{name}.csv", f"{name}.jsonl", f"{name}.md"],
        "--plot": f"{name}.png",
    }
    return Step(name, problem, part, module_name("attention_bench"), flags, kind="attention", reads=(f"{name}.csv",))


def pytorch_attention(options: Options, target: Target) -> list[Step]:
    scale = options.scale
    step = _attention_step(
        options,
        target,
        "pytorch_attention",
        "pytorch_attention",
        f"naive attention, batch {scale.attention_batch}, one head, forward and backward",
        {
            "--implementations": ["naive"],
            "--batch-size": scale.attention_batch,
            "--head-dims": list(scale.attention_head_dims),
            "--context-lengths": list(scale.attention_contexts),
            "--warmup-steps": 5,
            "--measure-steps": scale.attention_measure,
        },
    )
    step.reason = (
        "runs every shape, those predicted not to fit too: the handout asks where attention runs "
        "out of memory, and attention_bench records an out-of-memory as an oom row"
    )
    return [step]


def torch_compile(options: Options, target: Target) -> list[Step]:
    scale = options.scale
    attention = _attention_step(
        options,
        target,
        "torch_compile-attention",
        "torch_compile",
        "(a) torch.compile'd attention on the pytorch_attention grid",
        {
            "--implementations": ["compiled"],
            "--batch-size": scale.attention_batch,
            "--head-dims": list(scale.attention_head_dims),
            "--context-lengths": list(scale.attention_contexts),
            "--warmup-steps": 5,
            "--measure-steps": scale.attention_measure,
        },
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
    step = _attention_step(
        options,
        target,
        "flash_benchmarking",
        "flash_benchmarking",
        f"your FlashAttention-2 ({implementations[1]}) against PyTorch attention, batch 1, causal",
        {
            "--implementations": implementations,
            "--adapters": options.adapters,
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


def leaderboard(options: Options, target: Target) -> list[Step]:
    batch_heads, sequence, head_dim = options.scale.leaderboard
    step = _attention_step(
        options,
        target,
        "leaderboard",
        "leaderboard",
        f"FlashAttention-2 forward + backward, {batch_heads} heads x {head_dim}, sequence {sequence}, "
        "bf16, causal, do_bench",
        {
            "--implementations": ["flash-triton"],
            "--adapters": options.adapters,
            "--layout": "bsd",
            "--batch-size": batch_heads,
            "--head-dims": [head_dim],
            "--context-lengths": [sequence],
            "--precisions": ["bf16"],
            "--timer": "do-bench",
            "--warmup-steps": 5,
            "--measure-steps": options.scale.attention_measure,
        },
    )
    if not options.adapters:
        step.skip("needs your Triton FlashAttention-2: --adapters tests/adapters.py")
    elif target.type != "cuda" or not target.triton:
        step.skip("the leaderboard times the Triton kernel on a GPU: needs CUDA and Triton")
    return [step]
