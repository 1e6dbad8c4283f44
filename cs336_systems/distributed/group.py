"""The process group: what a rank knows, launch checks, devices, threads, joining and leaving."""

from __future__ import annotations

import datetime as dt
import os
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from ..device import first_line, is_out_of_memory
from ..errors import UsageError
from ..results import Environment
from ..usercode import UserCodeTimeout

BACKENDS = ("gloo", "nccl")
INJECT_FAILURE_ENV = "CS336_SYSTEMS_INJECT_FAILURE"
DEFAULT_INIT_TIMEOUT_S = 120.0  # spawning N ranks that each import torch, then the rendezvous
_SOURCE_LOCATION = re.compile(r"^\[[^\]]+\.(?:cc|cpp|h):\d+\] ")  # gloo's "[/path/pair.cc:537] " prefix
_GLOO_HINT = re.compile(r" This is typically caused by .*$")  # gloo's advice after a lost peer, and an emoji


class LaunchError(UsageError):
    """A launch this machine cannot do (NCCL without CUDA, more ranks than GPUs)."""


@dataclass(frozen=True)
class RankContext:
    """What a worker knows about its place in the group."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device
    launcher: str  # "spawn" or "torchrun"

    def barrier(self) -> None:
        if self.backend == "nccl":
            dist.barrier(device_ids=[self.device.index])
        else:
            dist.barrier()


@dataclass(frozen=True)
class LaunchSpec:
    backend: str
    world_size: int
    threads_per_rank: int
    init_timeout_s: float = DEFAULT_INIT_TIMEOUT_S
    collective_timeout_s: float = 600.0  # torch.distributed's own timeout: a backstop behind ours
    device: str = "auto"  # auto (the backend's own), cpu, cuda or cuda:N (rank r on cuda:N+r)
    probe_links: bool = False  # probe the ring's links on one host too (links.py; across hosts always)


@dataclass
class GroupResult:
    """One unit's outcome: every rank's message (None from ranks that sat it out), or why not."""

    status: str  # ok, oom, error, timeout
    messages: list[Any] = field(default_factory=list)
    error: str | None = None
    environment: Environment | None = None  # rank 0's
    columns: dict = field(default_factory=dict)  # where the ranks ran, the links probed (links.rank_columns)
    links: Any = None  # links.Links when probed


Worker = Callable[[RankContext, Any], Any]


# -- devices, threads, ports --------------------------------------------------------------


def parse_rank_device(text: str, backend: str) -> tuple[str, int]:
    """--device as (type, first GPU index): auto is cuda for nccl and cpu for gloo. gloo also
    all-reduces CUDA tensors, so gloo + cuda is allowed; nccl only knows CUDA tensors."""
    if text == "auto":
        return ("cuda" if backend == "nccl" else "cpu"), 0
    kind, _, index = text.partition(":")
    if kind not in ("cpu", "cuda") or (kind == "cpu" and index) or (index and not index.isdigit()):
        raise LaunchError(f"unknown device {text!r}; choose auto, cpu, cuda or cuda:N")
    if backend == "nccl" and kind == "cpu":
        raise LaunchError("--backend nccl works on CUDA tensors only: --device cpu does not fit (use --backend gloo)")
    return kind, int(index or 0)


def device_for(backend: str, local_rank: int, device: str = "auto") -> torch.device:
    """This rank's device: one GPU per rank (cuda:N + local rank), or the CPU."""
    kind, first = parse_rank_device(device, backend)
    return torch.device("cuda", first + local_rank) if kind == "cuda" else torch.device("cpu")


def check_launch(backend: str, world_size: int, device: str = "auto") -> None:
    """Raise LaunchError (a user error) for a launch this machine cannot run."""
    if backend not in BACKENDS:
        raise LaunchError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if world_size < 1:
        raise LaunchError(f"world size must be at least 1, got {world_size}")
    kind, first = parse_rank_device(device, backend)
    if backend == "gloo" and not dist.is_gloo_available():
        raise LaunchError("this torch build has no gloo backend")
    if backend == "nccl" and torch.cuda.is_available() and not dist.is_nccl_available():
        raise LaunchError("this torch build has no NCCL backend")
    if kind == "cuda":
        if not torch.cuda.is_available():
            needs = "--backend nccl needs" if backend == "nccl" else "--device cuda needs"
            raise LaunchError(f"{needs} CUDA GPUs; this machine has none (use --backend gloo on CPU)")
        if first + world_size > torch.cuda.device_count():
            raise LaunchError(
                f"one rank per GPU: world size {world_size} from cuda:{first} needs more than the "
                f"{torch.cuda.device_count()} CUDA device(s) here"
            )


def usable_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def default_threads_per_rank(world_size: int) -> int:
    """An equal share of this machine's cores, at least one thread."""
    return max(1, len(usable_cpus()) // world_size)


def oversubscription_note(backend: str, world_size: int, threads_per_rank: int) -> str | None:
    cores = len(usable_cpus())
    if backend == "nccl" or world_size * threads_per_rank <= cores:
        return None
    return (
        f"oversubscribed: {world_size} ranks x {threads_per_rank} thread(s) on {cores} cores "
        "(ranks share cores, so times include waiting for a core)"
    )


def find_free_port() -> int:
    """A TCP port nothing listens on now (the OS picks it; a race with another program is possible)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


LOOPBACK = "127.0.0.1"


def local_store(port: int, world_size: int, rank: int, timeout_s: float) -> dist.TCPStore:
    """The rendezvous store of ranks spawned on this machine, listening on 127.0.0.1 only: torch's own
    TCPStore server listens on every interface, so rank 0 binds the socket itself and hands it over."""
    timeout = dt.timedelta(seconds=timeout_s)
    if rank != 0:
        return dist.TCPStore(LOOPBACK, port, world_size, is_master=False, timeout=timeout)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((LOOPBACK, port))
    listener.listen(max(128, world_size))
    # the store serves on this socket from now on: detached, so that Python never closes it
    return dist.TCPStore(
        LOOPBACK, port, world_size, is_master=True, master_listen_fd=listener.detach(), timeout=timeout
    )


def loopback_interface() -> str | None:
    """The name of the loopback interface ('lo' on Linux), for GLOO_SOCKET_IFNAME; None if there is none."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    return "lo" if "lo" in names else None


def bind_threads(threads_per_rank: int) -> None:
    """torch's intra-op threads for this rank (OMP_NUM_THREADS was set before torch was imported)."""
    torch.set_num_threads(threads_per_rank)


# -- process group ----------------------------------------------------------------------


def init_group(spec: LaunchSpec, rank: int, local_rank: int, launcher: str, store: Any = None) -> RankContext:
    """init_process_group from MASTER_ADDR/MASTER_PORT in the environment (env://), or on `store` (a
    rendezvous already joined: torchrun.join_rendezvous)."""
    device = device_for(spec.backend, local_rank, spec.device)
    options: dict[str, Any] = {}
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if spec.backend == "nccl":
        options["device_id"] = device  # eager NCCL init: the rendezvous happens (or fails) here
    if store is not None:
        options["store"] = store
    dist.init_process_group(
        spec.backend,
        rank=rank,
        world_size=spec.world_size,
        timeout=dt.timedelta(seconds=spec.collective_timeout_s),
        **options,
    )
    return RankContext(rank, spec.world_size, local_rank, spec.backend, device, launcher)


def leave_group(ctx: RankContext) -> None:
    """Leave together: the barrier keeps a fast rank from tearing down a peer's connections."""
    ctx.barrier()
    dist.destroy_process_group()


def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    """In place: the sum over ranks, divided by the world size (what data parallelism averages)."""
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor.div_(dist.get_world_size())


def maybe_inject_failure(rank: int, joining: bool = False) -> None:
    """Test-only: fail this rank as CS336_SYSTEMS_INJECT_FAILURE says (`join`: hang before joining the group)."""
    target, _, mode = os.environ.get(INJECT_FAILURE_ENV, "").partition(":")
    if not target or int(target) != rank or (mode == "join") != joining:
        return
    if mode == "exit":
        os._exit(3)
    if mode in ("hang", "join"):
        while True:
            time.sleep(60)
    raise RuntimeError(f"injected failure on rank {rank} ({INJECT_FAILURE_ENV})")


def _describe_failure(exc: BaseException) -> tuple[str, str]:
    status = "oom" if is_out_of_memory(exc) else "timeout" if isinstance(exc, UserCodeTimeout) else "error"
    return status, f"{type(exc).__name__}: {_GLOO_HINT.sub('', _SOURCE_LOCATION.sub('', first_line(exc)))}"
