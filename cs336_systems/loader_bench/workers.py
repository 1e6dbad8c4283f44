"""Memory of the loader's worker processes, sampled while an epoch runs."""

from __future__ import annotations

import contextlib
import shutil
import threading

import psutil

MEMORY_SAMPLE_INTERVAL_S = 0.1


def _shm_used_bytes() -> int | None:
    try:
        return shutil.disk_usage("/dev/shm").used
    except OSError:
        return None


class WorkerMemorySampler:
    """Peak memory of this process's loader workers over an epoch, sampled on a thread.

    worker RSS counts the pages a forked worker shares with the main process (the Python heap
    and libraries it inherited) once per worker; USS is what only the workers hold; /dev/shm
    growth is the batches in flight between workers and the main process (machine-wide).
    """

    def __init__(self, exclude_pids: set[int], interval_s: float = MEMORY_SAMPLE_INTERVAL_S):
        self.exclude, self.interval_s = exclude_pids, interval_s
        self.rss = self.uss = self.shm = 0
        self._stop = threading.Event()
        self._shm0 = _shm_used_bytes()
        self._thread = threading.Thread(target=self._run, name="loader-memory", daemon=True)

    def _sample(self) -> None:
        workers = [p for p in psutil.Process().children() if p.pid not in self.exclude]
        rss = uss = 0
        for worker in workers:
            with contextlib.suppress(psutil.Error):
                info = worker.memory_full_info()
                rss, uss = rss + info.rss, uss + info.uss
        self.rss, self.uss = max(self.rss, rss), max(self.uss, uss)
        shm = _shm_used_bytes()
        if shm is not None and self._shm0 is not None:
            self.shm = max(self.shm, shm - self._shm0)

    def _run(self) -> None:
        delay = 0.01  # start often, so a short epoch still has samples, then every interval_s
        while not self._stop.wait(delay):
            self._sample()
            delay = min(2 * delay, self.interval_s)

    def __enter__(self) -> WorkerMemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
