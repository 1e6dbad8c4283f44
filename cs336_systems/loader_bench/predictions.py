"""What the loader's numbers should be: the verdict bands and closed-form predictions."""

from __future__ import annotations

from .config import BenchConfig, LoaderConfig

NOT_INPUT_BOUND_PCT = 5.0  # TensorFlow's input-pipeline analyzer bands (tf.data performance guide)
INPUT_BOUND_PCT = 20.0


def verdict(data_wait_pct: float) -> str:
    if data_wait_pct < NOT_INPUT_BOUND_PCT:
        return "not input-bound"
    if data_wait_pct <= INPUT_BOUND_PCT:
        return "moderately input-bound"
    return "input-bound"


def predicted_buffer_bytes(num_workers: int, prefetch_factor: int | None, batch_bytes: int, pinned: bool) -> int:
    """Host RAM the loader's batches may occupy (an upper bound, reached when compute is the
    bottleneck and every queue is full).

    The DataLoader keeps num_workers * prefetch_factor batches in flight (torch.utils.data.DataLoader docs, prefetch_factor;
    one when num_workers is 0, loaded by the main process), and the training step still holds the
    previous batch while next() runs: in_flight + 1 batches. With pin_memory in effect, a batch
    not yet pinned sits in shared memory and a pinned one in page-locked memory (which torch's
    host allocator caches): up to in_flight more. Not included: the batch each worker is
    assembling item by item, and each worker's own interpreter (the worker USS column).
    """
    in_flight = num_workers * prefetch_factor if num_workers > 0 else 1
    return (in_flight + 1 + (in_flight if pinned else 0)) * batch_bytes


def predicted_epoch_s(steps: int, fetch_batch_s: float, compute_s: float, num_workers: int) -> float:
    """Closed form of an epoch when one batch takes `fetch_batch_s` to fetch (its items one
    after another) and a step `compute_s` to compute. Without workers the main process
    fetches, then computes. With W workers the first batch costs a whole fetch, after which
    batches arrive every fetch/W and a step takes max(compute, fetch / W). Ignores worker
    start-up and inter-process transfer."""
    if steps <= 0:
        return 0.0
    if num_workers == 0:
        return steps * (fetch_batch_s + compute_s)
    return fetch_batch_s + (steps - 1) * max(compute_s, fetch_batch_s / num_workers) + compute_s


def predicted_samples_per_s(
    bench: BenchConfig, loader: LoaderConfig, epoch: int, steps_per_process: int
) -> float | None:
    """The closed form (predicted_epoch_s) for the simulated and HTTP stores with the stand-in
    compute; None where fetch or compute time is not known in advance."""
    if bench.storage not in ("simulated", "http") or bench.compute != "sleep" or steps_per_process <= 0:
        return None
    fetch = bench.batch_size * bench.model.mean_item_s(epoch, bench.item_bytes)
    seconds = predicted_epoch_s(steps_per_process, fetch, bench.compute_ms / 1e3, loader.num_workers)
    return loader.processes * steps_per_process * bench.batch_size / seconds if seconds > 0 else None
