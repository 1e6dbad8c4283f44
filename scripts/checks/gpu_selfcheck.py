"""Is this machine ready for the GPU paths? About a minute on one GPU; on a CPU it runs what it can.

    python scripts/checks/gpu_selfcheck.py                # writes results/checks/gpu_selfcheck_<device>.md
    python scripts/checks/gpu_selfcheck.py --output check.md --no-compile

Checks, each reported as ok, skipped (with why) or failed (with the error):
  versions           torch, CUDA, cuDNN, Triton, driver, nsys; the environment record of every row
  profiler events    the event kinds torch.profiler reports for a fused AdamW step and a compiled
                     region: kernels apart from user annotations (Optimizer.step#AdamW.step,
                     Torch-Compiled Region), which profiling.py must not count as device time
  graph capture      fused + capturable AdamW captured in a CUDA graph and replayed (parameters move,
                     loss finite), then the replay profiled: are its kernels traced after capture?
  sdpa backend       which scaled_dot_product_attention kernel runs at the built-in model's head size
  bf16 matmul        the measured bf16 matmul rate against the spec-sheet peak the MFU column uses
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from cs336_bench import cuda_graphs
from cs336_bench.device import compile_unsupported_reason, resolve_device
from cs336_bench.factory import build_model
from cs336_bench.flops import measure_peak_tflops, table_peak_tflops
from cs336_bench.models import ModelConfig
from cs336_bench.optimizer import make_optimizer
from cs336_bench.profiling import device_kernels, kineto_lines_dropped, profile_step
from cs336_bench.results import collect_environment
from cs336_bench.results.environment import ENVIRONMENT_FIELDS
from cs336_bench.results.markdown import environment_lines
from cs336_bench.results.writing import write_whole

RESULTS = Path(__file__).resolve().parents[2] / "results" / "checks"  # the harness checking itself
NSYS_PLACES = ("/usr/local/cuda/bin/nsys", "/opt/nvidia/nsight-systems", "/opt/nvidia/nsight-systems-cli")
# The built-in model's head size at the handout's sizes (d_model / num_heads = 64 for all but 10B's 128).
MATMUL_FLOOR = 0.5  # of the spec-sheet peak: a probe reading less measured its own set-up, not the GPU
CHECK_MODEL = dict(d_model=256, d_ff=512, num_layers=2, num_heads=4, vocab_size=1000, context_length=128)


class Skipped(Exception):
    """A check that cannot run here (no GPU, no compiler): reported, not failed."""


def check_versions(device: torch.device) -> list[str]:
    lines = [f"- torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}"]
    try:
        import triton

        lines.append(f"- Triton {triton.__version__}")
    except ImportError:
        lines.append("- Triton: not installed")
    try:
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        lines.append(f"- NVIDIA driver {driver.decode() if isinstance(driver, bytes) else driver}")
    except Exception as exc:  # no nvidia-ml-py, no driver
        lines.append(f"- NVIDIA driver: not read ({type(exc).__name__})")
    nsys = shutil.which("nsys") or next((p for p in NSYS_PLACES if Path(p).exists()), None)
    lines.append(f"- nsys: {nsys or 'not found (scripts/nsys_profile.sh will say so)'}")
    env = collect_environment(device)
    lines += [
        "",
        "Environment record (as every result row holds it):",
        "",
        *environment_lines([{name: getattr(env, name) for name in ENVIRONMENT_FIELDS}]),
    ]
    return lines


def _kinds(events) -> Counter:
    kinds = Counter()
    for e in events:
        side = "device" if e.device_type == DeviceType.CUDA else "host"
        kinds[f"{side} {'user annotation' if e.is_user_annotation else 'op/kernel'}"] += 1
    return kinds


def _profile(fn, device: torch.device):
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    with kineto_lines_dropped():
        prof = profile(activities=activities)
        prof.start()
    fn()
    sync()
    with kineto_lines_dropped():
        prof.stop()
    return prof.events()


def _describe_events(title: str, events) -> list[str]:
    kinds = _kinds(events)
    device_annotations = sorted({e.name for e in events if e.device_type == DeviceType.CUDA and e.is_user_annotation})
    host_annotations = sorted({e.name for e in events if e.device_type == DeviceType.CPU and e.is_user_annotation})
    cuda = [e for e in events if e.device_type == DeviceType.CUDA]
    zero = sum(1 for e in cuda if e.time_range.start <= 0 or e.time_range.end < e.time_range.start)
    lines = [f"{title}: " + ", ".join(f"{kind} {count}" for kind, count in sorted(kinds.items()))]
    lines.append(f"  host annotations: {', '.join(host_annotations[:6]) or 'none'}")
    if cuda:
        lines.append(f"  device annotations (not kernels): {', '.join(device_annotations[:6]) or 'none'}")
        lines.append(
            f"  device events {len(cuda)}, of which kernels counted by profiling.py {len(device_kernels(events))}, "
            f"with zero or reversed timestamps {zero}"
        )
    return lines


def check_profiler(device: torch.device, compile_too: bool) -> list[str]:
    model = build_model(ModelConfig(**CHECK_MODEL), device)
    optimizer = make_optimizer(model, device)  # fused AdamW
    tokens = torch.randint(0, CHECK_MODEL["vocab_size"], (2, 64), device=device)

    def train_step():
        optimizer.zero_grad(set_to_none=True)
        model(tokens).float().logsumexp(-1).mean().backward()
        optimizer.step()

    train_step()  # AdamW state created outside the profile
    lines = _describe_events("fused AdamW train step", _profile(train_step, device))
    if not compile_too:
        return lines + ["compiled region: skipped (--no-compile)"]
    reason = compile_unsupported_reason(device)
    if reason:
        return lines + [f"compiled region: skipped ({reason})"]
    compiled = torch.compile(lambda x: F.gelu(x @ x.T).sum())
    x = torch.randn(256, 256, device=device)
    compiled(x)  # compile outside the profile
    return lines + _describe_events("compiled region", _profile(lambda: compiled(x), device))


def check_graph_capture(device: torch.device) -> list[str]:
    if device.type != "cuda":
        raise Skipped("needs a CUDA device")
    model = build_model(ModelConfig(**CHECK_MODEL), device)
    optimizer = cuda_graphs.make_optimizer(model)
    tokens = torch.randint(0, CHECK_MODEL["vocab_size"], (2, 64), device=device)
    batch = cuda_graphs.StaticBatch(tokens, tokens.roll(-1, 1))
    body = cuda_graphs.step_body(model, batch, "train-step", optimizer, contextlib.nullcontext)
    step = cuda_graphs.CapturedStep(body, model)
    before = model.lm_head.weight.detach().clone()
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    moved = (model.lm_head.weight - before).abs().max().item()
    defaults = optimizer.defaults
    lines = [
        f"captured and replayed 3 times: AdamW fused={defaults['fused']} capturable={defaults['capturable']}, "
        f"loss {step.loss.item():.4f} (finite: {bool(torch.isfinite(step.loss))}), "
        f"largest parameter change {moved:.2e}"
    ]
    if moved == 0 or not torch.isfinite(step.loss):
        raise RuntimeError(lines[0] + ": the replays did not train")
    traced = profile_step(step, device, torch.cuda.synchronize)
    lines.append(
        f"replay profiled: {traced.kernels_per_step} kernels traced, device busy {traced.device_busy_pct}% "
        "(None: CUPTI saw no kernels of the graph)"
    )
    return lines


def check_sdpa(device: torch.device) -> list[str]:
    lines = []
    batch, heads, seq = (4, 16, 512) if device.type == "cuda" else (1, 2, 64)  # a CPU only needs the op's name
    for head_dim, dtype in ((64, torch.bfloat16), (128, torch.bfloat16), (64, torch.float32)):
        q, k, v = (
            torch.randn(batch, heads, seq, head_dim, device=device, dtype=dtype, requires_grad=True) for _ in range(3)
        )

        def attend(q=q, k=k, v=v):
            F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

        attend()
        events = _profile(attend, device)
        ops = sorted({e.name for e in events if e.name.startswith("aten::_scaled_dot_product")})
        kernels = sorted(
            {
                e.name
                for e in events
                if e.device_type == DeviceType.CUDA
                and any(w in e.name.lower() for w in ("flash", "fmha", "attention", "cudnn"))
            }
        )
        lines.append(
            f"- head_dim {head_dim}, {str(dtype).removeprefix('torch.')}, causal: {', '.join(ops) or 'math (no fused op)'}"
            + (f"; kernels: {', '.join(k[:60] for k in kernels[:3])}" if kernels else "")
        )
    return lines


def check_matmul(device: torch.device) -> list[str]:
    measured = measure_peak_tflops(device, "bf16")
    name = collect_environment(device).device_name
    table = table_peak_tflops(name, "bf16") if device.type == "cuda" else None
    line = f"bf16 matmul on {name}: {measured:.3g} TFLOP/s measured"
    if table:
        line += f" = {100 * measured / table:.0f}% of the {table:g} TFLOP/s spec-sheet peak MFU divides by"
        if measured < MATMUL_FLOOR * table:  # a large bf16 product reaches 60-80% of the sheet on H100/H200
            raise RuntimeError(f"{line}: below {MATMUL_FLOOR:.0%}, the probe timed something other than the product")
    else:
        line += " (no spec-sheet peak for this device: rows use the measured probe)"
    return [line]


def run(device: torch.device, compile_too: bool) -> tuple[list[str], int]:
    checks = [
        ("Versions", lambda: check_versions(device)),
        ("Profiler event kinds", lambda: check_profiler(device, compile_too)),
        ("Fused + capturable AdamW in a CUDA graph", lambda: check_graph_capture(device)),
        ("SDPA backend at the built-in model's head sizes", lambda: check_sdpa(device)),
        ("bf16 matmul rate", lambda: check_matmul(device)),
    ]
    lines, failures = [], 0
    for title, check in checks:
        start = time.perf_counter()
        try:
            body, verdict = check(), "ok"
        except Skipped as exc:
            body, verdict = [], f"skipped: {exc}"
        except Exception as exc:  # a failed check is a finding; the others still run
            body, verdict = ["```", *traceback.format_exc().strip().splitlines()[-6:], "```"], f"FAILED: {exc}"
            failures += 1
        lines += [f"## {title} ({verdict}, {time.perf_counter() - start:.1f} s)", "", *body, ""]
        print(f"{title}: {verdict}", file=sys.stderr, flush=True)
    return lines, failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--output", type=Path, help="Markdown file (default results/checks/gpu_selfcheck_<device>.md)")
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="skip the compiled region")
    args = parser.parse_args(argv)
    try:
        device = resolve_device(args.device)
    except Exception as exc:
        print(f"gpu_selfcheck: error: {exc}", file=sys.stderr)
        return 2
    output = args.output or RESULTS / f"gpu_selfcheck_{device.type}.md"
    lines, failures = run(device, args.compile)
    command = " ".join(["python scripts/checks/gpu_selfcheck.py", *(sys.argv[1:] if argv is None else argv)])
    header = [f"# GPU self-check ({device})", "", f"Command: `{command}`", ""]
    output.parent.mkdir(parents=True, exist_ok=True)
    write_whole(output, "\n".join(header + lines))
    print(f"wrote {output}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
