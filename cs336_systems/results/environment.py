"""Where a row was measured: device, library versions, numeric flags' host, commit.

Collected once per process and device; every record carries it, so a number pasted into a
write-up traces back to the machine and the commit that produced it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import os
import platform
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..placement import PLACEMENT_FIELDS, placement

if TYPE_CHECKING:
    import torch

GIT_COMMIT_ENV = "CS336_SYSTEMS_GIT_COMMIT"  # set where the harness runs from a copy without .git
# The CPU name rows record instead of this machine's: CI runs tests under a long one, so none depends on the name.
FAKE_CPU_NAME_ENV = "CS336_BENCH_FAKE_CPU_NAME"
# The harness's own outputs: a checkout that differs only here still runs committed code.
OUTPUT_DIRS = ("results", "writeup")


@dataclass(frozen=True)
class Environment:
    """Where a row was measured. Collected once per process and device."""

    device_name: str
    torch_version: str
    cuda_version: str | None
    cudnn_version: int | None
    python_version: str
    platform: str
    cpu_name: str
    device_memory_bytes: int | None
    num_threads: int
    hostname: str
    git_commit: str
    git_dirty: bool | None
    # Which process ran the row (placement): the executor, the Slurm job (array job_task, as squeue names
    # it) and the physical GPU of the node the device is (placement.py). Added last, so files written before
    # them gain empty cells at the end (ADDED_FIELDS).
    executor: str | None = None
    slurm_job_id: str | None = None
    slurm_array_task_id: int | None = None
    gpu_id: str | None = None
    # How busy other processes kept the machine while the row was measured (contention.py): cores busy
    # elsewhere, our own share of the cores we asked for, other processes on our GPU. Added last too.
    other_load_cores: float | None = None
    own_cpu_share: float | None = None
    gpu_other_processes: int | None = None


ENVIRONMENT_FIELDS = tuple(f.name for f in dataclasses.fields(Environment))
LOAD_FIELDS = ("other_load_cores", "own_cpu_share", "gpu_other_processes")
# columns added at the end of every row after files were written: such a file gains them, empty
ADDED_FIELDS = (*PLACEMENT_FIELDS, *LOAD_FIELDS)


def _cpu_name() -> str:
    if os.environ.get(FAKE_CPU_NAME_ENV):
        return os.environ[FAKE_CPU_NAME_ENV]
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _physical_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def checkout_state(root: Path) -> tuple[str, bool | None]:
    """(commit, dirty) of the git checkout at `root`; dirty means tracked files differ from
    HEAD outside OUTPUT_DIRS, so regenerating results one after another stays clean."""
    if not (root / ".git").exists():
        return "unknown", None
    excludes = [f":(exclude){name}" for name in OUTPUT_DIRS]
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--", ".", *excludes],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown", None
    return commit, bool(status.strip())


@functools.cache
def harness_commit() -> tuple[str, bool | None]:
    """(commit, dirty) of the checkout this package runs from; 'unknown' outside git."""
    if os.environ.get(GIT_COMMIT_ENV):
        return os.environ[GIT_COMMIT_ENV], None
    return checkout_state(Path(__file__).resolve().parents[2])


def collect_environment(device: torch.device) -> Environment:
    import torch  # here, so the monitor and storage import results without torch

    commit, dirty = harness_commit()
    cpu_name = _cpu_name()
    if device.type == "cuda":
        device_memory = torch.cuda.get_device_properties(device).total_memory
    else:
        device_memory = _physical_memory_bytes()
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name
    return Environment(
        device_name=device_name,
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda,
        cudnn_version=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        python_version=platform.python_version(),
        platform=platform.platform(),
        cpu_name=cpu_name,
        device_memory_bytes=device_memory,
        num_threads=torch.get_num_threads(),
        hostname=socket.gethostname(),
        git_commit=commit,
        git_dirty=dirty,
        **placement(device.type, device.index),
    )


def utc_timestamp() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
