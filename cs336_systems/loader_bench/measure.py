"""Running epochs: in this process, or in N processes that each take a share of the items."""

from __future__ import annotations

import contextlib
import functools
import gc
import multiprocessing as mp
import os
import queue
import signal
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psutil
import torch

from ..device import resolve_device
from ..lifetime import deferring_interrupts, die_with_parent
from .config import BenchConfig, LoaderConfig, load_dataset
from .data import EpochSampler, StoreDataset, batch_nbytes, make_loader, to_device
from .step import PhaseTimer, make_compute
from .workers import WorkerMemorySampler


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
                with deferring_interrupts():  # workers are forked here
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


def _process_main(bench, loader, indices, barrier, results, rank, parent_pid) -> None:
    # dies with the benchmark, even a SIGKILLed one; Ctrl-C is the parent's to handle
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
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
        ctx.Process(target=_process_main, args=(bench, loader, indices[rank::n], barrier, results, rank, os.getpid()))
        for rank in range(n)
    ]
    with deferring_interrupts():
        for process in processes:
            process.start()
    collected: dict[int, list[EpochMeasurement]] = {}
    errors = []
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    finished = False  # interrupted: the processes are ended at once, not waited for
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
        finished = True
    finally:
        for process in processes:
            process.join(timeout=10 if finished else 0)
            if process.is_alive():
                process.kill()
                process.join()
    if errors:
        raise RuntimeError(f"in a child process: {errors[0]}")
    return [collected[rank] for rank in range(n)]


def run_configuration(bench: BenchConfig, loader: LoaderConfig) -> list[list[EpochMeasurement]]:
    """Per process, per epoch measurements of one combination."""
    if loader.child_processes:
        return run_processes(bench, loader)
    return [run_epochs(bench, loader)]
