"""The MFU denominator of a run, and where it came from (the row's peak_source):

    table       a known GPU's dense spec-sheet peak (flops.PEAK_TFLOPS_TABLE)
    calibrated  this machine's own: a matmul probe in the precision's dtype (flops.measure_peak_tflops),
                measured once at a quiet moment and kept with its date and the load average then, so
                MFU stays comparable between runs (`--peak calibrate` measures and keeps it again)
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
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from . import flops
from .results import write_whole

PEAK_CACHE_ENV = "CS336_BENCH_CACHE"  # the directory of the calibrated peaks; default ~/.cache/cs336-bench
# A calibration is kept only when the 1-minute load average is at most this per core (or at least
# QUIET_LOAD_FLOOR): a matmul probe sharing the cores with another job reads low, and MFU high.
QUIET_LOAD_PER_CORE = 0.25
QUIET_LOAD_FLOOR = 0.5


@dataclass(frozen=True)
class Peak:
    tflops: float | None
    source: str  # "table", "calibrated", "measured", "user" or "unknown"
    measured_at: str | None = None  # calibrated or measured: when (UTC, ISO 8601)
    notes: tuple[str, ...] = ()  # for the row: a calibration not kept, or kept at a busy moment


def load_average() -> float:
    """The 1-minute load average (0 where the system has none)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


def quiet_load(cores: int | None = None) -> float:
    """The highest 1-minute load average at which a calibration is kept."""
    return max(QUIET_LOAD_FLOOR, QUIET_LOAD_PER_CORE * (cores or os.cpu_count() or 1))


@dataclass
class PeakCache:
    """This machine's calibrated peaks, one JSON file: a key per (host, device, precision, threads,
    torch version), each holding the TFLOP/s, when it was measured and the load average then."""

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
    load, cores = load_average(), os.cpu_count() or 1
    value, measured_at = flops.measure_peak_tflops(device, precision), now()
    busy = load > quiet_load(cores)
    if busy and peak == "auto":
        note = (
            f"MFU peak measured for this run only, at load average {load:.1f} on {cores} cores (a busy machine "
            "reads a low peak); `--peak calibrate` at a quiet moment keeps one for this machine"
        )
        return Peak(value, "measured", measured_at, (note,))
    entry = {"tflops": value, "measured_at": measured_at, "load_average": round(load, 2), "cores": cores}
    cache.put(key, entry)
    notes = (f"MFU peak calibrated at load average {load:.1f} on {cores} cores: it may read low",) if busy else ()
    return Peak(value, "calibrated", measured_at, notes)
