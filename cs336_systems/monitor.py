"""Resource monitor: GPU, CPU, memory, network and disk of a run, sampled on one clock.

    python -m cs336_systems.monitor --interval 0.5 --output run.csv -- python train.py --epochs 1

runs the command, samples every --interval seconds until it exits, writes the time series
(run.csv), one panel per metric over time (run.png) and a record of the run (run.json:
command, exit status, environment, summary), prints mean / p50 / p90 / max of each
metric on stderr and exits with the command's exit status. In Python, wrap any code:

    with monitored("run.csv", interval=0.5):
        train()

What each column is (all sampled at the same instant `t_s` of one clock):
  gpu_util_pct            NVML utilisation: % of the driver's last sample period (1/6 s to 1 s)
                          in which any kernel ran; not SM occupancy. Mean over monitored GPUs.
  gpu_memory_used_bytes   NVML device memory in use, all processes, summed over monitored GPUs.
                          Without a GPU or an NVML driver both stay empty and the output says so.
  system_cpu_pct          busy CPU time of the whole machine, % of all cores (psutil.cpu_times deltas).
  tree_cpu_pct            CPU time of the command's process tree, % of all cores (100 = every core busy);
                          children that exited and were waited for are included.
  tree_rss_bytes          sum of the resident set sizes of the tree's live processes; pages shared by
                          forked processes (DataLoader workers) are counted once per process.
  tree_processes          number of live processes in the tree.
  system_ram_used_bytes   total - available (what the kernel could not give to a new program).
  net_recv/sent_bytes_per_s, disk_read/write_bytes_per_s
                          machine-wide rates over the last interval (loopback included, so a local
                          HTTP server's traffic shows).
Rates and CPU percentages cover the interval that ends at `t_s`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

DEFAULT_INTERVAL_S = 0.5
PROG = "python -m cs336_systems.monitor"


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
_DIVISOR = {name: divisor for name, _, divisor in METRICS}


# -- GPU (optional) ------------------------------------------------------------------------


class GpuProbe:
    """NVML readings, or none with the reason why (no nvidia-ml-py, no driver, no GPU)."""

    def __init__(self, indices: Sequence[int] | None = None):
        self.handles: list = []
        self.names: list[str] = []
        self.unavailable_reason: str | None = None
        try:
            import pynvml

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            chosen = list(range(count)) if indices is None else list(indices)
            missing = [i for i in chosen if not 0 <= i < count]
            if missing:
                raise ValueError(f"no GPU with NVML index {missing[0]} (this machine has {count})")
            self._nvml = pynvml
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in chosen]
            self.names = [_text(pynvml.nvmlDeviceGetName(h)) for h in self.handles]
            if not self.handles:
                self.unavailable_reason = "NVML sees no GPU"
        except ImportError:
            self.unavailable_reason = "nvidia-ml-py is not installed"
        except ValueError:
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


# -- summaries and files -------------------------------------------------------------------


def summarize_samples(samples: Sequence[Sample]) -> dict[str, dict[str, float] | None]:
    """{metric: {mean, p50, p90, max}} in the metric's own unit (bytes, %, bytes/s); None if empty."""
    from cs336_systems.stats import summarize

    out: dict[str, dict[str, float] | None] = {}
    for name, _, _ in METRICS:
        values = [getattr(s, name) for s in samples if getattr(s, name) is not None]
        if not values:
            out[name] = None
            continue
        summary = summarize(values)
        out[name] = {"mean": summary.mean, "p50": summary.median, "p90": summary.p90, "max": summary.max}
    return out


def summary_table(summary: dict[str, dict[str, float] | None]) -> str:
    from tabulate import tabulate

    rows = []
    for name, label, divisor in METRICS:
        stats = summary.get(name)
        cells = ["" if stats is None else f"{stats[k] / divisor:.2f}" for k in ("mean", "p50", "p90", "max")]
        rows.append([label, *cells])
    return tabulate(rows, headers=["metric", "mean", "p50", "p90", "max"], tablefmt="github", disable_numparse=True)


class MonitorPathError(ValueError):
    """A --monitor / --output path we refuse (wrong suffix, would overwrite a time series)."""


def check_monitor_path(path: str | Path) -> Path:
    """The CSV path, checked before any work starts; its .png and .json go beside it."""
    path = Path(path)
    if path.suffix != ".csv":
        raise MonitorPathError(f"monitor output {path}: must end in .csv (the .png and .json go beside it)")
    for existing in (path, path.with_suffix(".png"), path.with_suffix(".json")):
        if existing.exists():
            raise MonitorPathError(f"monitor output {existing} already exists; choose a new name")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


class SampleCsvWriter:
    """Appends each sample to the CSV as it is taken (flushed), so a run killed midway keeps its rows."""

    def __init__(self, path: Path):
        self.path = path
        self.handle = path.open("w", newline="")
        self.handle.write(",".join(SAMPLE_FIELDS) + "\n")
        self.handle.flush()

    def __call__(self, sample: Sample) -> None:
        cells = (
            "" if v is None else (f"{v:.6f}" if isinstance(v, float) else str(v)) for v in dataclasses.astuple(sample)
        )
        self.handle.write(",".join(cells) + "\n")
        self.handle.flush()

    def close(self) -> None:
        self.handle.close()


def plot_samples(samples: Sequence[Sample], path: Path, title: str, gpu_note: str | None = None) -> None:
    """One panel per metric over time (the PNG written beside the CSV)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(PANELS), 1, figsize=(9, 2.0 * len(PANELS)), sharex=True)
    t = [s.t_s for s in samples]
    for ax, (label, names) in zip(axes, PANELS):
        drawn = False
        for name in names:
            values = [getattr(s, name) for s in samples]
            if all(v is None for v in values):
                continue
            ys = [math.nan if v is None else v / _DIVISOR[name] for v in values]
            ax.plot(t, ys, marker=".", markersize=3, linewidth=1, label=name)
            drawn = True
        if not drawn:
            ax.text(0.5, 0.5, gpu_note if names[0].startswith("gpu") and gpu_note else "no data", ha="center",
                    va="center", transform=ax.transAxes, color="gray")  # fmt: skip
            ax.set_yticks([])
        elif len(names) > 1:
            ax.legend(loc="best", fontsize=7)
        ax.set_ylabel(label, fontsize=8)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("time since start (s)")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


@dataclass
class MonitorReport:
    """What is written to the .json beside the CSV: enough to reproduce and read the run."""

    command: str
    exit_status: int | None
    interval_s: float
    started_unix_s: float | None
    duration_s: float | None
    num_samples: int
    cpu_count: int
    gpu: str
    gpu_names: list[str]
    monitor_cpu_s: float
    summary: dict
    environment: dict = field(default_factory=dict)


def write_report(monitor: ResourceMonitor, csv_path: Path, command: str, exit_status: int | None) -> MonitorReport:
    """PNG and JSON beside the CSV; returns the report (its summary is printed by the callers)."""
    from cs336_systems.results import collect_environment

    summary = summarize_samples(monitor.samples)
    note = None if monitor.gpu.available else f"no GPU: {monitor.gpu.unavailable_reason}"
    title = " ".join(command.split())
    plot_samples(
        monitor.samples, csv_path.with_suffix(".png"), title if len(title) < 120 else title[:117] + "...", note
    )
    import torch

    report = MonitorReport(
        command=command,
        exit_status=exit_status,
        interval_s=monitor.interval_s,
        started_unix_s=monitor.started_unix_s,
        duration_s=monitor.duration_s,
        num_samples=len(monitor.samples),
        cpu_count=monitor.cpu_count,
        gpu=monitor.gpu.describe(),
        gpu_names=monitor.gpu.names,
        monitor_cpu_s=monitor.monitor_cpu_s,
        summary=summary,
        environment=dataclasses.asdict(collect_environment(torch.device("cpu"))),
    )
    csv_path.with_suffix(".json").write_text(json.dumps(dataclasses.asdict(report), indent=2, default=str) + "\n")
    return report


def report_text(report: MonitorReport, csv_path: Path) -> str:
    lines = [
        f"monitor: {report.num_samples} samples every {report.interval_s:g} s over {report.duration_s or 0:.1f} s "
        f"of `{report.command}`" + ("" if report.exit_status is None else f" (exit status {report.exit_status})"),
        report.gpu,
        f"CPU percentages are of all {report.cpu_count} cores; the monitor itself used {report.monitor_cpu_s:.2f} s CPU",
        "",
        summary_table(report.summary),
        "",
        f"wrote {csv_path}, {csv_path.with_suffix('.png')}, {csv_path.with_suffix('.json')}",
    ]
    return "\n".join(lines)


@contextlib.contextmanager
def monitored(
    path: str | Path | None,
    interval_s: float = DEFAULT_INTERVAL_S,
    label: str | None = None,
    root_pid: int | None = None,
) -> Iterator[ResourceMonitor | None]:
    """Monitor the code inside the `with` (this process and its children) into `path`
    (.csv, plus .png and .json beside it) and print the summary on stderr. `path=None`
    does nothing, so a CLI can pass its optional --monitor straight through."""
    if path is None:
        yield None
        return
    csv_path = check_monitor_path(path)
    writer = SampleCsvWriter(csv_path)
    monitor = ResourceMonitor(interval_s, root_pid=root_pid, on_sample=writer)
    try:
        with monitor:
            yield monitor
    finally:
        writer.close()
        report = write_report(monitor, csv_path, label or shlex.join(sys.argv), None)
        print(report_text(report, csv_path), file=sys.stderr)


def add_monitor_arguments(parser) -> None:
    """`--monitor PATH.csv` and `--monitor-interval S`, the same in every command."""
    group = parser.add_argument_group("resource monitor")
    group.add_argument(
        "--monitor",
        metavar="PATH.csv",
        help="sample GPU/CPU/memory/network/disk during the run into PATH.csv (+ .png, .json beside it)",
    )
    group.add_argument("--monitor-interval", type=float, default=DEFAULT_INTERVAL_S, metavar="SECONDS")


def check_monitor_arguments(args) -> None:
    """Raise MonitorPathError (a ValueError) for a bad --monitor path or interval."""
    if args.monitor is not None:
        if not args.monitor_interval > 0:
            raise MonitorPathError(f"--monitor-interval must be positive, got {args.monitor_interval}")
        check_monitor_path(args.monitor)


# -- the command-line tool -----------------------------------------------------------------


def _wait_without_reaping(process: subprocess.Popen) -> None:
    """Block until the child exits but leave it a zombie, so its CPU times can still be read."""
    if hasattr(os, "waitid"):
        while True:
            try:
                os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)
                return
            except InterruptedError:
                continue
            except ChildProcessError:
                return
    process.wait()


def exit_status(returncode: int) -> int:
    """A shell's convention: killed by signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def run_monitored(command: Sequence[str], csv_path: Path, interval_s: float, gpu_indices=None) -> int:
    writer = SampleCsvWriter(csv_path)
    try:
        process = subprocess.Popen(list(command))
    except OSError:
        writer.close()
        csv_path.unlink(missing_ok=True)
        raise
    # Ctrl-C reaches the command (same process group); the monitor waits for it to finish.
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT,)}
    forward = lambda signum, frame: process.send_signal(signum)  # noqa: E731
    previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, forward)
    try:
        monitor = ResourceMonitor(interval_s, root_pid=process.pid, gpu_indices=gpu_indices, on_sample=writer)
        with monitor:
            _wait_without_reaping(process)
        returncode = process.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        writer.close()
    status = exit_status(returncode)
    report = write_report(monitor, csv_path, shlex.join(command), status)
    print(report_text(report, csv_path), file=sys.stderr)
    return status


def main(argv: list[str] | None = None) -> int:
    from cs336_systems.argtypes import ArgumentParser, fail, non_negative_int, positive_float

    parser = ArgumentParser(
        prog=PROG,
        description="Run a command and sample GPU, CPU, memory, network and disk on one clock.",
        usage=f"{PROG} [--interval S] [--output PATH.csv] [--gpus I ...] -- COMMAND [ARGS...]",
    )
    parser.add_argument("--interval", type=positive_float, default=DEFAULT_INTERVAL_S, help="seconds between samples")
    parser.add_argument(
        "--output", help="time series CSV (default monitor-YYYYmmdd-HHMMSS.csv); .png and .json beside it"
    )
    parser.add_argument("--gpus", type=non_negative_int, nargs="+", metavar="I", help="NVML indices (default: all)")
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    command = argv[split + 1 :]
    if not command:
        return fail(PROG, "no command to run: put it after --, e.g. -- python train.py")
    output = args.output or time.strftime("monitor-%Y%m%d-%H%M%S.csv")
    try:
        csv_path = check_monitor_path(output)
        if args.gpus is not None:
            GpuProbe(args.gpus)
        return run_monitored(command, csv_path, args.interval, args.gpus)
    except (MonitorPathError, ValueError) as exc:
        return fail(PROG, str(exc))
    except FileNotFoundError:
        return fail(PROG, f"command not found: {command[0]}")
    except PermissionError:
        return fail(PROG, f"command not executable: {command[0]}")


if __name__ == "__main__":
    sys.exit(main())
