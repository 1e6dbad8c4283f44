"""python -m cs336_systems.loader_bench: is training waiting for its data?

Feeds a real torch.utils.data.DataLoader into a real training step and measures, for
each step, the time the training loop is blocked in next(iterator) (data wait), the
host-to-device copy and the compute, then per epoch: samples/s, data-wait %,
compute-idle % and a verdict. Sweeps the loader's flags and recommends the fastest
combination whose predicted host-RAM buffer fits --ram-budget.

Examples:
    python -m cs336_systems.loader_bench --storage simulated --latency-ms 10 --batch-size 8 \\
        --compute-ms 20 --num-workers 0 1 2 4 8 --epochs 2 --output results/loader.csv
    python -m cs336_systems.loader_bench --storage http --latency-ms 50 --bandwidth 20MB \\
        --batch-size 1 --num-workers 0 --processes 1 3
    python -m cs336_systems.loader_bench --dataset my_pkg.data:make_dataset --compute-ms 100

Definitions (per epoch; docs/reference.md section 5):
  data_wait_pct     100 * time blocked in next(iterator) / epoch wall time (torchtitan's data_loading %)
  compute_idle_pct  100 * (1 - compute time / wall time) (1 - MLPerf Storage's accelerator utilisation)
  verdict           TensorFlow's input-pipeline bands on data_wait_pct: < 5 not input-bound,
                    5-20 moderately input-bound, > 20 input-bound
  predicted_buffer_bytes  batches in flight (num_workers * prefetch_factor; 1 when num_workers is 0)
                    plus the one the training step holds, times the batch bytes; with pin_memory
                    in effect each in-flight batch may also have its page-locked copy
Timing: host clock (time.perf_counter) for the wait and the epoch; the copy and the compute
with the same host clock on CPU, and with CUDA event pairs on GPU, read after one
synchronize at the end of the epoch so the host can run ahead of the GPU as in training.
The epoch's wall time is read after that synchronize.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import math
import multiprocessing as mp
import os
import queue
import random
import shlex
import shutil
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import psutil
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Sampler

from cs336_systems.argtypes import (
    ArgumentParser,
    boolean,
    byte_size,
    fail,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from cs336_systems.device import DeviceError, resolve_device
from cs336_systems.loading import load_callable
from cs336_systems.models import ModelConfig, TransformerLM
from cs336_systems.monitor import add_monitor_arguments, check_monitor_arguments, monitored
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
from cs336_systems.runner import make_optimizer
from cs336_systems.stats import summarize
from cs336_systems.storage import (
    STORAGE_KINDS,
    HttpStore,
    LatencyModel,
    LocalStore,
    SimulatedStore,
    StorageError,
    evict_page_cache,
    http_server,
    model_from_args,
    write_items,
)
from cs336_systems.units import format_bytes

PROG = "python -m cs336_systems.loader_bench"
NOT_INPUT_BOUND_PCT = 5.0  # TensorFlow's input-pipeline analyzer bands (docs/reference.md section 5)
INPUT_BOUND_PCT = 20.0
MEMORY_SAMPLE_INTERVAL_S = 0.1
TINY_MODEL_MAX_CONTEXT = 128
COMPUTE_KINDS = ("sleep", "tiny-model")
LOADER_FLAGS = ("processes", "num_workers", "prefetch_factor", "pin_memory", "persistent_workers")


def verdict(data_wait_pct: float) -> str:
    if data_wait_pct < NOT_INPUT_BOUND_PCT:
        return "not input-bound"
    if data_wait_pct <= INPUT_BOUND_PCT:
        return "moderately input-bound"
    return "input-bound"


def predicted_buffer_bytes(num_workers: int, prefetch_factor: int | None, batch_bytes: int, pinned: bool) -> int:
    """Host RAM the loader's batches may occupy (an upper bound, reached when compute is the
    bottleneck and every queue is full).

    The DataLoader keeps num_workers * prefetch_factor batches in flight (docs/reference.md section 5;
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


# -- configuration -----------------------------------------------------------------------


@dataclass(frozen=True)
class LoaderConfig:
    """One combination of the swept flags."""

    num_workers: int = 0
    prefetch_factor: int | None = None  # None when num_workers is 0 (torch refuses one then)
    pin_memory: bool = False
    persistent_workers: bool = False
    processes: int = 1
    child_processes: bool = False  # True: the `processes` run as separate child processes

    def describe(self) -> str:
        text = (
            f"workers={self.num_workers} prefetch={self.prefetch_factor} pin={str(self.pin_memory).lower()} "
            f"persistent={str(self.persistent_workers).lower()}"
        )
        return f"processes={self.processes} {text}" if self.child_processes else text

    def flags(self) -> str:
        parts = [f"--num-workers {self.num_workers}"]
        if self.prefetch_factor is not None:
            parts.append(f"--prefetch-factor {self.prefetch_factor}")
        parts += [
            f"--pin-memory {str(self.pin_memory).lower()}",
            f"--persistent-workers {str(self.persistent_workers).lower()}",
        ]
        if self.child_processes:
            parts.insert(0, f"--processes {self.processes}")
        return " ".join(parts)


def loader_grid(
    num_workers: Sequence[int],
    prefetch_factors: Sequence[int],
    pin_memory: Sequence[bool],
    persistent_workers: Sequence[bool],
    processes: Sequence[int] | None = None,
) -> list[LoaderConfig]:
    """Every combination, in flag order; prefetch and persistence mean nothing without workers,
    so those combinations collapse into one."""
    configs: list[LoaderConfig] = []
    for n, workers, prefetch, pin, persistent in itertools.product(
        processes or [1], num_workers, prefetch_factors, pin_memory, persistent_workers
    ):
        config = LoaderConfig(
            num_workers=workers,
            prefetch_factor=prefetch if workers > 0 else None,
            pin_memory=pin,
            persistent_workers=persistent if workers > 0 else False,
            processes=n,
            child_processes=processes is not None,
        )
        if config not in configs:
            configs.append(config)
    return configs


@dataclass(frozen=True)
class BenchConfig:
    """What stays fixed across the sweep: the data, the step, the device."""

    storage: str = "simulated"  # simulated, local, http, or "dataset" for --dataset
    num_items: int = 256
    item_bytes: int | None = 64 * 1024
    batch_size: int = 8
    epochs: int = 2
    model: LatencyModel = field(default_factory=LatencyModel)
    compute: str = "sleep"  # "sleep": stand-in of compute_ms; "tiny-model": a real training step
    compute_ms: float | None = 20.0
    device: str = "cpu"
    seed: int = 0
    dataset: str | None = None  # package.module:callable returning a map-style Dataset
    location: str | None = None  # data directory (local) or URL (http), set once the store is up
    data_dir: str | None = None  # where the item files are (local and http)

    @property
    def batch_bytes(self) -> int | None:
        return None if self.item_bytes is None else self.batch_size * self.item_bytes

    def open_store(self):
        if self.storage == "simulated":
            return SimulatedStore(self.model, self.item_bytes)
        if self.storage == "local":
            return LocalStore(self.location)
        if self.storage == "http":
            return HttpStore(self.location)
        raise ValueError(f"no store for storage {self.storage!r}")


class DatasetError(ValueError):
    """A --dataset that cannot be imported, called or used."""


def load_dataset(spec: str) -> Dataset:
    """Call 'package.module:callable' (no arguments); it must return a map-style Dataset."""
    target = load_callable(spec, "--dataset", DatasetError)
    try:
        dataset = target()
    except Exception as exc:
        raise DatasetError(f"--dataset {spec} raised {type(exc).__name__}: {exc}") from exc
    if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        raise DatasetError(f"--dataset {spec} returned {type(dataset).__name__}, expected a map-style Dataset")
    return dataset


# -- the data ----------------------------------------------------------------------------


class StoreDataset(Dataset):
    """Items of a store as uint8 tensors. Keys are (epoch, index) pairs from EpochSampler."""

    def __init__(self, bench: BenchConfig):
        self.bench = bench
        self._store = None  # opened in each worker on first use

    def __len__(self) -> int:
        return self.bench.num_items

    def __getitem__(self, key: tuple[int, int]) -> torch.Tensor:
        if self._store is None:
            self._store = self.bench.open_store()
        epoch, index = key
        return torch.frombuffer(bytearray(self._store.fetch(index, epoch)), dtype=torch.uint8)


class EpochSampler(Sampler):
    """A seeded shuffle of `indices`, new each epoch. With `tag_epoch` it yields (epoch, index):
    a persistent worker keeps the Dataset it started with, so an epoch set on the Dataset in
    the main process would never reach it, while sampler output does."""

    def __init__(self, indices: Sequence[int], seed: int, tag_epoch: bool):
        self.indices, self.seed, self.tag_epoch = list(indices), seed, tag_epoch
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.indices)

    def __iter__(self):
        order = list(self.indices)
        random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        return iter([(self.epoch, i) for i in order] if self.tag_epoch else order)


def _worker_init(worker_id: int) -> None:
    torch.set_num_threads(1)  # workers fetch; they must not fight the training step for cores


def make_loader(dataset: Dataset, sampler: Sampler, bench: BenchConfig, loader: LoaderConfig, pin: bool) -> DataLoader:
    kwargs = {}
    if loader.num_workers > 0:
        kwargs = dict(prefetch_factor=loader.prefetch_factor, persistent_workers=loader.persistent_workers)
    return DataLoader(
        dataset,
        batch_size=bench.batch_size,
        sampler=sampler,
        drop_last=True,
        num_workers=loader.num_workers,
        pin_memory=pin,
        worker_init_fn=_worker_init,
        **kwargs,
    )


def to_device(batch, device: torch.device, non_blocking: bool):
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return {key: to_device(value, device, non_blocking) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(value, device, non_blocking) for value in batch)
    return batch


def batch_nbytes(batch) -> int:
    if isinstance(batch, torch.Tensor):
        return batch.numel() * batch.element_size()
    if isinstance(batch, dict):
        return sum(batch_nbytes(value) for value in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(batch_nbytes(value) for value in batch)
    return 0


# -- the step ----------------------------------------------------------------------------


def tiny_model_config(item_bytes: int) -> ModelConfig:
    """A 2-layer byte-level LM: items' first bytes are its tokens (vocabulary 256)."""
    context = min(TINY_MODEL_MAX_CONTEXT, item_bytes - 1)
    return ModelConfig(d_model=128, d_ff=512, num_layers=2, num_heads=4, vocab_size=256, context_length=context)


def cuda_sleep_cycles_per_ms(device: torch.device) -> float:
    """GPU clock cycles per millisecond of torch.cuda._sleep, measured with CUDA events."""
    with torch.cuda.device(device):
        torch.cuda._sleep(1000)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 20_000_000
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        return cycles / start.elapsed_time(end)


def compute_description(bench: BenchConfig, device: torch.device) -> str:
    if bench.compute == "tiny-model":
        c = tiny_model_config(bench.item_bytes)
        return f"tiny-model train step (d_model {c.d_model}, {c.num_layers} layers, context {c.context_length})"
    if device.type == "cuda" and hasattr(torch.cuda, "_sleep"):
        return f"GPU spin kernel {bench.compute_ms:g} ms (stand-in)"
    return f"host sleep {bench.compute_ms:g} ms (stand-in: CPU idle, like waiting on a GPU)"


def make_compute(bench: BenchConfig, device: torch.device) -> Callable[[object], None]:
    """The training step fed by the loader (see compute_description)."""
    if bench.compute == "tiny-model":
        config = tiny_model_config(bench.item_bytes)
        torch.manual_seed(bench.seed)
        model = TransformerLM(config).to(device)
        optimizer = make_optimizer(model, device)

        def train_step(batch: torch.Tensor) -> None:
            tokens = batch[:, : config.context_length + 1].long()
            optimizer.zero_grad(set_to_none=True)
            logits = model(tokens[:, :-1])
            F.cross_entropy(logits.reshape(-1, config.vocab_size), tokens[:, 1:].reshape(-1)).backward()
            optimizer.step()

        dummy = torch.randint(0, 256, (bench.batch_size, config.context_length + 1), device=device, dtype=torch.uint8)
        train_step(dummy)  # untimed: creates the optimizer state
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return train_step
    seconds = bench.compute_ms / 1e3
    if device.type == "cuda" and hasattr(torch.cuda, "_sleep"):
        # a kernel that spins for a fixed number of GPU cycles: the GPU is busy, the host is free
        cycles = int(bench.compute_ms * cuda_sleep_cycles_per_ms(device))
        return lambda batch: torch.cuda._sleep(cycles)
    return lambda batch: time.sleep(seconds)


class PhaseTimer:
    """Durations of the copy and compute phases of every step.

    CPU: host clock around each phase. CUDA: an event pair per phase, read only after
    `collect()` synchronizes at the end of the epoch, so timing does not stall the loop.
    """

    def __init__(self, device: torch.device, clock: Callable[[], float] = time.perf_counter):
        self.device, self.clock = device, clock
        self._pending: dict[str, list] = {"h2d": [], "compute": []}

    def time(self, phase: str, fn: Callable[[], object]):
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            result = fn()
            end.record()
            self._pending[phase].append((start, end))
            return result
        start = self.clock()
        result = fn()
        self._pending[phase].append(self.clock() - start)
        return result

    def collect(self) -> dict[str, list[float]]:
        """Milliseconds per phase since the last collect."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            out = {phase: [s.elapsed_time(e) for s, e in pairs] for phase, pairs in self._pending.items()}
        else:
            out = {phase: [1e3 * seconds for seconds in values] for phase, values in self._pending.items()}
        self._pending = {phase: [] for phase in self._pending}
        return out


# -- memory of the loader's processes ------------------------------------------------------


def _shm_used_bytes() -> int | None:
    try:
        return shutil.disk_usage("/dev/shm").used
    except OSError:
        return None


class WorkerMemorySampler:
    """Peak memory of this process's loader workers over an epoch, sampled on a thread.

    worker RSS counts the pages a forked worker shares with the main process (the Python heap
    and libraries it inherited) once per worker; USS is what only the workers hold; /dev/shm
    growth is the batches in flight between workers and the main process (machine-wide).
    """

    def __init__(self, exclude_pids: set[int], interval_s: float = MEMORY_SAMPLE_INTERVAL_S):
        self.exclude, self.interval_s = exclude_pids, interval_s
        self.rss = self.uss = self.shm = 0
        self._stop = threading.Event()
        self._shm0 = _shm_used_bytes()
        self._thread = threading.Thread(target=self._run, name="loader-memory", daemon=True)

    def _sample(self) -> None:
        workers = [p for p in psutil.Process().children() if p.pid not in self.exclude]
        rss = uss = 0
        for worker in workers:
            with contextlib.suppress(psutil.Error):
                info = worker.memory_full_info()
                rss, uss = rss + info.rss, uss + info.uss
        self.rss, self.uss = max(self.rss, rss), max(self.uss, uss)
        shm = _shm_used_bytes()
        if shm is not None and self._shm0 is not None:
            self.shm = max(self.shm, shm - self._shm0)

    def _run(self) -> None:
        delay = 0.01  # start often, so a short epoch still has samples, then every interval_s
        while not self._stop.wait(delay):
            self._sample()
            delay = min(2 * delay, self.interval_s)

    def __enter__(self) -> WorkerMemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


# -- one process's epochs ------------------------------------------------------------------


@dataclass
class EpochMeasurement:
    """Raw measurements of one epoch in one process; times on the host clock (seconds)."""

    epoch: int
    start_s: float
    end_s: float
    steps: int
    samples: int
    wait_ms: list[float]
    h2d_ms: list[float] | None  # None on CPU: there is no copy to make
    compute_ms: list[float]
    final_wait_ms: float  # the next() that ends the epoch (it shuts non-persistent workers down)
    batch_bytes: int | None
    worker_rss_bytes: int | None
    worker_uss_bytes: int | None
    shm_bytes: int | None


def _quiet_loader_warnings() -> None:
    # Both are reported as row notes instead (more workers than cores; pin_memory without a GPU).
    warnings.filterwarnings("ignore", message=".*worker processes in total.*")
    warnings.filterwarnings("ignore", message=".*'pin_memory' argument is set as true but no accelerator.*")


def run_epochs(
    bench: BenchConfig,
    loader: LoaderConfig,
    indices: Sequence[int] | None = None,
    barrier=None,
    clock: Callable[[], float] = time.perf_counter,
) -> list[EpochMeasurement]:
    """Build the loader and the step, then run `bench.epochs` epochs over `indices`
    (default: every item), each timed step by step. `barrier` (processes mode) is waited
    on before each epoch so all processes start it together."""
    _quiet_loader_warnings()
    device = resolve_device(bench.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # the events and the spin kernel go to this device's stream
    if bench.dataset is not None:
        dataset, tag_epoch = load_dataset(bench.dataset), False
    else:
        dataset, tag_epoch = StoreDataset(bench), True
    indices = list(range(len(dataset))) if indices is None else list(indices)
    sampler = EpochSampler(indices, bench.seed, tag_epoch)
    pin = loader.pin_memory and device.type == "cuda"
    data = make_loader(dataset, sampler, bench, loader, pin)
    compute = make_compute(bench, device)
    timer = PhaseTimer(device, clock)
    not_workers = {p.pid for p in psutil.Process().children()}  # e.g. the HTTP server
    measurements, iterator = [], None
    try:
        for epoch in range(bench.epochs):
            sampler.set_epoch(epoch)
            if barrier is not None:
                barrier.wait()
            waits, batch_bytes, batch = [], None, None
            sampler_cm = WorkerMemorySampler(not_workers) if loader.num_workers > 0 else contextlib.nullcontext()
            with sampler_cm as memory:
                start = clock()
                iterator = iter(data)
                while True:
                    before = clock()
                    try:
                        batch = next(iterator)
                    except StopIteration:
                        final_wait_ms = 1e3 * (clock() - before)
                        break
                    waits.append(1e3 * (clock() - before))
                    if batch_bytes is None:
                        batch_bytes = batch_nbytes(batch)
                    if device.type == "cuda":
                        batch = timer.time("h2d", functools.partial(to_device, batch, device, pin))
                    timer.time("compute", functools.partial(compute, batch))
                phases = timer.collect()  # synchronizes on CUDA before the clock is read
                end = clock()
                iterator = batch = None
            steps = len(waits)
            measurements.append(
                EpochMeasurement(
                    epoch=epoch,
                    start_s=start,
                    end_s=end,
                    steps=steps,
                    samples=steps * bench.batch_size,
                    wait_ms=waits,
                    h2d_ms=phases["h2d"] if device.type == "cuda" else None,
                    compute_ms=phases["compute"],
                    final_wait_ms=final_wait_ms,
                    batch_bytes=batch_bytes,
                    worker_rss_bytes=memory.rss if memory else None,
                    worker_uss_bytes=memory.uss if memory else None,
                    shm_bytes=memory.shm if memory else None,
                )
            )
    except BaseException:
        # stop this configuration's workers now, not at a later garbage collection (which waits
        # for a worker that raised for up to 5 s)
        for running in (iterator, getattr(data, "_iterator", None)):
            if hasattr(running, "_shutdown_workers"):
                running._shutdown_workers()
        raise
    del data
    gc.collect()  # shuts persistent workers down before the next configuration starts
    return measurements


def error_text(exc: BaseException) -> str:
    """One line. An error raised in a DataLoader worker comes back wrapped ("Caught OSError in
    DataLoader worker process 0. Original Traceback ..."): keep the original error's line too."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}"
    if len(lines) > 1 and "Original Traceback" in str(exc):
        text += f" {lines[-1]}"
    return text


def _process_main(bench, loader, indices, barrier, results, rank) -> None:
    torch.set_num_threads(1)
    try:
        results.put((rank, run_epochs(bench, loader, indices, barrier), None))
    except BaseException as exc:  # the parent must hear about any failure, or it waits forever
        barrier.abort()
        results.put((rank, None, error_text(exc)))
        if not isinstance(exc, Exception):
            raise


CHILD_TIMEOUT_S = 3600.0


def run_processes(bench: BenchConfig, loader: LoaderConfig) -> list[list[EpochMeasurement]]:
    """`loader.processes` independent processes, each fetching and computing its share of the
    items (item i goes to process i mod N), all starting each epoch together."""
    n = loader.processes
    # fork is quick and safe on CPU; CUDA cannot be used in a forked child
    ctx = mp.get_context("spawn" if resolve_device(bench.device).type == "cuda" else "fork")
    barrier, results = ctx.Barrier(n), ctx.Queue()
    indices = list(range(bench.num_items))
    processes = [
        ctx.Process(target=_process_main, args=(bench, loader, indices[rank::n], barrier, results, rank))
        for rank in range(n)
    ]
    for process in processes:
        process.start()
    collected: dict[int, list[EpochMeasurement]] = {}
    errors = []
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    try:
        while len(collected) + len(errors) < n:
            try:
                rank, measured, error = results.get(timeout=1.0)
            except queue.Empty:
                dead = [p.exitcode for p in processes if p.exitcode not in (None, 0)]
                if dead:  # killed (e.g. by the OOM killer) before it could report
                    raise RuntimeError(f"a process died with exit code {dead[0]} before reporting") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"processes did not finish within {CHILD_TIMEOUT_S:.0f} s") from None
                continue
            if error is not None:
                errors.append(error)
            else:
                collected[rank] = measured
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join()
    if errors:
        raise RuntimeError(f"in a child process: {errors[0]}")
    return [collected[rank] for rank in range(n)]


# -- the record ------------------------------------------------------------------------------


@dataclass
class LoaderRecord(Record):
    """One epoch of one loader configuration: what was asked, what happened, where."""

    # the data
    storage: str
    dataset: str | None
    num_items: int
    item_bytes: int | None
    batch_size: int
    latency_ms: float | None
    bandwidth_bytes_per_s: float | None
    jitter_ms: float | None
    cache_hit_rate: float | None  # this epoch's
    warm_latency_ms: float | None
    # the step
    compute: str
    compute_ms: float | None
    device: str
    # the swept flags
    processes: int
    num_workers: int
    prefetch_factor: int | None
    pin_memory: bool
    persistent_workers: bool
    child_processes: bool
    epochs: int
    epoch: int | None
    seed: int
    ram_budget_bytes: int | None
    # outcome
    status: str
    error: str | None = None
    steps: int | None = None
    samples: int | None = None
    wall_s: float | None = None
    samples_per_s: float | None = None
    predicted_samples_per_s: float | None = None
    data_wait_s: float | None = None
    data_wait_pct: float | None = None
    first_batch_wait_ms: float | None = None
    wait_p50_ms: float | None = None
    wait_p90_ms: float | None = None
    h2d_s: float | None = None
    h2d_pct: float | None = None
    compute_s: float | None = None
    compute_idle_pct: float | None = None
    verdict: str | None = None
    batch_bytes: int | None = None
    pinned: bool | None = None  # pin_memory in effect (it needs a GPU)
    predicted_buffer_bytes: int | None = None
    worker_rss_bytes: int | None = None
    worker_uss_bytes: int | None = None
    shm_bytes: int | None = None
    notes: str | None = None
    timestamp: str = field(default_factory=utc_timestamp)
    environment: Environment | None = None
    step_wait_ms: list[float] = samples_field()
    step_h2d_ms: list[float] = samples_field()
    step_compute_ms: list[float] = samples_field()


LOADER_FIELDS = LoaderRecord.row_fields()
MARKDOWN_COLUMNS = (
    "processes",
    "num_workers",
    "prefetch_factor",
    "pin_memory",
    "persistent_workers",
    "epoch",
    "status",
    "samples_per_s",
    "predicted_samples_per_s",
    "data_wait_pct",
    "compute_idle_pct",
    "verdict",
    "first_batch_wait_ms",
    "wait_p50_ms",
    "predicted_buffer_mib",
    "worker_rss_mib",
    "worker_uss_mib",
    "shm_mib",
)
LABEL_COLUMNS = ("processes", "num_workers", "prefetch_factor", "pin_memory", "persistent_workers", "epoch")
TITLE = "cs336-systems loader benchmark"


def render(rows: Sequence[dict], title: str = TITLE) -> str:
    """The core Markdown rendering, with byte columns shown in MiB."""

    def mib(value) -> float | None:
        return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value) / 2**20

    shown = [
        {**row, **{name.replace("_bytes", "_mib"): mib(row.get(name)) for name in
                   ("predicted_buffer_bytes", "worker_rss_bytes", "worker_uss_bytes", "shm_bytes")}}
        for row in rows
    ]  # fmt: skip
    text = render_markdown(shown, title=title, columns=MARKDOWN_COLUMNS, label_columns=LABEL_COLUMNS)
    head, _, _ = text.rpartition("std is the sample standard deviation")
    return head + (
        "data_wait_pct = time blocked in next(iterator) / wall; compute_idle_pct = 1 - compute / wall; verdict bands "
        "< 5% / 5-20% / > 20% (TensorFlow's input-pipeline analyzer). predicted_buffer = (workers x prefetch + 1) x "
        "batch bytes (+ workers x prefetch pinned copies on a GPU); worker RSS counts pages shared with the main process once per worker, USS only "
        "the workers' own; shm = batches in flight in /dev/shm.\n"
    )


def new_record(bench: BenchConfig, loader: LoaderConfig, env, compute_desc: str, ram_budget: int | None, epoch):
    model = bench.model if bench.storage in ("simulated", "http") else None
    return LoaderRecord(
        storage=bench.storage,
        dataset=bench.dataset,
        num_items=bench.num_items,
        item_bytes=bench.item_bytes,
        batch_size=bench.batch_size,
        latency_ms=model.latency_ms if model else None,
        bandwidth_bytes_per_s=model.bandwidth_bytes_per_s if model else None,
        jitter_ms=model.jitter_ms if model else None,
        cache_hit_rate=model.hit_rate(epoch) if model and epoch is not None else None,
        warm_latency_ms=model.warm_latency_ms if model else None,
        compute=compute_desc,
        compute_ms=bench.compute_ms if bench.compute == "sleep" else None,
        device=bench.device,
        processes=loader.processes,
        num_workers=loader.num_workers,
        prefetch_factor=loader.prefetch_factor,
        pin_memory=loader.pin_memory,
        persistent_workers=loader.persistent_workers,
        child_processes=loader.child_processes,
        epochs=bench.epochs,
        epoch=epoch,
        seed=bench.seed,
        ram_budget_bytes=ram_budget,
        status="ok",
        environment=env,
    )


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


def epoch_record(
    bench: BenchConfig,
    loader: LoaderConfig,
    measured: Sequence[EpochMeasurement],
    env,
    compute_desc: str,
    ram_budget: int | None,
    notes: Sequence[str] = (),
) -> LoaderRecord:
    """One epoch's row from the measurements of every process (one unless processes mode)."""
    epoch = measured[0].epoch
    record = new_record(bench, loader, env, compute_desc, ram_budget, epoch)
    walls = [m.end_s - m.start_s for m in measured]
    total_wall = sum(walls)
    record.wall_s = max(m.end_s for m in measured) - min(m.start_s for m in measured)
    record.steps = sum(m.steps for m in measured)
    record.samples = sum(m.samples for m in measured)
    record.samples_per_s = record.samples / record.wall_s if record.wall_s > 0 else None
    record.predicted_samples_per_s = predicted_samples_per_s(bench, loader, epoch, min(m.steps for m in measured))
    waits = [w for m in measured for w in m.wait_ms]
    computes = [c for m in measured for c in m.compute_ms]
    record.data_wait_s = (sum(waits) + sum(m.final_wait_ms for m in measured)) / 1e3
    record.data_wait_pct = 100 * record.data_wait_s / total_wall if total_wall > 0 else None
    record.compute_s = sum(computes) / 1e3
    record.compute_idle_pct = 100 * (1 - record.compute_s / total_wall) if total_wall > 0 else None
    record.verdict = verdict(record.data_wait_pct) if record.data_wait_pct is not None else None
    if waits:
        record.first_batch_wait_ms = max(m.wait_ms[0] for m in measured if m.wait_ms)
        wait_summary = summarize(waits)
        record.wait_p50_ms, record.wait_p90_ms = wait_summary.median, wait_summary.p90
    if measured[0].h2d_ms is not None:
        copies = [h for m in measured for h in m.h2d_ms]
        record.h2d_s = sum(copies) / 1e3
        record.h2d_pct = 100 * record.h2d_s / total_wall if total_wall > 0 else None
        record.step_h2d_ms = copies
    record.step_wait_ms, record.step_compute_ms = waits, computes
    record.batch_bytes = measured[0].batch_bytes
    record.pinned = loader.pin_memory and resolve_device(bench.device).type == "cuda"
    if record.batch_bytes is not None:
        record.predicted_buffer_bytes = loader.processes * predicted_buffer_bytes(
            loader.num_workers, loader.prefetch_factor, record.batch_bytes, record.pinned
        )
    if loader.num_workers > 0:
        record.worker_rss_bytes = sum(m.worker_rss_bytes or 0 for m in measured)
        record.worker_uss_bytes = sum(m.worker_uss_bytes or 0 for m in measured)
        record.shm_bytes = max(m.shm_bytes or 0 for m in measured)
    if record.steps == 0:
        record.status, record.error = "error", "no full batch: fewer items than batch_size (per process)"
    record.notes = "; ".join(notes) or None
    return record


def configuration_notes(bench: BenchConfig, loader: LoaderConfig, device: torch.device, location_note: str | None):
    notes = []
    cores = os.cpu_count() or 1
    workers = loader.processes * max(1, loader.num_workers)
    if workers > cores:
        notes.append(
            f"{workers} fetching processes on {cores} CPU cores: fine while fetching waits (latency), "
            "harmful when decoding is CPU-bound"
        )
    if loader.pin_memory and device.type != "cuda":
        notes.append("pin_memory has no effect without a GPU (torch ignores it)")
    if location_note:
        notes.append(location_note)
    return notes


def run_configuration(bench: BenchConfig, loader: LoaderConfig) -> list[list[EpochMeasurement]]:
    """Per process, per epoch measurements of one combination."""
    if loader.child_processes:
        return run_processes(bench, loader)
    return [run_epochs(bench, loader)]


def records_for(bench, loader, per_process, env, compute_desc, ram_budget, notes) -> list[LoaderRecord]:
    return [
        epoch_record(bench, loader, [process[epoch] for process in per_process], env, compute_desc, ram_budget, notes)
        for epoch in range(bench.epochs)
    ]


# -- the recommendation ------------------------------------------------------------------------


def _normal(value):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


@dataclass(frozen=True)
class Recommendation:
    flags: dict
    samples_per_s: float  # over all epochs: total samples / total wall time
    predicted_buffer_bytes: int | None
    worker_rss_bytes: int | None
    ram_budget_bytes: int | None
    fastest_overall: dict  # flags of the fastest combination, budget or not
    excluded: int  # combinations whose predicted buffer exceeds the budget


def recommend(rows: Sequence[dict], ram_budget_bytes: int | None) -> Recommendation | None:
    """The fastest combination (total samples / total wall over its epochs) whose predicted
    buffer fits the budget. Works on records' rows or rows read back from a results file."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        if row.get("status") == "ok":
            groups.setdefault(tuple(_normal(row.get(name)) for name in LOADER_FLAGS), []).append(row)
    scored = []
    for key, group in groups.items():
        wall = sum(float(r["wall_s"]) for r in group)
        buffers = [_normal(r.get("predicted_buffer_bytes")) for r in group]
        rss = [_normal(r.get("worker_rss_bytes")) for r in group]
        scored.append(
            (
                sum(int(r["samples"]) for r in group) / wall if wall > 0 else 0.0,
                dict(zip(LOADER_FLAGS, key)),
                max((b for b in buffers if b is not None), default=None),
                max((r for r in rss if r is not None), default=None),
            )
        )
    if not scored:
        return None
    scored.sort(key=lambda item: -item[0])
    fits = [s for s in scored if ram_budget_bytes is None or s[2] is None or s[2] <= ram_budget_bytes]
    if not fits:
        return None
    best = fits[0]
    return Recommendation(
        flags=best[1],
        samples_per_s=best[0],
        predicted_buffer_bytes=best[2],
        worker_rss_bytes=best[3],
        ram_budget_bytes=ram_budget_bytes,
        fastest_overall=scored[0][1],
        excluded=len(scored) - len(fits),
    )


def recommendation_text(rec: Recommendation | None, ram_budget_bytes: int | None) -> str:
    if rec is None:
        return "no recommendation: no combination ran and fits --ram-budget"
    flags = rec.flags
    config = LoaderConfig(
        num_workers=flags["num_workers"],
        prefetch_factor=flags["prefetch_factor"],
        pin_memory=bool(flags["pin_memory"]),
        persistent_workers=bool(flags["persistent_workers"]),
        processes=flags["processes"] or 1,
        child_processes=(flags["processes"] or 1) > 1,
    )
    budget = "no budget" if ram_budget_bytes is None else f"budget {format_bytes(ram_budget_bytes)}"
    lines = [
        f"recommended: {config.flags()}",
        f"  {rec.samples_per_s:.1f} samples/s over all epochs; predicted host buffer "
        f"{format_bytes(rec.predicted_buffer_bytes)} ({budget}); measured worker RSS {format_bytes(rec.worker_rss_bytes) or 'n/a'}",
    ]
    if rec.excluded:
        lines.append(f"  {rec.excluded} faster or slower combination(s) left out: predicted buffer over the budget")
    return "\n".join(lines)


# -- the command line ----------------------------------------------------------------------------


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    data = parser.add_argument_group("data")
    data.add_argument("--storage", choices=STORAGE_KINDS, default="simulated")
    data.add_argument("--dataset", metavar="package.module:callable",
                      help="your own map-style Dataset (called with no arguments); replaces --storage")  # fmt: skip
    data.add_argument("--num-items", type=positive_int, default=256)
    data.add_argument("--item-bytes", type=byte_size, default=64 * 1024, metavar="SIZE", help="e.g. 500KB (64KiB)")
    data.add_argument("--batch-size", type=positive_int, default=8)
    data.add_argument("--epochs", type=positive_int, default=2)
    data.add_argument(
        "--data-dir", type=Path, help="local/http: where the item files are written (default: a temp dir)"
    )
    store = parser.add_argument_group("simulated and http stores: time to fetch one item")
    store.add_argument("--latency-ms", type=non_negative_float, default=5.0, help="per item, before the first byte (5)")
    store.add_argument(
        "--bandwidth", type=byte_size, metavar="SIZE", help="bytes per second per item, e.g. 20MB (unlimited)"
    )
    store.add_argument("--jitter-ms", type=non_negative_float, default=0.0, help="uniform +- on the latency (0)")
    store.add_argument("--cache-hit-rates", type=non_negative_float, nargs="+", default=[0.0], metavar="RATE",
                       help="fraction of items served from a warm cache in epoch 0, 1, ... (last repeats); "
                       "'0 0.9' is a cold first epoch (0)")  # fmt: skip
    store.add_argument("--warm-latency-ms", type=non_negative_float, default=0.0, help="time of a cache hit (0)")
    step = parser.add_argument_group("the training step")
    step.add_argument("--compute-ms", type=positive_float, help="stand-in step of this many ms (20)")
    step.add_argument("--model", choices=("tiny",), help="a real training step of a tiny byte-level Transformer LM")
    step.add_argument("--device", default="auto", help="auto (cuda when available), cpu, cuda or cuda:N")
    step.add_argument("--seed", type=int, default=0)
    sweep = parser.add_argument_group("loader flags (lists: every combination runs)")
    sweep.add_argument("--num-workers", type=non_negative_int, nargs="+", default=[0], metavar="N")
    sweep.add_argument("--prefetch-factor", type=positive_int, nargs="+", default=[2], metavar="N")
    sweep.add_argument("--pin-memory", type=boolean, nargs="+", default=[False], metavar="BOOL")
    sweep.add_argument("--persistent-workers", type=boolean, nargs="+", default=[False], metavar="BOOL")
    sweep.add_argument("--processes", type=positive_int, nargs="+", metavar="N",
                       help="run N independent processes, each fetching and computing its share (the items "
                       "i with i mod N = rank); one row per N with the aggregate samples/s")  # fmt: skip
    sweep.add_argument("--ram-budget", type=byte_size, metavar="SIZE",
                       help="host RAM the loader's buffer may use (default: RAM available now)")  # fmt: skip
    parser.add_argument("--output", action="append", default=[], metavar="PATH", help=".csv, .md or .jsonl; repeatable")
    add_monitor_arguments(parser)
    return parser


def bench_from_args(args) -> BenchConfig:
    """Validate everything a user can get wrong; raise ValueError with one line."""
    model = model_from_args(args)
    if args.model and args.compute_ms is not None:
        raise ValueError("give either --model tiny or --compute-ms, not both")
    if args.model and args.dataset:
        raise ValueError("--model tiny reads the built-in stores' bytes as tokens; use --compute-ms with --dataset")
    if args.model and args.item_bytes < 3:
        raise ValueError("--model tiny needs --item-bytes of at least 3 (tokens and next-token targets)")
    storage, num_items, item_bytes = args.storage, args.num_items, args.item_bytes
    if args.dataset:
        num_items, item_bytes, storage = len(load_dataset(args.dataset)), None, "dataset"
    per_process = num_items // max(args.processes or [1])
    if per_process < args.batch_size:
        raise ValueError(
            f"{num_items} items make no full batch of {args.batch_size}"
            + (f" per process with {max(args.processes)} processes" if args.processes else "")
        )
    if storage in ("local", "http"):
        need = num_items * item_bytes
        where = args.data_dir or Path(tempfile.gettempdir())
        where = where if where.exists() else where.parent
        if where.exists() and shutil.disk_usage(where).free < need:
            raise ValueError(f"{format_bytes(need)} of item files do not fit on {where}")
    return BenchConfig(
        storage=storage,
        num_items=num_items,
        item_bytes=item_bytes,
        batch_size=args.batch_size,
        epochs=args.epochs,
        model=model,
        compute="tiny-model" if args.model else "sleep",
        compute_ms=None if args.model else (args.compute_ms if args.compute_ms is not None else 20.0),
        device=args.device,
        seed=args.seed,
        dataset=args.dataset,
    )


@contextlib.contextmanager
def prepared_storage(bench: BenchConfig, data_dir: Path | None) -> Iterator[BenchConfig]:
    """Write the item files and start the HTTP server when the store needs them."""
    if bench.storage not in ("local", "http"):
        yield bench
        return
    with contextlib.ExitStack() as stack:
        if data_dir is None:
            data_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cs336-loader-")))
        print(f"writing {bench.num_items} items of {format_bytes(bench.item_bytes)} to {data_dir}", file=sys.stderr)
        write_items(data_dir, bench.num_items, bench.item_bytes, bench.seed)
        if bench.storage == "local":
            yield replace(bench, location=str(data_dir), data_dir=str(data_dir))
            return
        url = stack.enter_context(http_server(data_dir, bench.model))
        print(f"HTTP server at {url}", file=sys.stderr)
        yield replace(bench, location=url, data_dir=str(data_dir))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    try:
        bench = bench_from_args(args)
        device = resolve_device(args.device)
        bench = replace(bench, device=str(device))
        check_monitor_arguments(args)
        sink = ResultSink(check_output_paths(args.output), fields=LOADER_FIELDS, render=render)
    except (ValueError, DeviceError, ResultFileError, StorageError) as exc:
        return fail(PROG, str(exc))
    ram_budget = args.ram_budget if args.ram_budget is not None else psutil.virtual_memory().available
    grid = loader_grid(args.num_workers, args.prefetch_factor, args.pin_memory, args.persistent_workers, args.processes)
    env = collect_environment(device)
    rows: list[dict] = []
    compute_desc = compute_description(bench, device)
    label = f"{PROG} {shlex.join(argv)}"
    with monitored(args.monitor, args.monitor_interval, label), prepared_storage(bench, args.data_dir) as bench:
        print(f"{len(grid)} configurations x {bench.epochs} epochs, {bench.storage} storage, {compute_desc}",
              file=sys.stderr)  # fmt: skip
        for loader in grid:
            location_note = None
            if bench.data_dir is not None:
                reason = evict_page_cache(bench.data_dir)
                location_note = reason or "item files evicted from the page cache before epoch 0"
            notes = configuration_notes(bench, loader, device, location_note)
            try:
                per_process = run_configuration(bench, loader)
                records = records_for(bench, loader, per_process, env, compute_desc, ram_budget, notes)
            except Exception as exc:  # a failing configuration is a row; the sweep goes on
                record = new_record(bench, loader, env, compute_desc, ram_budget, None)
                record.status, record.error = "error", error_text(exc)
                if os.environ.get("CS336_DEBUG"):
                    traceback.print_exc()
                records = [record]
            for record in records:
                sink.write(record)
                rows.append(record.to_row())
            print(progress_line(loader, records), file=sys.stderr, flush=True)
    print(render(rows))
    print(recommendation_text(recommend(rows, ram_budget), ram_budget))
    for path in args.output:
        print(f"wrote {path}", file=sys.stderr)
    return 0 if all(row["status"] == "ok" for row in rows) else 1


def progress_line(loader: LoaderConfig, records: Sequence[LoaderRecord]) -> str:
    parts = []
    for r in records:
        if r.status != "ok":
            parts.append(f"{r.status}: {r.error}")
        else:
            parts.append(
                f"epoch {r.epoch}: {r.samples_per_s:.1f} samples/s, data wait {r.data_wait_pct:.1f}% ({r.verdict})"
            )
    return f"  {loader.describe()}: " + "; ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
