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
~/.cache/cs336-bench/), a key per host, device, precision, CPU threads and torch version.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import psutil
import torch

from . import flops
from .results import write_whole

PEAK_CACHE_ENV = "CS336_BENCH_CACHE"  # the directory of the calibrated peaks; default ~/.cache/cs336-bench
# A calibration is kept only when other processes (and a hypervisor's steal) kept at most this many
# cores busy while the probe ran: a probe sharing the cores with another job reads low, and MFU high.
# Not the load average: it counts this run's own steps of the last minute.
QUIET_CORES = 0.25


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
    """measure()'s value, and how many cores other processes kept busy while it ran: the machine's
    busy CPU time (steal included) less this process's own, over the wall time."""
    machine, ours, start = psutil.cpu_times(), os.times(), time.monotonic()
    value = measure()
    machine_after, ours_after, wall = psutil.cpu_times(), os.times(), time.monotonic() - start
    own = (ours_after.user + ours_after.system) - (ours.user + ours.system)
    return value, max(0.0, _busy_seconds(machine_after) - _busy_seconds(machine) - own) / max(wall, 1e-3)


def _busy_seconds(times) -> float:
    """The machine's busy CPU seconds since boot: all but idle and iowait; Linux's guest times are
    already inside user and nice, so they are not counted twice."""
    skipped = ("idle", "iowait", "guest", "guest_nice")
    return sum(getattr(times, name) for name in times._fields if name not in skipped)


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
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):  # none yet, or unreadable: calibrate again
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, key: str) -> dict | None:
        entry = self.entries().get(key)
        return entry if isinstance(entry, dict) and isinstance(entry.get("tflops"), (int, float)) else None

    def put(self, key: str, entry: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_whole(self.path, json.dumps({**self.entries(), key: entry}, indent=1, sort_keys=True) + "\n")


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
        return Peak(flops.measure_peak_tflops(device, precision), "measured", now())
    cache = cache or PeakCache()
    key = cache.key(device, device_name, precision)
    kept = cache.get(key)
    if kept is not None and peak == "auto":
        return Peak(float(kept["tflops"]), "calibrated", kept.get("measured_at"))
    measured_at, cores = now(), os.cpu_count() or 1
    value, others = busy_elsewhere(lambda: flops.measure_peak_tflops(device, precision))
    busy = f"other processes kept {others:.1f} of {cores} cores busy while the MFU peak was measured"
    if others > QUIET_CORES and peak == "auto":
        note = f"{busy}: kept for this run only (a busy machine reads a low peak); `--peak calibrate` keeps one"
        return Peak(value, "measured", measured_at, (note,))
    entry = {
        "tflops": value,
        "measured_at": measured_at,
        "load_average": round(load_average(), 2),
        "other_processes_cores": round(others, 2),
        "cores": cores,
    }
    cache.put(key, entry)
    notes = (f"{busy}: it may read low",) if others > QUIET_CORES else ()
    return Peak(value, "calibrated", measured_at, notes)
