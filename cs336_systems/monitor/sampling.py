"""Sampling: one Sample of GPU, CPU, memory, network and disk per interval, on one clock.

The metrics are defined in the package docstring (cs336_systems.monitor)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psutil

from ..errors import UsageError

DEFAULT_INTERVAL_S = 0.5


@dataclass(frozen=True)
class Sample:
    """One row of the time series: every metric read at the same instant `t_s`."""

    t_s: float  # seconds since the monitor started, on the monitor's clock
    unix_time_s: float
    gpu_util_pct: float | None
    gpu_memory_used_bytes: int | None
    system_cpu_pct: float | None
    tree_cpu_pct: float | None
    tree_rss_bytes: int
    tree_processes: int
    system_ram_used_bytes: int
    net_recv_bytes_per_s: float | None
    net_sent_bytes_per_s: float | None
    disk_read_bytes_per_s: float | None
    disk_write_bytes_per_s: float | None


SAMPLE_FIELDS = tuple(f.name for f in dataclasses.fields(Sample))
# The metrics summarised and plotted, with their display unit: (column, label, divisor).
METRICS: tuple[tuple[str, str, float], ...] = (
    ("gpu_util_pct", "GPU utilisation (%)", 1.0),
    ("gpu_memory_used_bytes", "GPU memory used (GiB)", 2**30),
    ("system_cpu_pct", "CPU, whole machine (% of all cores)", 1.0),
    ("tree_cpu_pct", "CPU, process tree (% of all cores)", 1.0),
    ("tree_rss_bytes", "RSS, process tree (GiB)", 2**30),
    ("system_ram_used_bytes", "System RAM used (GiB)", 2**30),
    ("net_recv_bytes_per_s", "Network receive (MB/s)", 1e6),
    ("net_sent_bytes_per_s", "Network send (MB/s)", 1e6),
    ("disk_read_bytes_per_s", "Disk read (MB/s)", 1e6),
    ("disk_write_bytes_per_s", "Disk write (MB/s)", 1e6),
)
# Panels of the plot: one per metric; the two directions of a rate share a panel.
PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("GPU utilisation (%)", ("gpu_util_pct",)),
    ("GPU memory used (GiB)", ("gpu_memory_used_bytes",)),
    ("CPU (% of all cores)", ("system_cpu_pct", "tree_cpu_pct")),
    ("RSS, process tree (GiB)", ("tree_rss_bytes",)),
    ("System RAM used (GiB)", ("system_ram_used_bytes",)),
    ("Network (MB/s)", ("net_recv_bytes_per_s", "net_sent_bytes_per_s")),
    ("Disk (MB/s)", ("disk_read_bytes_per_s", "disk_write_bytes_per_s")),
)
METRIC_DIVISORS = {name: divisor for name, _, divisor in METRICS}


# -- GPU (optional) ------------------------------------------------------------------------


def default_gpu_indices(nvml, count: int) -> list[int]:
    """The GPUs the monitored work can use: CUDA_VISIBLE_DEVICES' entries (indices or GPU-/MIG-
    UUIDs; as CUDA does, the list ends at the first entry that names no GPU), else the current
    CUDA device (0 unless this process chose another). NVML numbers GPUs in PCI bus order, as
    CUDA does with CUDA_DEVICE_ORDER=PCI_BUS_ID."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        import torch

        return [torch.cuda.current_device() if torch.cuda.is_initialized() else 0][:count]
    chosen = []
    for entry in (part.strip() for part in visible.split(",")):
        if entry.isdigit() and int(entry) < count:
            chosen.append(int(entry))
            continue
        try:
            chosen.append(nvml.nvmlDeviceGetIndex(nvml.nvmlDeviceGetHandleByUUID(entry)))
        except Exception:  # not a UUID of this machine (or empty): CUDA stops here too
            break
    return chosen


class GpuProbe:
    """NVML readings, or none with the reason why (no nvidia-ml-py, no driver, no GPU).
    `indices` are NVML indices; None: the GPUs this job can use (`default_gpu_indices`),
    not every GPU of the machine."""

    def __init__(self, indices: Sequence[int] | None = None):
        self.handles: list = []
        self.names: list[str] = []
        self.unavailable_reason: str | None = None
        try:
            import pynvml

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            chosen = default_gpu_indices(pynvml, count) if indices is None else list(indices)
            missing = [i for i in chosen if not 0 <= i < count]
            if missing:
                raise UsageError(f"no GPU with NVML index {missing[0]} (this machine has {count})")
            self._nvml = pynvml
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in chosen]
            self.names = [_text(pynvml.nvmlDeviceGetName(h)) for h in self.handles]
            if not self.handles:
                self.unavailable_reason = "NVML sees no GPU" if not count else "CUDA_VISIBLE_DEVICES names no GPU"
        except ImportError:
            self.unavailable_reason = "nvidia-ml-py is not installed"
        except UsageError:
            raise
        except Exception as exc:  # pynvml.NVMLError and its many subclasses: no driver, no library
            self.unavailable_reason = f"NVML unavailable ({exc})"

    @property
    def available(self) -> bool:
        return bool(self.handles)

    def read(self) -> tuple[float | None, int | None]:
        """(mean utilisation %, total memory used in bytes) over the monitored GPUs."""
        if not self.handles:
            return None, None
        try:
            utils = [self._nvml.nvmlDeviceGetUtilizationRates(h).gpu for h in self.handles]
            used = [self._nvml.nvmlDeviceGetMemoryInfo(h).used for h in self.handles]
        except Exception:  # a GPU that fell off the bus mid-run: leave this sample empty
            return None, None
        return sum(utils) / len(utils), int(sum(used))

    def describe(self) -> str:
        if not self.available:
            return f"GPU: none ({self.unavailable_reason}); the gpu_* columns are empty"
        return f"GPU: {len(self.names)} monitored through NVML ({', '.join(self.names)})"


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# -- the process tree ----------------------------------------------------------------------


def process_tree(root: psutil.Process) -> list[psutil.Process]:
    """The root and its live descendants (empty once the root is gone)."""
    try:
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def tree_cpu_seconds(processes: Sequence[psutil.Process]) -> float:
    """CPU seconds used so far by the tree: each live process's own time plus the time of
    the children it has waited for (so work of exited workers is not lost)."""
    total = 0.0
    for process in processes:
        with contextlib.suppress(psutil.Error):
            t = process.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return total


def total_rss_bytes(processes: Sequence[psutil.Process]) -> int:
    total = 0
    for process in processes:
        with contextlib.suppress(psutil.Error):
            total += process.memory_info().rss
    return total


def _busy_and_total(times) -> tuple[float, float]:
    idle = times.idle + getattr(times, "iowait", 0.0)
    total = sum(times)
    # guest time is already counted in user time on Linux
    total -= getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)
    return total - idle, total


def _rate(now: float | None, before: float | None, seconds: float) -> float | None:
    if now is None or before is None or seconds <= 0:
        return None
    return max(0.0, (now - before) / seconds)


# -- the monitor ---------------------------------------------------------------------------


@dataclass
class _Counters:
    """Cumulative counters read at one instant; rates are differences of two of these."""

    t: float
    cpu_busy: float
    cpu_total: float
    tree_cpu_s: float
    net: tuple[int, int] | None
    disk: tuple[int, int] | None


class ResourceMonitor:
    """Samples the metrics above on a background thread, one `Sample` per interval.

    Ticks are scheduled at start + k * interval (no drift), plus one last sample when
    stopped. `root_pid` is the process tree to follow (default: this process, whose
    tree then includes the monitor thread's own small CPU time: see `monitor_cpu_s`).
    `on_sample` is called with each sample as it is taken (to stream it to a file).
    """

    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        root_pid: int | None = None,
        gpu_indices: Sequence[int] | None = None,
        on_sample: Callable[[Sample], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        if not interval_s > 0:
            raise ValueError(f"interval must be positive, got {interval_s}")
        self.interval_s = interval_s
        self.root = psutil.Process(root_pid if root_pid is not None else os.getpid())
        self.gpu = GpuProbe(gpu_indices)
        self.on_sample = on_sample
        self.clock = clock
        self.cpu_count = psutil.cpu_count() or 1
        self.samples: list[Sample] = []
        self.monitor_cpu_s = 0.0
        self.started_unix_s: float | None = None
        self.duration_s: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self._last: _Counters | None = None
        self._lock = threading.Lock()

    def _counters(self, processes: Sequence[psutil.Process]) -> _Counters:
        net = psutil.net_io_counters()
        disk = psutil.disk_io_counters()
        cpu_busy, cpu_total = _busy_and_total(psutil.cpu_times())
        return _Counters(
            t=self.clock(),
            cpu_busy=cpu_busy,
            cpu_total=cpu_total,
            tree_cpu_s=tree_cpu_seconds(processes),
            net=(net.bytes_recv, net.bytes_sent) if net else None,
            disk=(disk.read_bytes, disk.write_bytes) if disk else None,
        )

    def sample(self) -> Sample:
        """Read everything now; rates cover the time since the previous sample."""
        with self._lock:
            processes = process_tree(self.root)
            now = self._counters(processes)
            before = self._last or now
            seconds = now.t - before.t
            gpu_util, gpu_memory = self.gpu.read()
            memory = psutil.virtual_memory()
            cpu_window = now.cpu_total - before.cpu_total
            sample = Sample(
                t_s=now.t - self._t0,
                unix_time_s=time.time(),
                gpu_util_pct=gpu_util,
                gpu_memory_used_bytes=gpu_memory,
                system_cpu_pct=100 * (now.cpu_busy - before.cpu_busy) / cpu_window if cpu_window > 0 else None,
                tree_cpu_pct=(
                    100 * max(0.0, now.tree_cpu_s - before.tree_cpu_s) / (seconds * self.cpu_count)
                    if seconds > 0
                    else None
                ),
                tree_rss_bytes=total_rss_bytes(processes),
                tree_processes=len(processes),
                system_ram_used_bytes=memory.total - memory.available,
                net_recv_bytes_per_s=_rate(now.net and now.net[0], before.net and before.net[0], seconds),
                net_sent_bytes_per_s=_rate(now.net and now.net[1], before.net and before.net[1], seconds),
                disk_read_bytes_per_s=_rate(now.disk and now.disk[0], before.disk and before.disk[0], seconds),
                disk_write_bytes_per_s=_rate(now.disk and now.disk[1], before.disk and before.disk[1], seconds),
            )
            self._last = now
            self.samples.append(sample)
        if self.on_sample is not None:
            self.on_sample(sample)
        return sample

    def _run(self) -> None:
        start_cpu = time.thread_time()
        tick = 1
        while not self._stop.wait(max(0.0, self._t0 + tick * self.interval_s - self.clock())):
            self.sample()
            tick = max(tick + 1, math.floor((self.clock() - self._t0) / self.interval_s) + 1)  # skip missed ticks
        self.monitor_cpu_s = time.thread_time() - start_cpu

    def start(self) -> ResourceMonitor:
        if self._thread is not None:
            raise RuntimeError("monitor already started")
        self.started_unix_s = time.time()
        self._t0 = self.clock()
        self._last = self._counters(process_tree(self.root))
        self._thread = threading.Thread(target=self._run, name="resource-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[Sample]:
        """Stop the thread and take one last sample (so a short run still has a row)."""
        if self._thread is None:
            return self.samples
        self._stop.set()
        self._thread.join()
        self._thread = None
        if not self.samples or self.clock() - self._t0 - self.samples[-1].t_s > 0.1 * self.interval_s:
            self.sample()
        self.duration_s = self.clock() - self._t0
        return self.samples

    def __enter__(self) -> ResourceMonitor:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
