"""What one run measures: the loader flags swept (LoaderConfig) and the data and step (BenchConfig)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from torch.utils.data import Dataset

from ..errors import UsageError
from ..latency_model import LatencyModel
from ..loading import load_callable
from ..storage import HttpStore, LocalStore, SimulatedStore
from ..usercode import UserCodeError, UserCodeTimeout, guarded, import_limit_s

COMPUTE_KINDS = ("sleep", "tiny-model")
LOADER_FLAGS = ("processes", "num_workers", "prefetch_factor", "pin_memory", "persistent_workers")


@dataclass(frozen=True)
class LoaderConfig:
    """One combination of the swept flags."""

    num_workers: int = 0
    prefetch_factor: int | None = None  # None when num_workers is 0 (torch refuses one then)
    pin_memory: bool = False
    persistent_workers: bool = False
    processes: int = 1
    child_processes: bool = False  # True: the `processes` run as separate child processes

    def describe(self) -> str:
        text = (
            f"workers={self.num_workers} prefetch={self.prefetch_factor} pin={str(self.pin_memory).lower()} "
            f"persistent={str(self.persistent_workers).lower()}"
        )
        return f"processes={self.processes} {text}" if self.child_processes else text

    def flags(self) -> str:
        parts = [f"--num-workers {self.num_workers}"]
        if self.prefetch_factor is not None:
            parts.append(f"--prefetch-factor {self.prefetch_factor}")
        parts += [
            f"--pin-memory {str(self.pin_memory).lower()}",
            f"--persistent-workers {str(self.persistent_workers).lower()}",
        ]
        if self.child_processes:
            parts.insert(0, f"--processes {self.processes}")
        return " ".join(parts)


def loader_grid(
    num_workers: Sequence[int],
    prefetch_factors: Sequence[int],
    pin_memory: Sequence[bool],
    persistent_workers: Sequence[bool],
    processes: Sequence[int] | None = None,
) -> list[LoaderConfig]:
    """Every combination, in flag order; prefetch and persistence mean nothing without workers,
    so those combinations collapse into one."""
    configs: list[LoaderConfig] = []
    for n, workers, prefetch, pin, persistent in itertools.product(
        processes or [1], num_workers, prefetch_factors, pin_memory, persistent_workers
    ):
        config = LoaderConfig(
            num_workers=workers,
            prefetch_factor=prefetch if workers > 0 else None,
            pin_memory=pin,
            persistent_workers=persistent if workers > 0 else False,
            processes=n,
            child_processes=processes is not None,
        )
        if config not in configs:
            configs.append(config)
    return configs


@dataclass(frozen=True)
class BenchConfig:
    """What stays fixed across the sweep: the data, the step, the device."""

    storage: str = "simulated"  # simulated, local, http, or "dataset" for --dataset
    num_items: int = 256
    item_bytes: int | None = 64 * 1024
    batch_size: int = 8
    epochs: int = 2
    model: LatencyModel = field(default_factory=LatencyModel)
    compute: str = "sleep"  # "sleep": stand-in of compute_ms; "tiny-model": a real training step
    compute_ms: float | None = 20.0
    device: str = "cpu"
    seed: int = 0
    dataset: str | None = None  # package.module:callable returning a map-style Dataset
    location: str | None = None  # data directory (local) or URL (http), set once the store is up
    data_dir: str | None = None  # where the item files are (local and http)

    @property
    def batch_bytes(self) -> int | None:
        return None if self.item_bytes is None else self.batch_size * self.item_bytes

    def open_store(self):
        if self.storage == "simulated":
            return SimulatedStore(self.model, self.item_bytes)
        if self.storage == "local":
            return LocalStore(self.location)
        if self.storage == "http":
            return HttpStore(self.location)
        raise ValueError(f"no store for storage {self.storage!r}")


class DatasetError(UsageError):
    """A --dataset that cannot be imported, called or used."""


def load_dataset(spec: str) -> Dataset:
    """Call 'package.module:callable' (no arguments); it must return a map-style Dataset. The call and its
    len() run under usercode.guarded with an import's limit (it only builds): exiting, any BaseException or
    a hang is a DatasetError of one line too."""
    target = load_callable(spec, "--dataset", DatasetError)
    try:
        with guarded(f"--dataset {spec}", import_limit_s()):
            dataset = target()
            if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
                raise DatasetError(f"--dataset {spec} returned {type(dataset).__name__}, expected a map-style Dataset")
            len(dataset)
    except (UserCodeError, UserCodeTimeout) as exc:
        raise DatasetError(str(exc)) from None
    except DatasetError:
        raise
    except Exception as exc:
        raise DatasetError(f"--dataset {spec} raised {type(exc).__name__}: {exc}") from exc
    return dataset
