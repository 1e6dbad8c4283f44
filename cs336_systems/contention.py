"""How busy other processes kept the machine while something was measured: a shared cluster node, a
laptop with a browser open, another job on a CI runner. Times measured under contention are inflated
and comparisons between them are loose, so every row records it and every run says it.

On a CPU: the machine's busy CPU time (a hypervisor's steal included) less this process tree's own (the
processes it started too: ranks, compile workers), over the wall time, in cores: a lower bound (the
kernel's tick counts are rounded against it) and at most the machine's cores; and our own share of the
cores we asked for (below about 0.8 our threads waited for a core, whoever held it). On a GPU: the
other processes NVML sees on our device.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from dataclasses import dataclass

import psutil

TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # the kernel's CPU-time unit
BUSY_CORES = 0.25  # other processes above this many cores: the row was measured on a busy machine
OWN_SHARE_FLOOR = 0.8  # a compute-bound step that got less than this of its cores waited for them


@dataclass(frozen=True)
class Load:
    other_cores: float  # cores other processes kept busy, on average over the measurement
    cores: int  # this machine's logical cores
    own_share: float | None  # our CPU time over wall time x our threads (compute-bound work: about 1)
    gpu_other_processes: int | None  # other processes on our GPU (None: no GPU, or NVML unavailable)

    @property
    def busy(self) -> bool:
        return self.other_cores > BUSY_CORES or bool(self.gpu_other_processes)

    def words(self) -> str:
        """'other processes kept 1.7 of 2 cores busy' or 'quiet (0.0 of 2 cores busy elsewhere)'."""
        text = f"other processes kept {self.other_cores:.1f} of {self.cores} cores busy"
        if self.gpu_other_processes:
            text += f" and {self.gpu_other_processes} other process(es) used the GPU"
        return text if self.busy else f"quiet ({self.other_cores:.1f} of {self.cores} cores busy elsewhere)"


def _busy_seconds() -> float:
    """The machine's busy CPU seconds since boot: all but idle and iowait (guest time is inside user)."""
    times = psutil.cpu_times()
    return sum(getattr(times, n) for n in times._fields if n not in ("idle", "iowait", "guest", "guest_nice"))


def _own_seconds() -> dict[int, float]:
    """CPU seconds of this process and of every live process it started (ranks, torch.compile's workers),
    each with the children it reaped: this run's own work, not another process's."""
    tree = [psutil.Process()]
    with contextlib.suppress(psutil.Error):
        tree += tree[0].children(recursive=True)
    seconds = {}
    for process in tree:
        with contextlib.suppress(psutil.Error):
            t = process.cpu_times()
            seconds[process.pid] = t.user + t.system + t.children_user + t.children_system
    return seconds


def _own_delta(before: dict[int, float], after: dict[int, float]) -> float:
    """Our tree's CPU seconds between two _own_seconds (a process started since counts whole)."""
    return sum(max(0.0, seconds - before.get(pid, 0.0)) for pid, seconds in after.items())


def gpu_other_processes(device_index: int = 0) -> int | None:
    """Processes with a context on the GPU (NVML) other than this one and those it started (its ranks);
    None without one."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        running = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except Exception:  # no NVML, no GPU, a driver that will not answer: unknown, not zero
        return None
    ours = set(_own_seconds())
    return sum(1 for process in running if process.pid not in ours)


class LoadMeter:
    """`with LoadMeter(threads) as meter: ...` then `meter.load`: how busy the machine was meanwhile."""

    def __init__(self, threads: int | None = None, gpu_index: int | None = None):
        self.threads, self.gpu_index = threads, gpu_index
        self.load: Load | None = None

    def __enter__(self) -> LoadMeter:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.read()

    def start(self) -> LoadMeter:
        self._start = (time.monotonic(), _busy_seconds(), _own_seconds())
        return self

    def read(self, at_least_s: float = 0.0) -> Load:
        """The load since start(), over a window of at least `at_least_s` (waiting out the rest)."""
        wall = time.monotonic() - self._start[0]
        if wall < at_least_s:
            time.sleep(at_least_s - wall)
            wall = time.monotonic() - self._start[0]
        wall = max(wall, 1e-3)
        busy = _busy_seconds() - self._start[1]
        after = _own_seconds()
        own = _own_delta(self._start[2], after)
        mine = after.get(os.getpid(), 0.0) - self._start[2].get(os.getpid(), 0.0)
        share = mine / (wall * self.threads) if self.threads else None
        gpu = gpu_other_processes(self.gpu_index) if self.gpu_index is not None else None
        cores = psutil.cpu_count() or 1
        # the kernel counts CPU time in whole ticks, each count off by up to one: over a window of a few
        # milliseconds that is cores of load that were not there. Those ticks are taken off (a lower bound),
        # for the machine's cores and for each of our processes that ran meanwhile (an idle one, such as
        # torch.compile's pool of 20 workers, reads the same count twice: no error to take off)
        ran = sum(1 for pid, seconds in after.items() if seconds != self._start[2].get(pid))
        slack = 2 * (cores + ran) / TICKS_PER_S
        self.load = Load(min(float(cores), max(0.0, busy - own - slack) / wall), cores, share, gpu)
        return self.load


def machine_load(device) -> LoadMeter:
    """A meter for measuring on `device` (a torch.device): our threads on a CPU, the GPU's other processes."""
    import torch

    if device.type == "cuda":
        return LoadMeter(threads=None, gpu_index=device.index or 0)
    return LoadMeter(threads=torch.get_num_threads())


def with_load(environment, load: Load | None):
    """The row's environment with how busy the machine was while it was measured (its LOAD_FIELDS)."""
    if environment is None or load is None:
        return environment
    share = None if load.own_share is None else round(load.own_share, 2)
    return dataclasses.replace(
        environment,
        other_load_cores=round(load.other_cores, 2),
        own_cpu_share=share,
        gpu_other_processes=load.gpu_other_processes,
    )


def _number(value: object) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if number != number else number  # NaN: not recorded


def describe_rows(rows: list[dict]) -> str:
    """One line on how busy the machine was over rows that recorded it (their LOAD_FIELDS)."""
    loads = [(_number(r.get("other_load_cores")), _number(r.get("gpu_other_processes"))) for r in rows]
    recorded = [(cores, gpu) for cores, gpu in loads if cores is not None]
    if not recorded:
        return "How busy the machine was is not in these rows (they were measured before it was recorded)."
    busy = [(cores, gpu) for cores, gpu in recorded if cores > BUSY_CORES or (gpu or 0) > 0]
    most = max(cores for cores, _ in recorded)
    threads = sorted({int(t) for r in rows if (t := _number(r.get("num_threads"))) is not None})
    used = f" (the rows' torch used {'/'.join(map(str, threads))} thread{'s' * (threads != [1])})" if threads else ""
    if not busy:
        return (
            f"The machine was quiet while the {'row was' if len(recorded) == 1 else f'{len(recorded)} rows were'} "
            f"measured: other processes kept at most {most:.1f} cores busy{used}."
        )
    gpus = sum(1 for _, gpu in busy if gpu)
    return (
        f"Other processes kept up to {most:.1f} cores busy{used}"
        + (f", and shared the GPU during {gpus} rows" if gpus else "")
        + (" while the row was measured" if len(recorded) == 1 else f", during {len(busy)} of {len(recorded)} rows")
        + ": those times are inflated, and no sentence compares them with another row."
    )
