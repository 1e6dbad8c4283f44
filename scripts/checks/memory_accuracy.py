"""Predicted vs measured peak memory, and the 16 GiB laptop verdicts.

    python scripts/checks/memory_accuracy.py                 # CPU: results/checks/memory_accuracy_cpu.{csv,md}
    python scripts/checks/memory_accuracy.py --device cuda   # GPU: small..xl x context 128..1024
    python scripts/checks/memory_accuracy.py --fast-path     # CPU, the fast-path flags: results/checks/memory_accuracy_cpu_fast_path.*

CPU: each configuration runs in a fresh process twice: with glibc returning freed memory
(MALLOC_MMAP_THRESHOLD_ pinned, so RSS tracks live tensors: the accuracy figure) and with
glibc's defaults (the RSS a training script would really see; the difference is memory
glibc keeps resident after tensors are freed). GPU: the caching allocator's max allocated.
Targets (the accuracy the estimator promises): within 15% on CPU above 1 GB, within 10% on GPU;
with activation checkpointing within 10% on CPU for K = 1, 2, sqrt, all; the fast path
(--grad-accum-steps, --param-dtype bf16, --fused-projections) within 10% on CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
from tabulate import tabulate

from cs336_bench.anomalies import fast_path_flags
from cs336_bench.config import BenchmarkConfig
from cs336_bench.device import release_memory, resolve_device
from cs336_bench.factory import build_model
from cs336_bench.memory import estimate_memory, pin_mmap_threshold
from cs336_bench.models import ModelConfig
from cs336_bench.results import collect_environment
from cs336_bench.results.markdown import write_page
from cs336_bench.runner import run_benchmark

RESULTS = Path(__file__).resolve().parents[2] / "results" / "checks"  # the harness checking itself
GIB = 2**30
CPU_CONFIGS = [
    # (label, model shape, batch, context, pass type, precision)
    ("small", dict(size="small"), 4, 256, "forward-backward", "fp32"),
    ("small", dict(size="small"), 4, 256, "train-step", "fp32"),
    ("small naive", dict(size="small", attention="naive"), 4, 256, "forward-backward", "fp32"),
    ("small", dict(size="small"), 4, 256, "train-step", "bf16"),
    ("d1024 L4", dict(d_model=1024, d_ff=2816, num_layers=4, num_heads=16), 8, 512, "forward-backward", "fp32"),
    ("d1024 L4", dict(d_model=1024, d_ff=2816, num_layers=4, num_heads=16), 8, 512, "train-step", "fp32"),
    # activation checkpointing (--checkpoint-blocks): off, K = 1, 2, sqrt (= 3 of 9 layers), all
    *[
        (
            f"d512 L9 ckpt {k}",
            dict(d_model=512, d_ff=1344, num_layers=9, num_heads=8, checkpoint_blocks=k),
            8,
            512,
            "forward-backward",
            "fp32",
        )
        for k in (None, 1, 2, "sqrt", "all")
    ],
    (
        "d512 L9 ckpt sqrt",
        dict(d_model=512, d_ff=1344, num_layers=9, num_heads=8, checkpoint_blocks="sqrt"),
        8,
        512,
        "train-step",
        "bf16",
    ),
]
D512 = dict(d_model=512, d_ff=1344, num_layers=4, num_heads=8)
# The fast path: (label, model shape, batch, context, pass type, precision, {grad_accum_steps, param_dtype})
FAST_PATH_CONFIGS = [
    ("d512 L4", D512, 4, 256, "train-step", "fp32", {}),
    ("d512 L4 accum 4", D512, 4, 256, "train-step", "fp32", dict(grad_accum_steps=4)),
    ("d512 L4 accum 2", D512, 4, 256, "forward-backward", "bf16", dict(grad_accum_steps=2)),
    ("d512 L4 bf16 params", D512, 4, 256, "forward-backward", "bf16", dict(param_dtype="bf16")),
    ("d512 L4 bf16 params", D512, 4, 256, "train-step", "bf16", dict(param_dtype="bf16")),
    ("d512 L4 fused", dict(D512, fused_projections=True), 4, 256, "train-step", "fp32", {}),
    ("d512 L4 fused", dict(D512, fused_projections=True), 4, 256, "forward-backward", "bf16", {}),
    (
        "d512 L4 all three",
        dict(D512, fused_projections=True),
        4,
        256,
        "train-step",
        "bf16",
        dict(grad_accum_steps=2, param_dtype="bf16"),
    ),
    (
        "small accum 2 bf16 params",
        dict(size="small"),
        2,
        256,
        "train-step",
        "bf16",
        dict(grad_accum_steps=2, param_dtype="bf16"),
    ),
]


def model_for(shape: dict, context: int) -> ModelConfig:
    shape = dict(shape)
    if "size" in shape:
        return ModelConfig.from_size(shape.pop("size"), "2025", context_length=context, **shape)
    return ModelConfig(**shape, context_length=context)


def child(spec: str) -> int:
    """Measure one configuration in this (fresh) process and print its row as JSON."""
    label, shape, batch, context, pass_type, precision, fast, pin = json.loads(spec)
    if pin:
        pin_mmap_threshold()
    config = BenchmarkConfig(
        model=model_for(shape, context),
        context_length=context,
        batch_size=batch,
        pass_type=pass_type,
        precision=precision,
        warmup_steps=1,
        measure_steps=2,
        peak_tflops=1.0,
        device="cpu",
        **fast,
    )
    print(json.dumps(run_benchmark(config).to_row(), default=str))
    return 0


def cpu_rows(configs, glibc_default: bool = True) -> list[dict]:
    rows = []
    for label, shape, batch, context, pass_type, precision, *fast in configs:
        measured = {}
        for pin in (True, False) if glibc_default else (True,):
            spec = json.dumps([label, shape, batch, context, pass_type, precision, fast[0] if fast else {}, pin])
            env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(os.cpu_count()))}
            out = subprocess.run(
                [sys.executable, __file__, "--child", spec], capture_output=True, text=True, env=env, check=True
            ).stdout
            measured[pin] = json.loads(out.strip().splitlines()[-1])
        row = measured[True]
        rows.append(_row(label, row, default_rss=measured[False]["peak_memory_bytes"] if glibc_default else None))
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def cuda_rows(device, sizes: list[str], contexts: list[int], pass_types: list[str], precision: str) -> list[dict]:
    rows = []
    for size in sizes:
        model_config = ModelConfig.from_size(size, "2025", context_length=max(contexts))
        model = build_model(model_config, device)
        for context in contexts:
            for pass_type in pass_types:
                config = BenchmarkConfig(
                    model=model_config,
                    context_length=context,
                    batch_size=4,
                    pass_type=pass_type,
                    precision=precision,
                    warmup_steps=1,
                    measure_steps=2,
                    device=str(device),
                )
                record = run_benchmark(config, model=model)
                rows.append(_row(size, record.to_row()))
                print(rows[-1], file=sys.stderr, flush=True)
        del model
        release_memory(device)
    return rows


def _row(label: str, row: dict, default_rss: int | None = None) -> dict:
    predicted, measured = row["predicted_memory_bytes"], row["peak_memory_bytes"]
    ok = row["status"] == "ok" and measured
    out = dict(
        model=label,
        context_length=row["context_length"],
        batch_size=row["batch_size"],
        pass_type=row["pass_type"],
        precision=row["precision"],
        attention=row["attention"],
        checkpoint_blocks=row.get("checkpoint_blocks"),
        **({"fast_path": fast_path_flags(row) or "off"} if "grad_accum_steps" in row else {}),
        status=row["status"],
        predicted_gib=predicted / GIB,
        measured_gib=measured / GIB if ok else None,
        error_pct=100 * (predicted - measured) / measured if ok else None,
        reserved_gib=row["peak_reserved_bytes"] / GIB if row.get("peak_reserved_bytes") else None,
    )
    if default_rss is not None:
        out["glibc_default_rss_gib"] = default_rss / GIB
        out["glibc_retention_pct"] = 100 * (default_rss - measured) / measured
    return out


def laptop_rows() -> list[dict]:
    """docs/reference.md section 3: RTX 4090 laptop, 16 GiB, fp32, context 512, batch 4, forward-backward."""
    rows = []
    for attention in ("naive", "sdpa"):
        for size in ("small", "medium", "large", "xl", "2.7B"):
            model = ModelConfig.from_size(size, "2025", context_length=512, attention=attention)
            e = estimate_memory(model, 4, 512, "forward-backward", "fp32", "cuda", device_memory_bytes=16 * GIB)
            rows.append(
                dict(
                    attention=attention,
                    model=size,
                    peak_gib=e.peak_bytes / GIB,
                    total_gib=e.total_bytes / GIB,
                    fits_16gib=e.fits,
                )
            )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sizes", nargs="+", default=["small", "medium", "large", "xl"])
    parser.add_argument("--contexts", nargs="+", type=int, default=[128, 256, 512, 1024])
    parser.add_argument("--pass-types", nargs="+", default=["forward-backward", "train-step"])
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    parser.add_argument("--fast-path", action="store_true", help="CPU: the fast-path rows only")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child)
    device = resolve_device(args.device)
    if device.type == "cuda":
        rows = cuda_rows(device, args.sizes, args.contexts, args.pass_types, args.precision)
        target, command = 10, f"python scripts/checks/memory_accuracy.py --device {args.device}"
    elif args.fast_path:
        rows = cpu_rows(FAST_PATH_CONFIGS, glibc_default=False)  # the accuracy figure only
        target, command = 10, "python scripts/checks/memory_accuracy.py --fast-path"
    else:
        rows = cpu_rows(CPU_CONFIGS)
        target, command = 15, "python scripts/checks/memory_accuracy.py"
    frame = pd.DataFrame(rows)
    frame["within_target"] = frame["error_pct"].abs() <= target
    stem = args.output_dir / f"memory_accuracy_{device.type}{'_fast_path' if args.fast_path else ''}"
    args.output_dir.mkdir(parents=True, exist_ok=True)
    frame.to_csv(stem.with_suffix(".csv"), index=False)
    laptop = pd.DataFrame(laptop_rows())
    env = collect_environment(device)
    text = write_page(
        stem.with_suffix(".md"),
        title=f"Memory: predicted vs measured peak ({device.type})",
        command=command,
        body=[
            tabulate(frame, headers="keys", tablefmt="github", showindex=False, floatfmt=".3f"),
            "",
            f"error_pct = (predicted - measured) / measured; target |error| <= {target}%. "
            f"Worst: {frame['error_pct'].abs().max():.1f}%.",
            "",
            "## The 16 GiB laptop (docs/reference.md section 3), by prediction",
            "",
            tabulate(laptop, headers="keys", tablefmt="github", showindex=False, floatfmt=".2f"),
        ],
        environment=[env.__dict__],
    )
    print(text)
    return 0 if frame["within_target"].all() else 1


if __name__ == "__main__":
    sys.exit(main())
