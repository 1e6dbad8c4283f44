"""How fast is the built-in model? MFU against the machine, and time against HuggingFace Llama.

    python scripts/checks/bench_model.py                  # CPU: writes results/checks/bench_model_cpu.{csv,md}
    python scripts/checks/bench_model.py --device cuda    # GPU: + small..2.7B bf16 train-step, compiled

CPU targets (this project's acceptance targets for the built-in model), forward-backward of d_model 1024, d_ff 2816, 4 layers, 16 heads,
context 256, batch 4, fp32:
  (a) MFU against the measured fp32 matmul probe on the same machine >= 0.6;
  (b) our step time / LlamaForCausalLM's (same shape: untied, SDPA, same parameter count) <= 1.0.
The two models are timed in alternating rounds so slow drift of the machine hits both.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import pandas as pd
from tabulate import tabulate

from cs336_bench.config import BenchmarkConfig
from cs336_bench.device import resolve_device
from cs336_bench.factory import build_model
from cs336_bench.flops import mfu
from cs336_bench.models import ModelConfig, count_parameters
from cs336_bench.results import ResultSink, collect_environment, read_results
from cs336_bench.results.markdown import write_page
from cs336_bench.results.records import timing_values
from cs336_bench.runner import run_benchmark
from cs336_bench.stats import summarize

RESULTS = Path(__file__).resolve().parents[2] / "results" / "checks"  # the harness checking itself
HF_LLAMA = "cs336_systems.hf_models:llama"
CPU_SHAPE = ModelConfig(d_model=1024, d_ff=2816, num_layers=4, num_heads=16, context_length=256)


def interleaved(configs: dict[str, BenchmarkConfig], models: dict, rounds: int) -> dict[str, dict]:
    """Alternate the configurations for `rounds` rounds; pool each one's measured steps."""
    pooled = {name: [] for name in configs}
    last = {}
    for _ in range(rounds):
        for name, config in configs.items():
            record = run_benchmark(config, model=models[name])
            if record.status != "ok":
                raise SystemExit(f"{name}: {record.status}: {record.error}")
            pooled[name] += record.step_ms
            last[name] = record
    out = {}
    for name, record in last.items():
        stats = summarize(pooled[name])
        achieved, utilisation = mfu(record.flops_per_step, stats.median, record.peak_tflops)  # on the median step
        out[name] = dict(
            model=name,
            num_params=record.num_params,
            steps=stats.n,
            **timing_values(stats),
            achieved_tflops=achieved,
            peak_tflops=record.peak_tflops,
            peak_source=record.peak_source,
            mfu=utilisation,
        )
    return out


def cpu_targets(device, rounds: int) -> list[dict]:
    base = BenchmarkConfig(
        model=CPU_SHAPE,
        context_length=256,
        batch_size=4,
        pass_type="forward-backward",
        precision="fp32",
        device=str(device),
        warmup_steps=2,
        measure_steps=3,
        peak="measure",
    )
    configs = {"cs336_systems": base, "transformers LlamaForCausalLM": base.replace(model_factory=HF_LLAMA)}
    models = {
        "cs336_systems": build_model(CPU_SHAPE, device),
        "transformers LlamaForCausalLM": build_model(CPU_SHAPE, device, HF_LLAMA),
    }
    counts = {name: count_parameters(model) for name, model in models.items()}
    if len(set(counts.values())) != 1:
        raise SystemExit(f"parameter counts differ: {counts}")
    results = interleaved(configs, models, rounds)
    ours, theirs = results["cs336_systems"], results["transformers LlamaForCausalLM"]
    ratio = ours["median_ms"] / theirs["median_ms"]
    return [
        dict(check="(a) MFU vs measured fp32 matmul probe", **ours, target=">= 0.6", passed=ours["mfu"] >= 0.6),
        dict(check="(b) reference: same step in transformers", **theirs, target="", passed=None),
        dict(
            check="(b) time ratio ours / transformers",
            model="ratio",
            median_ms=ratio,
            target="<= 1.0",
            passed=ratio <= 1.0,
        ),
    ]


def gpu_sizes(device, sizes: list[str], compile_scope: str, output: Path) -> pd.DataFrame:
    """bf16 train-step, context 512, batch 4, eager then compiled: the MFU the built-in model earns."""
    sink = ResultSink([output.with_suffix(".csv"), output.with_suffix(".md")])
    for size, compiled in itertools.product(sizes, (False, True)):
        config = BenchmarkConfig(
            model=ModelConfig.from_size(size, "2025", context_length=512),  # the 2025 table these checks were made with
            context_length=512,
            batch_size=4,
            pass_type="train-step",
            precision="bf16",
            compile=compiled,
            compile_scope=compile_scope,
            device=str(device),
            warmup_steps=5,
            measure_steps=10,
        )
        record = run_benchmark(config)
        sink.write(record)
        print(
            f"{size} compile={compiled}: {record.status} median {record.median_ms} ms mfu {record.mfu}",
            file=sys.stderr,
            flush=True,
        )
    return read_results(output.with_suffix(".csv"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--sizes", nargs="+", default=["small", "medium", "large", "xl", "2.7B"])
    parser.add_argument("--compile-scope", default="blocks", choices=["model", "blocks"])
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    device = resolve_device(args.device)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    env = collect_environment(device)
    failed = False

    if device.type == "cpu":
        rows = cpu_targets(device, args.rounds)
        frame = pd.DataFrame(rows)
        frame.to_csv(args.output_dir / "bench_model_cpu.csv", index=False)
        columns = ["check", "model", "num_params", "steps", "median_ms", "iqr_pct", "achieved_tflops", "mfu"]
        columns += ["peak_tflops", "peak_source", "target", "passed"]
        shape = "d_model 1024, d_ff 2816, 4 layers, 16 heads, context 256, batch 4, fp32, forward-backward"
        command = f"python scripts/checks/bench_model.py --rounds {args.rounds}"
        body = [f"Shape: {shape}.", ""]
        body.append(tabulate(frame[columns], headers="keys", tablefmt="github", showindex=False, floatfmt=".4g"))
        failed = bool(frame["passed"].eq(False).any())
    else:
        output = args.output_dir / f"bench_model_{device.type}"
        frame = gpu_sizes(device, args.sizes, args.compile_scope, output)
        columns = ["model_size", "num_params", "compile", "status", "median_ms", "iqr_pct", "achieved_tflops", "mfu"]
        columns += ["peak_tflops", "peak_source", "compile_s"]
        command = f"python scripts/checks/bench_model.py --device {args.device} --compile-scope {args.compile_scope}"
        body = [
            "bf16 autocast train-step (forward, backward, fused AdamW), context 512, batch 4, eager and "
            f"torch.compile (scope {args.compile_scope}).",
            "",
            tabulate(frame[columns], headers="keys", tablefmt="github", showindex=False, floatfmt=".4g"),
        ]
    text = write_page(
        args.output_dir / f"bench_model_{device.type}_summary.md",
        title=f"Built-in model speed ({device.type})",
        command=command,
        body=body,
        environment=[env.__dict__],
    )
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
