"""python -m cs336_systems.ddp_bench: our training step under data parallelism, and what it scales to.

Example (CPU, gloo, both strategies, world sizes 1 and 2):
    python -m cs336_systems.ddp_bench --backend gloo --world-size 1 2 --strategy ddp naive \
        --d-model 256 --d-ff 1024 --num-layers 4 --num-heads 4 --context-length 128 --batch-size 4 \
        --output results/ddp.csv --output results/ddp.md

Each rank runs the `train-step` of `benchmark` (forward, cross-entropy, backward, optimizer
step; cs336_systems.runner.make_step) on its own shard of the global batch: rank r draws its
per-device batch with seed + r. Strategies:
  ddp     torch.nn.parallel.DistributedDataParallel (gradients all-reduced in buckets of
          --bucket-cap-mb, overlapped with backward; buffers broadcast each step only for a
          --model-factory model, ours has none that change)
  naive   a plain model; after backward, one all-reduce per parameter gradient, then divide
          by the world size (parameters broadcast from rank 0 at the start)
  single  the baseline, run first: one process, the plain model, the per-device batch, the same
          threads (and cores) as one rank

Reported per (world size, strategy): step time statistics (each step's time is the slowest
rank's; an untimed barrier precedes each step; synced and no_sync steps alternate), samples/s and tokens/s of the global batch,
time spent in communication, scaling efficiency and the learning rates for the global batch:
  comm_ms             naive: the all-reduce loop, timed directly (mean over ranks);
                      ddp: step time minus the same step under no_sync() (no gradient
                      all-reduce): the communication backward could not hide
  scaling_efficiency  samples_per_s(N) / (N * samples_per_s(single)), the single baseline
                      being one process at the per-device batch (weak scaling: 1.0 is perfect)
  compute_slowdown    no_sync step / single step: how much slower a rank computes while the
                      others run (shared cores, memory bandwidth, clocks); 1.0 = not at all.
                      So efficiency ~= 1 / (compute_slowdown * (1 + exposed comm / no_sync step))
  lr_linear, lr_sqrt  base_lr * (global / base batch) and base_lr * sqrt(global / base batch)
"""

from __future__ import annotations

import contextlib
import inspect
import math
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from cs336_systems.argtypes import ArgumentParser, fail, non_negative_int, positive_float, positive_int
from cs336_systems.cli import (
    ATTENTION_KINDS,
    PRECISIONS,
    add_shape_arguments,
    model_config_from_args,
)
from cs336_systems.config import BenchmarkConfig
from cs336_systems.distributed import (
    BACKENDS,
    DEFAULT_INIT_TIMEOUT_S,
    BarrierFirst,
    GroupResult,
    LaunchError,
    LaunchSpec,
    RankContext,
    all_reduce_mean,
    check_launch,
    default_threads_per_rank,
    device_for,
    max_over_ranks,
    mean_over_ranks,
    oversubscription_note,
    run_spawned,
    run_under_torchrun,
    torchrun_local_world_size,
    torchrun_rank,
    torchrun_threads_per_rank,
    torchrun_world_size,
    under_torchrun,
)
from cs336_systems.models import MODEL_SIZES, ConfigError, ModelFactoryError, build_model, load_model_factory
from cs336_systems.optimizer import make_optimizer
from cs336_systems.precision import precision_mode, unsupported_reason
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
from cs336_systems.runner import make_step
from cs336_systems.stats import summarize
from cs336_systems.timing import HostTimer, StepTimes, device_synchronizer, time_steps

PROG = "python -m cs336_systems.ddp_bench"
STRATEGIES = ("ddp", "naive")
OPTIMIZERS = ("adamw", "sgd")
DDP_DEFAULT_BUCKET_CAP_MB = 25.0  # DistributedDataParallel's default
COMM_METHODS = {
    "ddp": "step - no_sync step (exposed)",
    "naive": "all-reduce loop timed (mean over ranks)",
}


@dataclass(frozen=True)
class DdpUnit:
    """One run: a strategy on `ranks` ranks (the single baseline runs on rank 0 alone)."""

    strategy: str  # single, ddp or naive
    config: BenchmarkConfig  # the per-device train-step; its seed seeds the weights, seed + rank the data
    ranks: int
    optimizer: str = "adamw"
    lr: float = 1e-4
    bucket_cap_mb: float | None = None


# -- one rank's training step under a strategy -----------------------------------------------


def buffer_sync_option(sync: bool) -> dict[str, bool]:
    """DDP's flag for broadcasting buffers before each forward. Our model's only buffers are
    RoPE tables, equal on every rank by construction: re-sending them would be communication for
    nothing. (torch 2.13 renamed broadcast_buffers to forward_sync_buffers.)"""
    parameters = inspect.signature(DistributedDataParallel.__init__).parameters
    return {"forward_sync_buffers" if "forward_sync_buffers" in parameters else "broadcast_buffers": sync}


class Trainer:
    """This rank's model, optimizer and training step for `unit.strategy`."""

    def __init__(self, ctx: RankContext, unit: DdpUnit):
        self.ctx, self.unit = ctx, unit
        device = ctx.device
        config = unit.config.replace(device=str(device), pass_type="train-step")
        torch.manual_seed(config.seed)  # the same weights on every rank
        self.module = build_model(config.model, device, config.model_factory)
        self.model: nn.Module = self.module
        if unit.strategy == "naive":
            for parameter in self.module.parameters():  # whatever a user's factory did, start equal
                torch.distributed.broadcast(parameter.data, src=0)
        elif unit.strategy == "ddp":
            self.model = DistributedDataParallel(
                self.module,
                device_ids=[device.index] if device.type == "cuda" else None,
                bucket_cap_mb=unit.bucket_cap_mb,
                **buffer_sync_option(config.model_factory is not None),
            )
        if unit.optimizer == "sgd":
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=unit.lr)
        else:
            self.optimizer = make_optimizer(self.model, device)
            for group in self.optimizer.param_groups:
                group["lr"] = unit.lr
        self.comm_ms: list[float] = []
        self._sync = True
        self._comm_timer = HostTimer(synchronize=device_synchronizer(device))
        self._step = make_step(config.replace(seed=config.seed + ctx.rank), self.model, device, self.optimizer,
                               phase=self._phase)  # fmt: skip

    @contextlib.contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        # make_step enters phase("optimizer") after backward, just before the optimizer step:
        # where the naive strategy averages the gradients.
        if name == "optimizer" and self.unit.strategy == "naive" and self._sync:
            self.comm_ms.append(self._comm_timer.time_ms(self._all_reduce_gradients))
        yield

    def _all_reduce_gradients(self) -> None:
        for parameter in self.module.parameters():
            if parameter.grad is not None:
                all_reduce_mean(parameter.grad)

    def step(self, sync: bool = True) -> None:
        """One training step; with sync=False the gradients are not averaged (DDP's no_sync)."""
        self._sync = sync
        quiet = self.model.no_sync() if isinstance(self.model, DistributedDataParallel) and not sync else None
        with quiet or contextlib.nullcontext():
            self._step()


def time_interleaved(trainer: Trainer, warmup_steps: int, measure_steps: int, timer) -> tuple[StepTimes, StepTimes]:
    """A synced step and a no_sync step in turn, each timed on its own: a slow spell of the
    machine (a busy neighbour on a shared host) then falls on both, not on one block of them."""
    synced, unsynced = [], []
    for _ in range(warmup_steps + measure_steps):
        synced.append(timer.time_ms(trainer.step))
        unsynced.append(timer.time_ms(lambda: trainer.step(sync=False)))
    split = lambda times: StepTimes(tuple(times[:warmup_steps]), tuple(times[warmup_steps:]))  # noqa: E731
    return split(synced), split(unsynced)


def ddp_worker(ctx: RankContext, unit: DdpUnit) -> dict | None:
    """This rank's timings for one unit; None from ranks that sit it out."""
    if ctx.rank >= unit.ranks:
        return None
    config = unit.config
    with precision_mode(config.precision, ctx.device):
        trainer = Trainer(ctx, unit)
        timer = HostTimer(synchronize=device_synchronizer(ctx.device))
        if unit.ranks > 1:
            timer = BarrierFirst(timer, ctx.barrier)
        if unit.strategy == "single":
            synced = time_steps(trainer.step, warmup_steps=config.warmup_steps, measure_steps=config.measure_steps,
                                timer=timer)  # fmt: skip
            no_sync = None
        else:
            synced, no_sync = time_interleaved(trainer, config.warmup_steps, config.measure_steps, timer)
        comm_ms = trainer.comm_ms[-config.measure_steps :] if unit.strategy == "naive" else []
    return {
        "num_params": sum(p.numel() for p in trainer.module.parameters()),
        "step_ms": list(synced.measured_ms),
        "warmup_ms": list(synced.warmup_ms),
        "no_sync_ms": list(no_sync.measured_ms) if no_sync else [],
        "comm_ms": comm_ms,
    }


# -- rows ------------------------------------------------------------------------------------


@dataclass
class DdpRecord(Record):
    """One (world size, strategy, bucket size) of the DDP benchmark."""

    strategy: str
    backend: str
    device: str
    launcher: str
    world_size: int
    model_size: str
    d_model: int
    d_ff: int
    num_layers: int
    num_heads: int
    vocab_size: int
    attention: str
    model_factory: str | None
    context_length: int
    per_device_batch: int
    global_batch: int
    precision: str
    optimizer: str
    bucket_cap_mb: float | None
    threads_per_rank: int
    warmup_steps: int
    measure_steps: int
    seed: int
    base_lr: float
    base_batch_size: int
    lr_linear: float
    lr_sqrt: float
    status: str
    error: str | None = None
    num_params: int | None = None
    mean_ms: float | None = None
    std_ms: float | None = None
    cv_pct: float | None = None
    median_ms: float | None = None
    min_ms: float | None = None
    max_ms: float | None = None
    p10_ms: float | None = None
    p90_ms: float | None = None
    no_sync_mean_ms: float | None = None
    comm_ms: float | None = None
    comm_pct: float | None = None
    comm_method: str | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    baseline_samples_per_s: float | None = None
    scaling_efficiency: float | None = None
    compute_slowdown: float | None = None  # no_sync step / single step: ranks slowing each other down
    notes: str | None = None
    timestamp: str = field(default_factory=utc_timestamp)
    environment: Environment | None = None
    step_ms: list[float] = samples_field()  # per step, the slowest rank
    warmup_step_ms: list[float] = samples_field()
    no_sync_step_ms: list[float] = samples_field()
    comm_step_ms: list[float] = samples_field()
    rank_step_ms: list[list[float]] = samples_field()  # [rank][step]


MARKDOWN_COLUMNS = (
    "strategy",
    "world_size",
    "per_device_batch",
    "global_batch",
    "bucket_cap_mb",
    "status",
    "mean_ms",
    "std_ms",
    "cv_pct",
    "no_sync_mean_ms",
    "comm_ms",
    "comm_pct",
    "samples_per_s",
    "scaling_efficiency",
    "compute_slowdown",
    "lr_linear",
    "lr_sqrt",
)
LABEL_COLUMNS = ("strategy", "world_size", "bucket_cap_mb")


def scaled_learning_rates(base_lr: float, base_batch_size: int, global_batch: int) -> tuple[float, float]:
    """(linear, square-root) scaling of a learning rate tuned at `base_batch_size` (Goyal et al.
    2017 scale linearly; Krizhevsky 2014 and Hoffer et al. 2017 by the square root)."""
    ratio = global_batch / base_batch_size
    return base_lr * ratio, base_lr * math.sqrt(ratio)


def scaling_efficiency(samples_per_s: float, world_size: int, baseline_samples_per_s: float) -> float:
    return samples_per_s / (world_size * baseline_samples_per_s)


def record_for(unit: DdpUnit, result: GroupResult, base: dict, environment: Environment | None) -> DdpRecord:
    config, m = unit.config, unit.config.model
    world_size = 1 if unit.strategy == "single" else base["world_size"]
    global_batch = config.batch_size * world_size
    lr_linear, lr_sqrt = scaled_learning_rates(base["base_lr"], base["base_batch_size"], global_batch)
    record = DdpRecord(
        **{**base, "world_size": world_size},
        strategy=unit.strategy,
        model_size=m.size_name, d_model=m.d_model, d_ff=m.d_ff, num_layers=m.num_layers, num_heads=m.num_heads,
        vocab_size=m.vocab_size, attention=m.attention, model_factory=config.model_factory,
        context_length=config.context_length, per_device_batch=config.batch_size, global_batch=global_batch,
        precision=config.precision, optimizer=unit.optimizer,
        bucket_cap_mb=(unit.bucket_cap_mb or DDP_DEFAULT_BUCKET_CAP_MB) if unit.strategy == "ddp" else None,
        warmup_steps=config.warmup_steps, measure_steps=config.measure_steps, seed=config.seed,
        lr_linear=lr_linear, lr_sqrt=lr_sqrt,
        status=result.status, error=result.error, environment=result.environment or environment,
    )  # fmt: skip
    note = oversubscription_note(record.backend, world_size, record.threads_per_rank)
    record.notes = note
    if result.status != "ok":
        return record
    messages = [message for message in result.messages if message is not None]
    record.num_params = messages[0]["num_params"]
    record.rank_step_ms = [message["step_ms"] for message in messages]
    record.step_ms = max_over_ranks(record.rank_step_ms)
    record.warmup_step_ms = max_over_ranks([message["warmup_ms"] for message in messages])
    summary = summarize(record.step_ms)
    for name, value in summary.as_dict(suffix="_ms").items():
        setattr(record, name, value)
    record.samples_per_s = global_batch / (summary.mean / 1e3)
    record.tokens_per_s = record.samples_per_s * config.context_length
    if unit.strategy != "single":
        record.no_sync_step_ms = max_over_ranks([message["no_sync_ms"] for message in messages])
        record.no_sync_mean_ms = summarize(record.no_sync_step_ms).mean
        if unit.strategy == "naive":
            record.comm_step_ms = mean_over_ranks([message["comm_ms"] for message in messages])
        else:
            record.comm_step_ms = [a - b for a, b in zip(record.step_ms, record.no_sync_step_ms, strict=True)]
        record.comm_ms = summarize(record.comm_step_ms).mean
        record.comm_pct = 100 * record.comm_ms / summary.mean
        record.comm_method = COMM_METHODS[unit.strategy]
    return record


def attach_baseline(record: DdpRecord, baseline: DdpRecord | None) -> None:
    if baseline is None or baseline.samples_per_s is None or record.samples_per_s is None:
        if record.status == "ok":
            record.notes = "; ".join(filter(None, [record.notes, "no scaling efficiency: the single baseline failed"]))
        return
    record.baseline_samples_per_s = baseline.samples_per_s
    record.scaling_efficiency = scaling_efficiency(record.samples_per_s, record.world_size, baseline.samples_per_s)
    if record.no_sync_mean_ms is not None:
        record.compute_slowdown = record.no_sync_mean_ms / baseline.mean_ms


# -- command line ----------------------------------------------------------------------------


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=BACKENDS, default="gloo", help="gloo (CPU) or nccl (one GPU per rank)")
    parser.add_argument(
        "--world-size",
        "--world-sizes",
        nargs="+",
        type=positive_int,
        metavar="N",
        help="ranks per run, one or more (default: 2 for gloo, the GPU count for nccl; under torchrun, its WORLD_SIZE)",
    )
    parser.add_argument("--strategy", "--strategies", nargs="+", choices=STRATEGIES, default=["ddp"],
                        help="ddp: DistributedDataParallel; naive: all-reduce each gradient after backward")  # fmt: skip
    parser.add_argument("--bucket-cap-mb", nargs="+", type=positive_float, metavar="MB",
                        help=f"DDP bucket sizes to try (default: DDP's own, {DDP_DEFAULT_BUCKET_CAP_MB:g})")  # fmt: skip
    parser.add_argument("--model-size", default="small", help=f"one of {', '.join(MODEL_SIZES)} (default small)")
    parser.add_argument("--context-length", type=positive_int, default=512)
    parser.add_argument("--batch-size", type=positive_int, default=4, help="per device (rank); global = N x this")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32")
    parser.add_argument("--attention", choices=ATTENTION_KINDS, default="sdpa")
    add_shape_arguments(parser)
    group = parser.add_argument_group("training and execution")
    group.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    group.add_argument("--base-lr", type=positive_float, default=1e-4, help="learning rate tuned at --base-batch-size")
    group.add_argument(
        "--base-batch-size", type=positive_int, help="batch --base-lr was tuned at (default: per-device)"
    )
    group.add_argument("--warmup-steps", type=non_negative_int, default=5)
    group.add_argument("--measure-steps", type=positive_int, default=10)
    group.add_argument("--seed", type=int, default=0)
    group.add_argument("--threads-per-rank", type=positive_int,
                       help="CPU threads per rank, baseline included (default: cores / largest world size)")  # fmt: skip
    group.add_argument("--timeout", type=positive_float, default=600.0, metavar="SECONDS",
                       help="per run: status 'timeout' after this long (600)")  # fmt: skip
    group.add_argument("--init-timeout", type=positive_float, default=DEFAULT_INIT_TIMEOUT_S, metavar="SECONDS")
    group.add_argument("--output", action="append", default=[], metavar="PATH", help=".csv, .md or .jsonl; repeatable")
    return parser


def render(rows: Sequence[dict]) -> str:
    """The Markdown document; learning rates in 3 significant digits (the table's default of
    3 decimals would print 1e-4 as 0.000), labels without the bucket size where there is none."""

    def display(row: dict) -> dict:
        shown = {**row, **{name: f"{row[name]:.3g}" for name in ("lr_linear", "lr_sqrt") if _is_number(row.get(name))}}
        if not _is_number(row.get("bucket_cap_mb")):
            shown.pop("bucket_cap_mb", None)
        return shown

    return render_markdown([display(row) for row in rows], title="DDP benchmark", columns=MARKDOWN_COLUMNS,
                           label_columns=LABEL_COLUMNS)  # fmt: skip


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def resolve_world_sizes(asked: list[int] | None, backend: str, torchrun: bool) -> list[int]:
    if torchrun:
        size = torchrun_world_size()
        if asked and asked != [size]:
            raise LaunchError(f"under torchrun the world size is torchrun's ({size}); drop --world-size {asked}")
        return [size]
    if asked:
        return sorted(set(asked))
    if backend == "nccl" and torch.cuda.is_available():
        return [torch.cuda.device_count()]
    return [2]


def units_for(args, config: BenchmarkConfig, world_size: int, first: bool) -> list[DdpUnit]:
    """The runs of one process group: the baseline (in the first group only), then each strategy."""
    base_batch = args.base_batch_size or config.batch_size
    units = []
    if first:
        units.append(DdpUnit("single", config, ranks=1, optimizer=args.optimizer, lr=args.base_lr))
    lr = scaled_learning_rates(args.base_lr, base_batch, config.batch_size * world_size)[0]
    for strategy in args.strategy:
        for bucket in (args.bucket_cap_mb or [None]) if strategy == "ddp" else [None]:
            units.append(DdpUnit(strategy, config, ranks=world_size, optimizer=args.optimizer, lr=lr,
                                 bucket_cap_mb=bucket))  # fmt: skip
    return units


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torchrun = under_torchrun()
    try:
        world_sizes = resolve_world_sizes(args.world_size, args.backend, torchrun)
        for world_size in world_sizes:
            check_launch(args.backend, torchrun_local_world_size() if torchrun else world_size)
        device = device_for(args.backend, 0)
        reason = unsupported_reason(args.precision, device)
        if reason:
            raise ConfigError(f"--precision {args.precision}: {reason}")
        if args.model_factory:
            load_model_factory(args.model_factory)
        model = model_config_from_args(args, args.model_size, args.context_length, args.attention)
        model.check_context(args.context_length)
        config = BenchmarkConfig(
            model=model, context_length=args.context_length, batch_size=args.batch_size, pass_type="train-step",
            precision=args.precision, device=device.type, warmup_steps=args.warmup_steps,
            measure_steps=args.measure_steps, seed=args.seed, model_factory=args.model_factory,
        )  # fmt: skip
        rank0 = not torchrun or torchrun_rank() == 0
        sink = ResultSink(check_output_paths(args.output) if rank0 else [], fields=DdpRecord.row_fields(),
                          render=render)  # fmt: skip
    except (LaunchError, ConfigError, ModelFactoryError, ResultFileError) as exc:
        return fail(PROG, str(exc))

    threads = args.threads_per_rank or (torchrun_threads_per_rank() if torchrun else
                                        default_threads_per_rank(max(world_sizes)))  # fmt: skip
    fallback = None if torchrun else collect_environment(device)
    records: list[DdpRecord] = []
    baseline = None
    for index, world_size in enumerate(world_sizes):
        spec = LaunchSpec(args.backend, world_size, threads, init_timeout_s=args.init_timeout,
                          collective_timeout_s=args.timeout + args.init_timeout)  # fmt: skip
        base = dict(
            backend=args.backend, device=device.type, launcher="torchrun" if torchrun else "spawn",
            world_size=world_size, threads_per_rank=threads, base_lr=args.base_lr,
            base_batch_size=args.base_batch_size or args.batch_size,
        )  # fmt: skip
        units = units_for(args, config, world_size, first=index == 0)
        results = (
            run_under_torchrun(ddp_worker, units, spec)
            if torchrun
            else run_spawned(ddp_worker, units, spec, unit_timeout_s=args.timeout)
        )
        for unit, result in results:
            record = record_for(unit, result, base, fallback)
            if unit.strategy == "single":
                baseline = record
            attach_baseline(record, baseline)
            sink.write(record)
            records.append(record)
            print(f"n={record.world_size} {unit.strategy}: {_short(record)}", file=sys.stderr, flush=True)
    if not records:  # a torchrun rank other than 0
        return 0
    print(render([record.to_row() for record in records]))
    for path in args.output:
        print(f"wrote {path}", file=sys.stderr)
    return 1 if any(record.status in ("error", "timeout") for record in records) else 0


def _short(record: DdpRecord) -> str:
    if record.status != "ok":
        return f"{record.status}: {record.error}"
    efficiency = f", efficiency {record.scaling_efficiency:.2f}" if record.scaling_efficiency is not None else ""
    return f"{record.mean_ms:.1f} ms/step, {record.samples_per_s:.1f} samples/s{efficiency}"


if __name__ == "__main__":
    sys.exit(main())
