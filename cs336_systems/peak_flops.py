"""The MFU denominator of a run, and where it came from (the row's peak_source):

    table       a known GPU's dense spec-sheet peak (flops.PEAK_TFLOPS_TABLE)
    calibrated  this machine's own: a matmul probe in the precision's dtype (flops.measure_peak_tflops),
                measured once at a quiet moment (other processes kept under QUIET_CORES busy while it
                ran) and kept with its date and the load then, so MFU stays comparable between runs
                (`--peak calibrate` measures and keeps it again)
    measured    a probe for this run only (`--peak measure`, or a busy machine with nothing kept)
    user        `--peak-tflops`
    unknown     `--peak table` on a device the table does not know

The kept peaks are one JSON file, $CS336_BENCH_CACHE/peak_tflops.json (default
~/.cache/cs336-bench/), a key per host, device, precision, CPU threads and torch version. The file is
a convenience: one that cannot be read is "not cached" (calibrate again), one that cannot be written
is a note on the row; writers take turns (flock) and each writes its own temporary file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import socket
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from . import flops, jsontext
from .contention import LoadMeter
from .results import write_whole
from .results.errors import ResultWriteError
from .results.records import PEAK_READ_LOW

PEAK_CACHE_ENV = "CS336_BENCH_CACHE"  # the directory of the calibrated peaks; default ~/.cache/cs336-bench
# A calibration is kept only when other processes (and a hypervisor's steal) kept at most this many
# cores busy while the probe ran: a probe sharing the cores with another job reads low, and MFU high.
# Not the load average: it counts this run's own steps of the last minute.
QUIET_CORES = 0.25
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


def load_average() -> float:
    """The 1-minute load average (0 where the system has none), kept beside a calibration."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


def busy_elsewhere(measure: Callable[[], float]) -> tuple[float, float]:
    """measure()'s value, and how many cores other processes kept busy while it ran (contention's
    measure, as every row's)."""
    with LoadMeter() as meter:
        value = measure()
    return value, meter.load.other_cores


@dataclass
class PeakCache:
    """This machine's calibrated peaks, one JSON file: a key per (host, device, precision, threads,
    torch version), each holding the TFLOP/s, when it was measured, the load average and how many cores
    other processes kept busy while it ran."""

    path: Path = field(
        default_factory=lambda: (
            Path(os.environ.get(PEAK_CACHE_ENV) or Path.home() / ".cache" / "cs336-bench") / "peak_tflops.json"
        )
    )

    @staticmethod
    def key(device: torch.device, device_name: str, precision: str) -> str:
        threads = f" threads={torch.get_num_threads()}" if device.type == "cpu" else ""
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
    if peak == "measure":
        return _measured(flops.measure_peak_tflops(device, precision), "measured", now())
    cache = cache or PeakCache()
    key = cache.key(device, device_name, precision)
    kept = cache.get(key)
    if kept is not None and peak == "auto":
        return Peak(float(kept["tflops"]), "calibrated", kept.get("measured_at"))
    measured_at, cores = now(), os.cpu_count() or 1
    value, others = busy_elsewhere(lambda: flops.measure_peak_tflops(device, precision))
    busy = f"other processes kept {others:.1f} of {cores} cores busy while the MFU peak was measured"
    if not usable_peak(value):
        return _measured(value, "measured", measured_at)
    if others > QUIET_CORES and peak == "auto":
        note = f"{busy}: kept for this run only ({PEAK_READ_LOW}); `--peak calibrate` keeps one"
        return Peak(value, "measured", measured_at, (note,))
    entry = {
        "tflops": value,
        "measured_at": measured_at,
        "load_average": round(load_average(), 2),
        "other_processes_cores": round(others, 2),
        "cores": cores,
    }
    not_kept = cache.put(key, entry)
    notes = ((f"{busy}: {PEAK_READ_LOW}",) if others > QUIET_CORES else ()) + ((not_kept,) if not_kept else ())
    return Peak(value, "calibrated", measured_at, notes)


def _measured(value: float, source: str, measured_at: str) -> Peak:
    """A probe's peak, or none with a note when the probe timed nothing (a zero or non-finite rate)."""
    if usable_peak(value):
        return Peak(value, source, measured_at)
    return Peak(None, "unknown", measured_at, (f"no MFU: the peak probe measured {value!r} TFLOP/s",))
