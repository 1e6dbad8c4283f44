"""python -m cs336_systems.ddp_bench: our training step under data parallelism, and what it scales to.

Example (CPU, gloo, both strategies, world sizes 1 and 2):
    python -m cs336_systems.ddp_bench --backend gloo --world-sizes 1 2 --strategies ddp naive \
        --d-model 256 --d-ff 1024 --num-layers 4 --num-heads 4 --context-length 128 --batch-size 4 \
        --output results/ddp.csv --output results/ddp.md

  strategies.py  how each strategy wraps the model, builds the optimizer and syncs gradients
  accounting.py  bytes of parameters / gradients / optimizer state per rank, and their prediction
  trainer.py     one rank's step under a strategy: the correctness check, memory and timing
  record.py   the row: DdpRecord, learning-rate scaling, efficiency, its Markdown view
  cli.py      the flags and main (the launch and row loop are cs336_systems.distributed.driver's)

Each rank runs the `train-step` of `benchmark` (forward, cross-entropy, backward, optimizer
step; cs336_systems.runner.make_step) on its own shard of the global batch: rank r draws its
per-device batch with seed + r. Strategies (strategies.py):
  ddp     torch.nn.parallel.DistributedDataParallel (gradients all-reduced in buckets of
          --bucket-cap-mb, overlapped with backward; buffers broadcast each step only for a
          --model-factory model, ours has none that change)
  naive   a plain model; after backward, one all-reduce per parameter gradient, then divide
          by the world size (parameters broadcast from rank 0 at the start)
  flat    as naive, all gradients in one flat buffer and one all-reduce
  zero1   DDP + torch's ZeroRedundancyOptimizer (optimizer state sharded over the ranks)
  fsdp2   torch.distributed.fsdp.fully_shard per block and the root (--fsdp-compute-dtype)
  adapter-ddp, adapter-ddp-bucketed, adapter-sharded-optimizer, adapter-fsdp
          a student's implementations from --adapters (NotImplementedError: a skipped row)
  single  the baseline, run first: one process, the plain model, the per-device batch, the same
          threads (and cores) as one rank

Before timing, each strategy's one SGD step is compared with one process stepping on the
global batch (status `wrong`, untimed, beyond the tolerance); memory per rank is counted from
the tensors each rank holds and measured as `benchmark` measures it (accounting.py).

Reported per (world size, strategy): step time statistics (each step's time is the slowest
rank's; an untimed barrier precedes each step; synced and no_sync steps alternate), samples/s and tokens/s of the global batch,
time spent in communication, scaling efficiency and the learning rates for the global batch:
  comm_ms             naive/flat: the all-reduce loop, timed directly (mean over ranks);
                      ddp/zero1: step time minus the same step under no_sync() (no gradient
                      all-reduce): the communication backward could not hide; adapters:
                      their on_after_backward timed; fsdp2: all-gather + reduce-scatter time
                      of one profiled step
  scaling_efficiency  samples_per_s(N) / (N * samples_per_s(single)), the single baseline
                      being one process at the per-device batch (weak scaling: 1.0 is perfect)
  compute_slowdown    no_sync step / single step: how much slower a rank computes while the
                      others run (shared cores, memory bandwidth, clocks); 1.0 = not at all.
                      So efficiency ~= 1 / (compute_slowdown * (1 + exposed comm / no_sync step))
  lr_linear, lr_sqrt  base_lr * (global / base batch) and base_lr * sqrt(global / base batch)
"""

from .cli import build_parser, main, units_for
from .record import (
    DdpRecord,
    attach_baseline,
    record_for,
    scaled_learning_rates,
    scaling_efficiency,
)
from .strategies import STRATEGIES
from .trainer import DdpUnit, Trainer, ddp_worker, reference_step, time_interleaved

__all__ = [
    "STRATEGIES",
    "DdpRecord",
    "DdpUnit",
    "Trainer",
    "attach_baseline",
    "build_parser",
    "ddp_worker",
    "main",
    "record_for",
    "reference_step",
    "scaled_learning_rates",
    "scaling_efficiency",
    "time_interleaved",
    "units_for",
]
