"""The MFU denominator of a run, and where it came from (the row's peak_source):

    table       a known GPU's dense spec-sheet peak (flops.PEAK_TFLOPS_TABLE)
    calibrated  this machine's own: a matmul probe in the precision's dtype (flops.measure_peak_tflops),
                measured once at a quiet moment and kept with its date and the load then, so MFU stays
                comparable between runs (`--peak calibrate` measures and keeps it again). Quiet is
                judged on the probe itself (`busy`): on a CPU its own CPU time over its wall time
                and threads, which the kernel counts exactly, and other processes under QUIET_CORES;
                a CPU peak below one kept for fewer threads is never kept, nor used
    measured    a probe for this run only (`--peak measure`, or a busy machine with nothing kept)
    user        `--peak-tflops`
    unknown     `--peak table` on a device the table does not know

The kept peaks are one JSON file, $CS336_BENCH_CACHE/peak_tflops.json (default
$XDG_CACHE_HOME/cs336-bench/, else ~/.cache/cs336-bench/), a key per host, device, precision, CPU
threads and torch version. The file is a convenience: one that cannot be read is "not cached"
(calibrate again), one that cannot be written is a note on the row; writers take turns (flock) and
each writes its own temporary file.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import math
import os
import socket
import stat
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from . import flops, jsontext
from .contention import BUSY_CORES, OWN_SHARE_FLOOR, LoadMeter
from .results import write_whole
from .results.errors import ResultWriteError

PEAK_CACHE_ENV = "CS336_BENCH_CACHE"  # the directory of the calibrated peaks; default $XDG_CACHE_HOME/cs336-bench
# A calibration is kept only when other processes (and a hypervisor's steal) kept at most this many cores
# busy while the probe ran, as a row's load is judged (not the load average: it counts this run's own steps)
QUIET_CORES = BUSY_CORES
MAX_CACHE_BYTES = 1 << 20  # a few hundred entries fit in a few KiB: a larger file is not ours
LOCK_WAIT_S = 10.0  # a writer that holds the cache's lock longer is stuck: this run keeps its peak to itself


# An exaflop: a thousand times any one chip's spec-sheet peak; a kept value past it is damage (MFU ~0).
MAX_PEAK_TFLOPS = 1e6


def usable_peak(value: object) -> bool:
    """A peak an MFU can be divided by: a positive number below MAX_PEAK_TFLOPS (JSON's `true`, NaN and
    Infinity are none)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return number and math.isfinite(value) and 0 < value < MAX_PEAK_TFLOPS


@dataclass(frozen=True)
class Peak:
    tflops: float | None
    source: str  # "table", "calibrated", "measured", "user" or "unknown"
    measured_at: str | None = None  # calibrated or measured: when (UTC, ISO 8601)
    notes: tuple[str, ...] = ()  # for the row: a calibration not kept, or kept at a busy moment
    low: str | None = None  # why it reads low (an MFU over it reads high; a run's first lines say it)


def load_average() -> float:
    """The 1-minute load average (0 where the system has none), kept beside a calibration."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


SHARE_AND_OTHERS = ("own_cpu_share", "other_processes_cores")  # a probe's, kept beside its peak


def busy(probed: dict, threads: int | None) -> str | None:
    """Why a probe (a kept peak's too) read less than this machine's peak, or None where it ran quiet: its
    threads waited for cores (its own CPU time over wall time x threads: exact) or others held cores."""
    share, others = (probed.get(k) if isinstance(probed.get(k), (int, float)) else 0 for k in SHARE_AND_OTHERS)
    if share and share < OWN_SHARE_FLOOR:
        return f"the probe's {threads} threads ran {share:.0%} of its time: they waited for cores"
    if others > QUIET_CORES:
        return f"other processes kept {others:.1f} of {probed.get('cores')} cores busy while the probe ran"
    return None


@functools.cache
def probe(device: torch.device, precision: str, threads: int | None) -> dict:
    """The peak probe (flops.measure_peak_tflops, uncached) and how it ran, as a kept peak's fields, once per
    process and thread count: a second look at a cached value would time nothing and read quiet."""
    measure = getattr(flops.measure_peak_tflops, "__wrapped__", flops.measure_peak_tflops)
    started, cpu = time.perf_counter(), time.process_time()
    with LoadMeter() as meter:
        value = measure(device, precision)
    share = (time.process_time() - cpu) / (max(time.perf_counter() - started, 1e-9) * threads) if threads else None
    others, share = round(meter.load.other_cores, 2), share and round(share, 2)
    return dict(tflops=value, other_processes_cores=others, own_cpu_share=share, cores=meter.load.cores)


def xdg_cache_home() -> str:
    return xdg if os.path.isabs(xdg := os.environ.get("XDG_CACHE_HOME", "")) else str(Path.home() / ".cache")


@dataclass
class PeakCache:
    """This machine's calibrated peaks, one JSON file: a key per (host, device, precision, threads,
    torch version), each holding the TFLOP/s, when it was measured, the load average and how many cores
    other processes kept busy while it ran."""

    path: Path = field(  # $XDG_CACHE_HOME only when absolute, as its spec says
        default_factory=lambda: (
            Path(os.environ.get(PEAK_CACHE_ENV) or Path(xdg_cache_home()) / "cs336-bench") / "peak_tflops.json"
        )
    )

    @staticmethod
    def key(device: torch.device, device_name: str, precision: str, threads: int | None = None) -> str:
        threads = f" threads={threads or torch.get_num_threads()}" if device.type == "cpu" else ""
        return f"{socket.gethostname()} {device_name} {precision}{threads} torch={torch.__version__}"

    def entries(self) -> dict[str, dict]:
        """The kept entries; {} for a file that is missing, unreadable, too large or not a JSON object."""
        try:  # never blocking on a FIFO planted at its name
            with open(os.open(self.path, os.O_RDONLY | os.O_NONBLOCK), "rb") as handle:
                data = handle.read(MAX_CACHE_BYTES + 1) if stat.S_ISREG(os.fstat(handle.fileno()).st_mode) else b""
            if not data or len(data) > MAX_CACHE_BYTES:
                return {}
            entries = jsontext.loads(data)
        except (OSError, ValueError, RecursionError):  # none yet, or damaged: calibrate again
            return {}
        return entries if isinstance(entries, dict) else {}

    def get(self, key: str) -> dict | None:
        entry = self.entries().get(key)
        return entry if isinstance(entry, dict) and usable_peak(entry.get("tflops")) else None

    def put(self, key: str, entry: dict) -> str | None:
        """Keep `entry` under `key`; None when kept, else why not (a note for the row: the peak still
        serves this run)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._locked():
                write_whole(
                    self.path, json.dumps({**self.entries(), key: entry}, indent=1, sort_keys=True) + "\n", unique=True
                )
        except OSError as exc:  # a read-only $HOME, a cache path through a file, a full disk
            cause = exc.__cause__ if isinstance(exc, ResultWriteError) and exc.__cause__ else exc
            why = getattr(cause, "strerror", None) or str(cause)
            return f"the calibrated MFU peak was not kept in {self.path} ({why}); it serves this run only"
        return None

    @contextlib.contextmanager
    def _locked(self):
        """An exclusive flock on a sidecar beside the file, held while one writer reads, merges and replaces it."""
        fd = os.open(
            self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644
        )
        try:
            deadline = time.monotonic() + LOCK_WAIT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise OSError(f"another process held its lock for {LOCK_WAIT_S:g} s") from None
                    time.sleep(0.01)
            yield
        finally:
            os.close(fd)  # closing releases the lock


def resolve_peak(
    device: torch.device,
    device_name: str,
    precision: str,
    peak: str = "auto",
    peak_tflops: float | None = None,
    cache: PeakCache | None = None,
) -> Peak:
    """The MFU denominator (PEAK_CHOICES): `peak_tflops` (user) wins; a known GPU's is the table's;
    otherwise this machine's calibrated peak, measured and kept the first time (at a quiet moment)."""
    if peak_tflops is not None:
        return Peak(peak_tflops, "user")
    if peak in ("auto", "table") and device.type == "cuda":
        value = flops.table_peak_tflops(device_name, precision)
        if value is not None:
            return Peak(value, "table")
    if peak == "table":
        return Peak(None, "unknown")
    now = lambda: datetime.now(timezone.utc).isoformat(timespec="seconds")  # noqa: E731
    threads = torch.get_num_threads() if device.type == "cpu" else None
    if peak == "measure":
        probed = probe(device, precision, threads)
        return _measured(probed["tflops"], "measured", now(), busy(probed, threads))
    cache = cache or PeakCache()
    key = cache.key(device, device_name, precision)
    # the highest CPU peak kept for fewer threads (threads, entry): more threads never multiply slower
    fewer = [(t, e) for t in range(1, threads or 1) if (e := cache.get(cache.key(device, device_name, precision, t)))]
    kept, fewer = cache.get(key), max(fewer, key=lambda found: found[1]["tflops"], default=None)

    def below(value: float) -> str | None:  # more threads never multiply slower: the probe waited for cores
        if fewer is not None and value < fewer[1]["tflops"]:
            return f"below the {fewer[1]['tflops']:.3g} TFLOP/s kept for {fewer[0]} thread(s) on {fewer[1].get('measured_at')}"
        return None

    if kept is not None and peak == "auto" and not below(kept["tflops"]):
        return Peak(float(kept["tflops"]), "calibrated", kept.get("measured_at"), (), busy(kept, threads))
    measured_at = now()
    probed = probe(device, precision, threads)
    if not usable_peak(value := probed["tflops"]):
        return _measured(value, "measured", measured_at)
    low = below(value) or busy(probed, threads)
    if low and (peak == "auto" or below(value)):  # one below a peak of fewer threads is never kept, even asked
        note = f"the MFU peak was measured low ({low}), so MFU reads high: kept for this run only; `--peak calibrate` on a quiet machine"
        return Peak(value, "measured", measured_at, (note,), low)
    not_kept = cache.put(key, {**probed, "measured_at": measured_at, "load_average": round(load_average(), 2)})
    notes = ((f"{low}: the peak reads low, and so MFU high",) if low else ()) + ((not_kept,) if not_kept else ())
    return Peak(value, "calibrated", measured_at, notes, low)


def _measured(value: float, source: str, measured_at: str, low: str | None = None) -> Peak:
    """A probe's peak, or none with a note when the probe timed nothing (a zero or non-finite rate)."""
    if usable_peak(value):
        return Peak(value, source, measured_at, (), low)
    return Peak(None, "unknown", measured_at, (f"no MFU: the peak probe measured {value!r} TFLOP/s",))
