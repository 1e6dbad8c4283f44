"""Where the ranks run and the links between them: every rank's host, each ring link (rank r to r + 1)
probed before the units when the ranks span hosts (latency: half the fastest of PINGS round trips of 4
bytes; bandwidth: PROBE_BYTES over the median of PROBE_REPEATS sends, less a round trip; one link at a
time), and the ring all-reduce predicted from them: 2(n - 1) steps of S/n bytes over every link at once,
t = 2(n - 1) x latency + 2(n - 1)/n x S / bandwidth with the ring's largest latency and smallest bandwidth
(k all-reduces sharing S pay the latency k times). What it leaves out: docs/distributed.md.
"""

from __future__ import annotations

import re
import socket
import statistics
from collections import Counter
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..results import samples_field
from ..timing import HostTimer, device_synchronizer

PROBE_BYTES = 8_000_000  # 0.3 s on a 200 Mbit/s link; on a fast one, milliseconds
PINGS, PROBE_REPEATS = 10, 3


def bus_factor(world_size: int) -> float:
    """2 (n - 1) / n: the fraction of the data each rank sends (and receives) in a ring all-reduce."""
    return 2 * (world_size - 1) / world_size


@dataclass(frozen=True)
class Links:
    """The ring's links as probed, link r being rank r -> r + 1: one-way latency (ms), bandwidth (bytes/s)."""

    latency_ms: tuple[float, ...]
    bytes_per_s: tuple[float, ...]

    def ring_allreduce_ms(self, size_bytes: float, world_size: int, calls: int = 1) -> float:
        """The model's time for `calls` all-reduces of `size_bytes` in all (the module's docstring)."""
        latency = 2 * (world_size - 1) * max(self.latency_ms) * calls
        return latency + bus_factor(world_size) * size_bytes / min(self.bytes_per_s) * 1e3


@dataclass(kw_only=True)
class RankColumns:
    """A distributed record's columns of where its ranks ran and what the probe found (None: not probed)."""

    nodes: int | None = None  # distinct hosts
    tasks_per_node: int | None = None  # ranks on the busiest host
    rank_hosts: str | None = None  # rank 0's host, rank 1's, ... joined by commas
    link_latency_ms: float | None = None  # the ring's largest one-way latency
    link_gbps: float | None = None  # the ring's smallest bandwidth (GB/s, 1e9 bytes per second)
    link_probe: list[list[float]] = samples_field()  # [latency ms, bytes/s] of every link r -> r + 1


def rank_columns(peers: list[tuple[str, str]] | None, links: Links | None) -> dict:
    """RankColumns' values for ranks on `peers` ((host, address) in rank order) whose ring was probed as `links`."""
    if not peers:
        return {}
    hosts = [host for host, _ in peers]
    columns = dict(nodes=len(set(hosts)), tasks_per_node=max(Counter(hosts).values()), rank_hosts=",".join(hosts))
    if links is not None:
        columns.update(
            link_latency_ms=max(links.latency_ms),
            link_gbps=min(links.bytes_per_s) / 1e9,
            link_probe=[list(pair) for pair in zip(links.latency_ms, links.bytes_per_s, strict=True)],
        )
    return columns


def name_peers(text: str, peers: list[tuple[str, str]], timeout_s: float) -> str:
    """A failure's text with each address of `peers` followed by its host (gloo names a lost peer by its
    address), and what a timed-out collective means."""
    for host, address in set(peers):
        text = re.sub(rf"\[{re.escape(address)}\](:\d+)?", rf"\g<0> ({host})", text) if address else text
    if "Timed out" in text:
        text += (
            f" (a peer sent nothing within the collective timeout, --timeout + --init-timeout = {timeout_s:g} s:"
            " a rank hung, or its link or node was lost)"
        )
    return text


def hosts_and_links(device: torch.device, probe: bool) -> tuple[list[tuple[str, str]], Links | None]:
    """Every rank's (host, address) (every rank calls this after joining the group), and the ring's links
    probed when `probe` or when the ranks span hosts."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    host = socket.gethostname()
    try:
        address = socket.gethostbyname(host)  # gloo's own choice of interface, where none is named
    except OSError:
        address = ""
    peers: list = [None] * world_size
    dist.all_gather_object(peers, (host, address))
    peers = [tuple(peer) for peer in peers]
    if world_size == 1 or not (probe or len({host for host, _ in peers}) > 1):
        return peers, None
    small, big = torch.zeros(1, device=device), torch.zeros(PROBE_BYTES // 4, device=device)
    timer = HostTimer(synchronize=device_synchronizer(device))
    mine = (0.0, 0.0)
    for sender in range(world_size):
        receiver = (sender + 1) % world_size
        if rank == sender:
            mine = _measure(receiver, small, big, timer)
        elif rank == receiver:
            for tensor in [small] * (1 + PINGS) + [big] * PROBE_REPEATS:
                dist.recv(tensor, sender)
                dist.send(small, sender)
    measured: list = [None] * world_size
    dist.all_gather_object(measured, mine)
    return peers, Links(tuple(m[0] for m in measured), tuple(m[1] for m in measured))


def _measure(peer: int, small: torch.Tensor, big: torch.Tensor, timer: HostTimer) -> tuple[float, float]:
    """(one-way latency ms, bytes/s) of this rank's link to `peer`, which answers every message with `small`."""

    def trip(tensor: torch.Tensor) -> float:
        return timer.time_ms(lambda: (dist.send(tensor, peer), dist.recv(small, peer)))

    trip(small)  # the pair's first message sets up its connection
    rtt_ms = min(trip(small) for _ in range(PINGS))
    bulk_ms = statistics.median(trip(big) for _ in range(PROBE_REPEATS))
    return rtt_ms / 2, big.numel() * big.element_size() / max(bulk_ms - rtt_ms, 1e-6) * 1e3
