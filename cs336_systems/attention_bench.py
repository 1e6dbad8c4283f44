"""python -m cs336_systems.attention_bench: attention alone, forward and backward, per shape.

    python -m cs336_systems.attention_bench --head-dims 16 32 64 128 \\
        --seq-lens 256 1024 4096 8192 16384 --batch-size 8 --steps 100 \\
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
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from cs336_systems.argtypes import ArgumentParser, available_memory_bytes, fail, non_negative_int, positive_int
from cs336_systems.device import (
    DeviceError,
    compile_unsupported_reason,
    first_line,
    is_out_of_memory,
    release_memory,
    resolve_device,
)
from cs336_systems.memory import PhaseMemory, current_memory_bytes, rss_high_water_mark_available
from cs336_systems.memory_cap import soft_address_space_cap
from cs336_systems.models import naive_causal_attention, sdpa_causal_attention
from cs336_systems.precision import PRECISION_TABLE, PRECISIONS, cpu_has_native, precision_mode, unsupported_reason
from cs336_systems.results import (
    Environment,
    ResultFileError,
    ResultSink,
    check_output_paths,
    collect_environment,
    render_markdown,
    samples_field,
    utc_timestamp,
)
from cs336_systems.results import (
    LegacyRecord as Record,
)
from cs336_systems.stats import is_noisy, summarize
from cs336_systems.timing import TIMERS, HostTimer, UntimedSetup, device_synchronizer, make_timer, time_steps
from cs336_systems.units import format_bytes, parse_bytes

PROG = "python -m cs336_systems.attention_bench"
IMPLEMENTATIONS = ("naive", "sdpa", "compiled")
TENSOR_DTYPES = {name: mode.compute_dtype for name, mode in PRECISION_TABLE.items()}  # q, k, v (no autocast)
PASSES = ("forward", "backward")


@dataclass(frozen=True)
class AttentionConfig:
    implementation: str
    head_dim: int
    seq_len: int
    batch_size: int = 8
    precision: str = "fp32"
    device: str = "cpu"
    timer: str = "host"
    warmup_steps: int = 5
    steps: int = 100
    max_seconds: float | None = 30.0
    seed: int = 0

    @property
    def forward_flops(self) -> int:
        """QK^T and PV: two (T x d) @ (d x T)-sized matmuls per batch element, full square."""
        return 2 * 2 * self.batch_size * self.seq_len**2 * self.head_dim

    @property
    def scores_bytes(self) -> int:
        """One (batch, T, T) score matrix: what the naive implementation materialises."""
        return self.batch_size * self.seq_len**2 * TENSOR_DTYPES[self.precision].itemsize


@dataclass
class AttentionRecord(Record):
    """One (implementation, head dim, seq len) of attention_bench."""

    # configuration
    implementation: str
    head_dim: int
    seq_len: int
    batch_size: int
    precision: str
    device: str
    timer: str
    warmup_steps: int
    steps: int
    max_seconds: float | None
    seed: int
    # outcome
    status: str
    error: str | None = None
    forward_steps: int | None = None  # measured (fewer than `steps` when the time budget ran out)
    forward_mean_ms: float | None = None
    forward_std_ms: float | None = None
    forward_cv_pct: float | None = None
    forward_median_ms: float | None = None
    forward_min_ms: float | None = None
    forward_max_ms: float | None = None
    forward_p10_ms: float | None = None
    forward_p90_ms: float | None = None
    backward_steps: int | None = None
    backward_mean_ms: float | None = None
    backward_std_ms: float | None = None
    backward_cv_pct: float | None = None
    backward_median_ms: float | None = None
    backward_min_ms: float | None = None
    backward_max_ms: float | None = None
    backward_p10_ms: float | None = None
    backward_p90_ms: float | None = None
    compile_s: float | None = None
    # work
    forward_flops: int | None = None
    backward_flops: int | None = None
    forward_tflops: float | None = None
    backward_tflops: float | None = None
    scores_bytes: int | None = None
    sdpa_backend: str | None = None
    # memory
    memory_source: str | None = None
    memory_before_backward_bytes: int | None = None
    forward_peak_bytes: int | None = None
    backward_peak_bytes: int | None = None
    saved_for_backward_bytes: int | None = None
    memory_limit_bytes: int | None = None  # CPU: address space allowed beyond what was mapped at start
    notes: str | None = None
    # numeric mode in effect
    matmul_precision: str | None = None
    cuda_matmul_allow_tf32: bool | None = None
    timestamp: str = field(default_factory=utc_timestamp)
    environment: Environment | None = None
    forward_ms: list[float] = samples_field()
    backward_ms: list[float] = samples_field()
    forward_warmup_ms: list[float] = samples_field()
    backward_warmup_ms: list[float] = samples_field()


ATTENTION_FIELDS = AttentionRecord.row_fields()
MARKDOWN_COLUMNS = (
    "implementation",
    "head_dim",
    "seq_len",
    "batch_size",
    "precision",
    "status",
    "forward_mean_ms",
    "forward_cv_pct",
    "backward_mean_ms",
    "backward_cv_pct",
    "forward_tflops",
    "backward_tflops",
    "memory_before_backward_mib",
    "saved_for_backward_mib",
    "backward_peak_mib",
    "compile_s",
)
LABEL_COLUMNS = ("implementation", "head_dim", "seq_len")
CONVENTIONS = (
    "forward: autograd recording, as in training; backward: against a fixed random output gradient, after an "
    "untimed fresh forward. FLOPs count the QK^T and PV matmuls over the full T x T square (backward = 2x forward). "
    "Memory is counted from just before the inputs were made: CUDA allocator bytes, or on a CPU the growth of the "
    "resident set (includes what glibc keeps after frees). saved_for_backward counts the distinct storages autograd "
    "saved, inputs included. compile_s = first forward + first backward call of torch.compile(naive)."
)


def render(rows: Sequence[dict], title: str = "Attention forward and backward") -> str:
    text = render_markdown(rows, title=title, columns=MARKDOWN_COLUMNS, label_columns=LABEL_COLUMNS)
    return text + "\n" + CONVENTIONS + "\n"


def new_record(config: AttentionConfig, device: torch.device, env: Environment | None) -> AttentionRecord:
    return AttentionRecord(
        implementation=config.implementation,
        head_dim=config.head_dim,
        seq_len=config.seq_len,
        batch_size=config.batch_size,
        precision=config.precision,
        device=str(device),
        timer=config.timer,
        warmup_steps=config.warmup_steps,
        steps=config.steps,
        max_seconds=config.max_seconds,
        seed=config.seed,
        status="ok",
        forward_flops=config.forward_flops,
        backward_flops=2 * config.forward_flops,
        scores_bytes=config.scores_bytes,
        environment=env,
    )


def sdpa_backend_name(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """Which kernel F.scaled_dot_product_attention dispatches to for these inputs (private torch API)."""
    try:
        from torch.nn.attention import SDPBackend

        return SDPBackend(torch._fused_sdp_choice(q, k, v, is_causal=True)).name.lower()
    except Exception:  # private API: absent or changed in other torch versions
        return None


def saved_tensor_bytes(function: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> int:
    """Bytes of the distinct storages autograd saves for backward in one call of `function`."""
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = function(*inputs)
    del out
    return sum(storages.values())


def make_inputs(config: AttentionConfig, device: torch.device) -> tuple[torch.Tensor, ...]:
    """q, k, v (requiring grad) and the output gradient, seeded."""
    generator = torch.Generator(device=device).manual_seed(config.seed)
    shape = (config.batch_size, 1, config.seq_len, config.head_dim)
    dtype = TENSOR_DTYPES[config.precision]
    q, k, v, grad_out = (torch.randn(shape, generator=generator, device=device, dtype=dtype) for _ in range(4))
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), grad_out


def attention_function(implementation: str) -> Callable[..., torch.Tensor]:
    if implementation == "naive":
        return naive_causal_attention
    if implementation == "sdpa":
        return sdpa_causal_attention
    if implementation == "compiled":
        torch._dynamo.reset()  # a fresh compile per configuration, so compile_s is comparable
        return torch.compile(naive_causal_attention)
    raise ValueError(f"unknown implementation {implementation!r}; choose one of {IMPLEMENTATIONS}")


class _Phase:
    """The part of a configuration running now, named in an error row."""

    name = "setup"


def _measure(
    config: AttentionConfig,
    device: torch.device,
    record: AttentionRecord,
    phase: _Phase,
    clock: Callable[[], float],
) -> None:
    sync = device_synchronizer(device)
    phase.name = "compile" if config.implementation == "compiled" else "setup"
    attend = attention_function(config.implementation)
    if config.implementation == "compiled":
        # Compile on inputs of the same shape that are freed before memory is counted.
        q, k, v, grad_out = make_inputs(config, device)
        held = {}
        host = HostTimer(clock, sync)
        compile_ms = host.time_ms(lambda: held.setdefault("out", attend(q, k, v)))
        compile_ms += host.time_ms(lambda: held.pop("out").backward(grad_out))
        record.compile_s = compile_ms / 1e3
        del q, k, v, grad_out, held

    phase.name = "setup"
    release_memory(device)
    baseline = current_memory_bytes(device) if record.memory_source else 0
    q, k, v, grad_out = make_inputs(config, device)
    inputs = (q, k, v)
    if config.implementation == "sdpa":
        record.sdpa_backend = sdpa_backend_name(q, k, v)

    # One untimed forward and backward: memory before backward and the peak of each pass.
    phase.name = "forward"
    memory = PhaseMemory(device) if record.memory_source else None
    with memory.phase("forward") if memory else contextlib.nullcontext():
        out = attend(*inputs)
        sync()
    if memory:
        record.memory_before_backward_bytes = current_memory_bytes(device) - baseline
    phase.name = "backward"
    with memory.phase("backward") if memory else contextlib.nullcontext():
        out.backward(grad_out)
        sync()
    del out
    if memory:
        record.forward_peak_bytes = memory.steps[-1]["forward"][0] - baseline
        record.backward_peak_bytes = memory.steps[-1]["backward"][0] - baseline

    timer = make_timer(config.timer, device, clock)
    budget = dict(warmup_steps=config.warmup_steps, measure_steps=config.steps, budget_s=config.max_seconds or None)
    phase.name = "forward"
    held = {}  # each output is freed before the next step starts, outside the clock
    forward = time_steps(
        lambda: held.__setitem__("out", attend(*inputs)), timer=UntimedSetup(timer, held.clear), **budget
    )
    held.clear()
    record.forward_ms, record.forward_warmup_ms = list(forward.measured_ms), list(forward.warmup_ms)
    _add_summary(record, "forward", forward.measured_ms)

    phase.name = "backward"
    state = {}

    def fresh_forward() -> None:
        for tensor in inputs:
            tensor.grad = None
        state["out"] = attend(*inputs)

    backward = time_steps(
        lambda: state.pop("out").backward(grad_out), timer=UntimedSetup(timer, fresh_forward), **budget
    )
    record.backward_ms, record.backward_warmup_ms = list(backward.measured_ms), list(backward.warmup_ms)
    _add_summary(record, "backward", backward.measured_ms)

    phase.name = "saved-tensors count"
    record.saved_for_backward_bytes = saved_tensor_bytes(attend, *inputs)


def _add_summary(record: AttentionRecord, prefix: str, samples: Sequence[float]) -> None:
    summary = summarize(samples)
    setattr(record, f"{prefix}_steps", summary.n)
    for name, value in summary.as_dict(suffix="_ms").items():
        setattr(record, f"{prefix}_{name}", value)
    flops = record.forward_flops if prefix == "forward" else record.backward_flops
    setattr(record, f"{prefix}_tflops", flops / (summary.mean / 1e3) / 1e12)


def _notes(config: AttentionConfig, record: AttentionRecord, device: torch.device) -> list[str]:
    notes = []
    for name in PASSES:
        measured = getattr(record, f"{name}_steps")
        if measured is not None and measured < config.steps:
            notes.append(f"{name}: {measured} of {config.steps} steps (the {config.max_seconds:g} s budget ran out)")
        cv = getattr(record, f"{name}_cv_pct")
        if is_noisy(None if cv is None or math.isnan(cv) else cv):
            notes.append(f"{name} CV {cv:.1f}% > 10%: treat its mean with care")
    if device.type == "cpu" and not cpu_has_native(config.precision):
        notes.append(f"this CPU has no native {config.precision} matmul: it is emulated and far slower than fp32")
    if device.type == "cpu" and hasattr(os, "getloadavg"):
        load, ours = os.getloadavg()[0], torch.get_num_threads()
        if load > ours + 1:
            notes.append(
                f"load average {load:.1f} with {ours} threads of ours: other processes competed for the CPU, "
                "so times may be inflated"
            )
    return notes


def run_attention(
    config: AttentionConfig,
    *,
    environment: Environment | None = None,
    clock: Callable[[], float] = time.perf_counter,
    memory_limit_bytes: int | None = None,
) -> AttentionRecord:
    """Measure one configuration. Out of memory (or any failure) is a row, never a raise."""
    device = resolve_device(config.device)
    env = environment or collect_environment(device)
    record = new_record(config, device, env)
    record.memory_limit_bytes = memory_limit_bytes
    if device.type == "cuda":
        record.memory_source = "cuda_allocator"
    elif rss_high_water_mark_available():
        record.memory_source = "rss"
    reason = unsupported_reason(config.precision, device)
    if reason is None and config.implementation == "compiled":
        reason = compile_unsupported_reason(device)
    if reason is not None:
        record.status, record.error = "unsupported", reason
        return record

    phase = _Phase()
    with precision_mode(config.precision, device) as state:
        record.matmul_precision, record.cuda_matmul_allow_tf32 = state.matmul_precision, state.cuda_matmul_allow_tf32
        try:
            _measure(config, device, record, phase, clock)
        except Exception as exc:  # any failure is a row; OOM is told apart from the rest
            kind = "oom" if is_out_of_memory(exc) else "error"
            detail = first_line(exc) if kind == "oom" else f"{type(exc).__name__}: {first_line(exc)}"
            record.status, record.error = kind, f"{phase.name}: {detail}"
        finally:
            release_memory(device)  # the failed step's tensors died with the exception
    record.notes = "; ".join(_notes(config, record, device)) or None
    return record


# -- plot -------------------------------------------------------------------------------------


def plot(rows: Sequence[dict], path: str | Path) -> Path:
    """Forward and backward mean time vs sequence length (log-log), one column per head dim;
    out-of-memory points are marked with an x along the top edge."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker as ticker
    import matplotlib.transforms as transforms
    import pandas as pd

    frame = pd.DataFrame(list(rows))
    head_dims = sorted(frame["head_dim"].unique())
    seq_lens = sorted(int(n) for n in frame["seq_len"].unique())
    implementations = [name for name in IMPLEMENTATIONS if name in set(frame["implementation"])]
    colors = dict(zip(IMPLEMENTATIONS, ("tab:red", "tab:blue", "tab:green")))
    fig, axes = plt.subplots(
        2, len(head_dims), figsize=(3.6 * len(head_dims) + 1, 6.5), squeeze=False, sharex=True, sharey="row"
    )
    for column, head_dim in enumerate(head_dims):
        for row_index, name in enumerate(PASSES):
            ax = axes[row_index][column]
            edge = transforms.blended_transform_factory(ax.transData, ax.transAxes)
            for implementation in implementations:
                rows_here = frame[(frame["head_dim"] == head_dim) & (frame["implementation"] == implementation)]
                rows_here = rows_here.sort_values("seq_len")
                measured = rows_here[rows_here[f"{name}_mean_ms"].notna()]
                ax.plot(
                    measured["seq_len"],
                    measured[f"{name}_mean_ms"],
                    marker="o",
                    color=colors[implementation],
                    label=implementation,
                )
                failed = rows_here[(rows_here["status"] == "oom") & rows_here[f"{name}_mean_ms"].isna()]
                if len(failed):
                    ax.plot(
                        failed["seq_len"],
                        [0.95] * len(failed),
                        transform=edge,
                        marker="x",
                        markersize=9,
                        linestyle="none",
                        color=colors[implementation],
                        label=f"{implementation} OOM",
                    )
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(seq_lens, [str(n) for n in seq_lens])
            ax.xaxis.set_minor_locator(ticker.NullLocator())
            ax.grid(True, which="major", alpha=0.3)
            ax.set_title(f"{name}, head_dim {head_dim}", fontsize=10)
            if column == 0:
                ax.set_ylabel(f"{name} mean (ms)")
            if row_index == len(PASSES) - 1:
                ax.set_xlabel("sequence length")
    legend: dict[str, object] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=len(legend), fontsize=9)
    first = frame.iloc[0]
    fig.suptitle(
        f"causal attention, batch {first['batch_size']}, {first['precision']}, {first.get('device_name', '')}",
        fontsize=11,
    )
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# -- CLI --------------------------------------------------------------------------------------


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="auto", help="auto (cuda when available), cpu, cuda or cuda:N")
    parser.add_argument("--head-dims", type=positive_int, nargs="+", default=[16, 32, 64, 128])
    parser.add_argument("--seq-lens", type=positive_int, nargs="+", default=[256, 1024, 4096, 8192, 16384])
    parser.add_argument("--batch-size", type=positive_int, default=8)
    parser.add_argument("--implementations", nargs="+", choices=IMPLEMENTATIONS, default=list(IMPLEMENTATIONS))
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="fp32",
        help="dtype of q, k, v: fp32, tf32 (fp32 tensors, TF32 matmuls), bf16 or fp16 (no autocast) (fp32)",
    )
    parser.add_argument("--steps", type=positive_int, default=100, help="measured steps per pass (100)")
    parser.add_argument("--warmup-steps", type=non_negative_int, default=5)
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=30.0,
        help="per pass (forward, backward) and per warmup: stop once the steps so far took this long and at "
        "least 3 were measured; the row says how many ran. 0: no limit (30)",
    )
    parser.add_argument("--timer", choices=TIMERS, default="host")
    parser.add_argument(
        "--memory-limit",
        default="auto",
        help="CPU only: allocations past this much more address space fail as a real out-of-memory (a row "
        "with status oom) instead of swapping; auto: the memory available at start; none: no limit (auto)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--output",
        action="append",
        default=[],
        metavar="PATH",
        help="write results to PATH (.csv, .md or .jsonl; repeatable)",
    )
    parser.add_argument("--plot", metavar="PATH.png", help="plot file (default: the first --output with suffix .png)")
    return parser


def _memory_limit(text: str, device: torch.device) -> int | None:
    if text == "none":
        return None
    if device.type != "cpu":
        if text == "auto":
            return None
        raise DeviceError("--memory-limit caps CPU memory (RLIMIT_AS) and cannot be used with CUDA")
    if text == "auto":
        return available_memory_bytes()
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise DeviceError(f"--memory-limit: {exc}") from None


def configs_from_args(args, device: torch.device) -> list[AttentionConfig]:
    return [
        AttentionConfig(
            implementation=implementation,
            head_dim=head_dim,
            seq_len=seq_len,
            batch_size=args.batch_size,
            precision=args.precision,
            device=str(device),
            timer=args.timer,
            warmup_steps=args.warmup_steps,
            steps=args.steps,
            max_seconds=args.max_seconds,
            seed=args.seed,
        )
        for head_dim in args.head_dims
        for seq_len in args.seq_lens
        for implementation in args.implementations
    ]


def _progress(record: AttentionRecord) -> str:
    label = f"{record.implementation} head_dim={record.head_dim} seq_len={record.seq_len}"
    if record.status != "ok":
        return f"{label}: {record.status}: {record.error}"
    return (
        f"{label}: forward {record.forward_mean_ms:.3f} ms, backward {record.backward_mean_ms:.3f} ms, "
        f"before backward {format_bytes(record.memory_before_backward_bytes)}"
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.max_seconds < 0:
            raise DeviceError(f"--max-seconds must be zero or more, got {args.max_seconds:g}")
        device = resolve_device(args.device)
        if args.timer == "cuda-event" and device.type != "cuda":
            raise DeviceError("--timer cuda-event needs a CUDA device")
        limit = _memory_limit(args.memory_limit, device)
        outputs = check_output_paths(args.output)
        plot_path = Path(args.plot) if args.plot else (outputs[0].with_suffix(".png") if outputs else None)
        if plot_path is not None and plot_path.suffix not in (".png", ".svg", ".pdf"):
            raise ResultFileError(f"--plot {plot_path}: use a .png, .svg or .pdf file")
        sink = ResultSink(outputs, fields=ATTENTION_FIELDS, render=render)
    except (DeviceError, ResultFileError) as exc:
        return fail(PROG, str(exc))

    env = collect_environment(device)
    configs = configs_from_args(args, device)
    if device.type == "cpu" and max(args.seq_lens) >= 4096:
        print(
            f"{PROG}: note: sequence lengths up to {max(args.seq_lens)} take hours on a CPU (the defaults are sized "
            "for a GPU); for a quick look: --seq-lens 256 1024 --steps 10",
            file=sys.stderr,
        )
    rows = []
    with soft_address_space_cap(limit) if limit is not None else contextlib.nullcontext():
        for config in configs:
            record = run_attention(config, environment=env, memory_limit_bytes=limit)
            sink.write(record)
            rows.append(record.to_row())
            print(_progress(record), file=sys.stderr, flush=True)
    print(render(rows))
    if plot_path is not None:
        print(f"wrote {plot(rows, plot_path)}", file=sys.stderr)
    for path in args.output:
        print(f"wrote {path}", file=sys.stderr)
    return 1 if any(row["status"] == "error" for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "ATTENTION_FIELDS",
    "IMPLEMENTATIONS",
    "AttentionConfig",
    "AttentionRecord",
    "main",
    "plot",
    "run_attention",
    "saved_tensor_bytes",
]
