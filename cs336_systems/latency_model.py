"""How long one item takes to fetch, in closed form: the simulated store sleeps it, the HTTP
server waits and paces it (storage.py), and loader_bench predicts from it. Jitter and cache hits
are drawn from a hash of the item, so every process (each DataLoader worker) draws the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .errors import UsageError

_MASK = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def unit_hash(*keys: int) -> float:
    """A uniform number in [0, 1) fixed by the integer keys: the same in every process."""
    x = 0
    for key in keys:
        x = _splitmix64(x ^ (key & _MASK))
    return (x >> 11) / float(1 << 53)


@dataclass(frozen=True)
class LatencyModel:
    """Time to fetch one item, in closed form (simulated store and HTTP server)."""

    latency_ms: float = 0.0
    bandwidth_bytes_per_s: float | None = None  # None: unlimited
    jitter_ms: float = 0.0  # uniform in [-jitter, +jitter], mean 0, so the mean time is unchanged
    cache_hit_rates: tuple[float, ...] = (0.0,)  # fraction of items served from cache, per epoch
    warm_latency_ms: float = 0.0  # time of a cache hit
    seed: int = 0

    def validate(self) -> None:
        if self.latency_ms < 0 or self.warm_latency_ms < 0:
            raise UsageError("latencies must be zero or more")
        if not 0 <= self.jitter_ms <= self.latency_ms:
            raise UsageError(f"jitter ({self.jitter_ms} ms) must be between 0 and the latency ({self.latency_ms} ms)")
        if self.bandwidth_bytes_per_s is not None and not self.bandwidth_bytes_per_s > 0:
            raise UsageError("bandwidth must be positive")
        if not self.cache_hit_rates or not all(0 <= rate <= 1 for rate in self.cache_hit_rates):
            raise UsageError(f"cache hit rates must be between 0 and 1, got {list(self.cache_hit_rates)}")

    def hit_rate(self, epoch: int) -> float:
        return self.cache_hit_rates[min(epoch, len(self.cache_hit_rates) - 1)]

    def is_cached(self, index: int, epoch: int) -> bool:
        # One fixed draw per item, so the items cached at rate 0.5 are among those cached at 0.9.
        return unit_hash(self.seed, 1, index) < self.hit_rate(epoch)

    def jitter_s(self, index: int, epoch: int) -> float:
        return (2 * unit_hash(self.seed, 2, index, epoch) - 1) * self.jitter_ms / 1e3

    def transfer_s(self, nbytes: int) -> float:
        return 0.0 if self.bandwidth_bytes_per_s is None else nbytes / self.bandwidth_bytes_per_s

    def first_byte_s(self, index: int, epoch: int) -> float:
        if self.is_cached(index, epoch):
            return self.warm_latency_ms / 1e3
        return self.latency_ms / 1e3 + self.jitter_s(index, epoch)

    def item_s(self, index: int, epoch: int, nbytes: int) -> float:
        """Seconds to fetch item `index` in `epoch`: a cache hit costs only the warm latency."""
        if self.is_cached(index, epoch):
            return self.warm_latency_ms / 1e3
        return self.first_byte_s(index, epoch) + self.transfer_s(nbytes)

    def mean_item_s(self, epoch: int, nbytes: int) -> float:
        """Expected seconds per item: h * warm + (1 - h) * (latency + bytes / bandwidth)."""
        h = self.hit_rate(epoch)
        return h * self.warm_latency_ms / 1e3 + (1 - h) * (self.latency_ms / 1e3 + self.transfer_s(nbytes))

    def batch_s(self, indices: Sequence[int], epoch: int, nbytes: int) -> float:
        """One worker fetches a batch's items one after another: the times add up."""
        return sum(self.item_s(i, epoch, nbytes) for i in indices)
