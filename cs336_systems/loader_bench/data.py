"""The dataset over a store, the per-epoch sampler, the DataLoader and the copy to the device."""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ..lifetime import die_with_parent
from .config import BenchConfig, LoaderConfig


class StoreDataset(Dataset):
    """Items of a store as uint8 tensors. Keys are (epoch, index) pairs from EpochSampler."""

    def __init__(self, bench: BenchConfig):
        self.bench = bench
        self._store = None  # opened in each worker on first use

    def __len__(self) -> int:
        return self.bench.num_items

    def __getitem__(self, key: tuple[int, int]) -> torch.Tensor:
        if self._store is None:
            self._store = self.bench.open_store()
        epoch, index = key
        return torch.frombuffer(bytearray(self._store.fetch(index, epoch)), dtype=torch.uint8)


class EpochSampler(Sampler):
    """A seeded shuffle of `indices`, new each epoch. With `tag_epoch` it yields (epoch, index):
    a persistent worker keeps the Dataset it started with, so an epoch set on the Dataset in
    the main process would never reach it, while sampler output does."""

    def __init__(self, indices: Sequence[int], seed: int, tag_epoch: bool):
        self.indices, self.seed, self.tag_epoch = list(indices), seed, tag_epoch
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.indices)

    def __iter__(self):
        order = list(self.indices)
        random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        return iter([(self.epoch, i) for i in order] if self.tag_epoch else order)


def _worker_init(worker_id: int) -> None:
    die_with_parent()  # not left behind by a SIGKILLed benchmark
    torch.set_num_threads(1)  # workers fetch; they must not fight the training step for cores


def make_loader(dataset: Dataset, sampler: Sampler, bench: BenchConfig, loader: LoaderConfig, pin: bool) -> DataLoader:
    kwargs = {}
    if loader.num_workers > 0:
        kwargs = dict(prefetch_factor=loader.prefetch_factor, persistent_workers=loader.persistent_workers)
    return DataLoader(
        dataset,
        batch_size=bench.batch_size,
        sampler=sampler,
        drop_last=True,
        num_workers=loader.num_workers,
        pin_memory=pin,
        worker_init_fn=_worker_init,
        **kwargs,
    )


def to_device(batch, device: torch.device, non_blocking: bool):
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return {key: to_device(value, device, non_blocking) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(value, device, non_blocking) for value in batch)
    return batch


def batch_nbytes(batch) -> int:
    if isinstance(batch, torch.Tensor):
        return batch.numel() * batch.element_size()
    if isinstance(batch, dict):
        return sum(batch_nbytes(value) for value in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(batch_nbytes(value) for value in batch)
    return 0
