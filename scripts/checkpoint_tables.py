"""The 2026 handout's memory_profiling and gradient_checkpointing tables, for any size.

    # CPU, a small custom shape (results/checkpoint_tables_cpu.{csv,md}):
    python scripts/checkpoint_tables.py
    # GPU, the handout's sizes (xl of the 2026 table = d_model 2560, 32 layers):
    python scripts/checkpoint_tables.py --device cuda --size-table 2026 --model-size xl \
        --context-lengths 128 256 512 --checkpoint-blocks 0 1 2 4 sqrt all --checkpoint-context 512

Table 1 (memory_profiling): peak memory of a forward pass and of a full training step
per context length, fp32 and bf16. Table 2 (gradient_checkpointing): peak of a training
step per --checkpoint-blocks, with the estimator's prediction beside each measurement.
CPU peaks are RSS high-water marks above the RSS before the model was built, with glibc
pinned to return freed memory (cs336_systems.memory.pin_mmap_threshold); GPU peaks are the
caching allocator's max allocated.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
from tabulate import tabulate

from cs336_bench.argtypes import ArgumentParser, positive_int
from cs336_bench.benchmark_flags import checkpoint_blocks
from cs336_bench.config import BenchmarkConfig
from cs336_bench.device import resolve_device
from cs336_bench.memory import pin_mmap_threshold
from cs336_bench.models import ModelConfig
from cs336_bench.results import collect_environment
from cs336_bench.results.markdown import write_page
from cs336_bench.runner import run_benchmark

RESULTS = Path(__file__).resolve().parent.parent / "results"
MIB = 2**20
CPU_SHAPE = dict(d_model=256, d_ff=704, num_layers=8, num_heads=4, vocab_size=512)


def measure(model: ModelConfig, context: int, batch: int, pass_type: str, precision: str, device) -> dict:
    config = BenchmarkConfig(
        model=model.replace(context_length=context),
        context_length=context,
        batch_size=batch,
        pass_type=pass_type,
        precision=precision,
        warmup_steps=1,
        measure_steps=2,
        device=str(device),
        peak_tflops=1.0,
    )
    record = run_benchmark(config)
    ok = record.status == "ok"
    return dict(
        context_length=context,
        pass_type=pass_type,
        precision=precision,
        checkpoint_blocks=model.checkpoint_blocks or 0,
        checkpoint_group_size=model.checkpoint_group_size,
        status=record.status,
        peak_mib=record.peak_memory_bytes / MIB if ok else None,
        predicted_mib=record.predicted_memory_bytes / MIB if record.predicted_memory_bytes else None,
        mean_ms=record.mean_ms if ok else None,
    )


def main() -> int:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--size-table", default="2026")
    parser.add_argument("--model-size", help="a named size (default on CPU: a small custom shape)")
    parser.add_argument("--context-lengths", "--contexts", nargs="+", type=positive_int, default=[64, 128, 256])
    parser.add_argument("--batch-size", type=positive_int, default=4)
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    parser.add_argument("--checkpoint-blocks", nargs="+", type=checkpoint_blocks, default=[None, 1, 2, "sqrt", "all"])
    parser.add_argument("--checkpoint-context", type=positive_int, help="context of table 2 (default: the longest)")
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    device = resolve_device(args.device)
    if device.type == "cpu":
        pin_mmap_threshold()
    if args.model_size:
        model = ModelConfig.from_size(args.model_size, args.size_table, context_length=max(args.context_lengths))
        label = f"{args.size_table} {model.size_name}"
    else:
        model = ModelConfig(**CPU_SHAPE, context_length=max(args.context_lengths))
        label = "custom " + " ".join(f"{k}={v}" for k, v in CPU_SHAPE.items())

    profiling = [
        measure(model, t, args.batch_size, p, precision, device)
        for precision in args.precisions
        for t in args.context_lengths
        for p in ("forward", "train-step")
    ]
    context = args.checkpoint_context or max(args.context_lengths)
    checkpointing = [
        measure(model.replace(checkpoint_blocks=k), context, args.batch_size, "train-step", "fp32", device)
        for k in args.checkpoint_blocks
    ]

    stem = args.output_dir / f"checkpoint_tables_{device.type}"
    args.output_dir.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame([*profiling, *checkpointing])
    frame.insert(0, "table", ["memory_profiling"] * len(profiling) + ["gradient_checkpointing"] * len(checkpointing))
    frame.insert(1, "model", label)
    frame.to_csv(stem.with_suffix(".csv"), index=False)
    wide = pd.DataFrame(profiling).pivot_table(
        index="context_length", columns=["precision", "pass_type"], values="peak_mib"
    )
    wide.columns = [f"{precision} {pass_type} peak MiB" for precision, pass_type in wide.columns]
    command = "python " + " ".join(["scripts/checkpoint_tables.py", *sys.argv[1:]])
    env = collect_environment(device)
    text = write_page(
        stem.with_suffix(".md"),
        title=f"Memory per context and per checkpoint block size ({device.type})",
        command=command,
        body=[
            f"Model: {label}, batch {args.batch_size}, {model.num_layers} layers.",
            "",
            "## memory_profiling: forward vs training step, peak per context",
            "",
            tabulate(wide.reset_index(), headers="keys", tablefmt="github", showindex=False, floatfmt=".1f"),
            "",
            f"## gradient_checkpointing: training step peak per --checkpoint-blocks (fp32, context {context})",
            "",
            tabulate(
                pd.DataFrame(checkpointing)[
                    ["checkpoint_blocks", "checkpoint_group_size", "status", "peak_mib", "predicted_mib", "mean_ms"]
                ],
                headers="keys",
                tablefmt="github",
                showindex=False,
                floatfmt=".1f",
            ),
            "",
            "checkpoint_blocks 0 is off; the step time includes the recomputed forward of every block.",
        ],
        environment=[env.__dict__],
    )
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
