"""Where training items come from: a simulated store, local files, or an HTTP server.

Every store serves `num_items` items of `item_bytes` bytes through
`fetch(index, epoch) -> bytes`; a DataLoader worker calls it for the items of its batch
one after another, as a Dataset's __getitem__ does.

  simulated  sleeps for the closed-form time of `LatencyModel.item_s` and returns the bytes:
             latency (+ uniform jitter) + item_bytes / bandwidth for an item not in cache,
             `warm_latency_ms` for a cached one; epoch e serves a fraction cache_hit_rates[e]
             of the items from cache (the last rate repeats), so "0 0.9" is a cold first epoch.
  local      real files in a directory, read with open().read(); their pages are evicted from
             the OS page cache (posix_fadvise DONTNEED) so the first epoch reads the disk.
  http       a real HTTP server on 127.0.0.1 in its own process (ThreadingHTTPServer), serving
             those files with the same LatencyModel: it waits latency (+ jitter) before the first
             byte, then paces the body at `bandwidth`; each item's n-th request is its epoch n.

This module does not import torch (the server process starts in a fraction of a second).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import random
import re
import selectors
import signal
import stat
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from .argtypes import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    ArgumentParser,
    byte_size,
    non_negative_float,
    port_number,
)
from .command import Command
from .errors import UsageError
from .latency_model import LatencyModel
from .lifetime import child_preexec
from .tools import module_name, prog

STORAGE_KINDS = ("simulated", "local", "http")
HOST = "127.0.0.1"
CHUNK_BYTES = 64 * 1024  # the server writes and paces the body in chunks of this size


class StorageError(UsageError):
    """A store that cannot be set up (server did not start, files cannot be written)."""


# -- item contents ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=4)
def _random_block(item_bytes: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(item_bytes)


def item_payload(index: int, item_bytes: int, seed: int = 0) -> bytes:
    """The bytes of item `index`: the same for every store (a rotation of one random block,
    so making an item costs two memory copies, not a random-number generator)."""
    block = _random_block(item_bytes, seed)
    k = (index * 7919) % item_bytes
    return block[k:] + block[:k]


def item_path(root: Path, index: int) -> Path:
    return Path(root) / f"item_{index:07d}.bin"


# -- the stores --------------------------------------------------------------------------------


class SimulatedStore:
    kind = "simulated"

    def __init__(self, model: LatencyModel, item_bytes: int, sleep: Callable[[float], None] = time.sleep):
        self.model, self.item_bytes, self.sleep = model, item_bytes, sleep

    def fetch(self, index: int, epoch: int) -> bytes:
        self.sleep(self.model.item_s(index, epoch, self.item_bytes))
        return item_payload(index, self.item_bytes, self.model.seed)


class LocalStore:
    kind = "local"

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def fetch(self, index: int, epoch: int) -> bytes:
        with item_path(self.root, index).open("rb") as handle:
            return handle.read()


class HttpStore:
    kind = "http"

    def __init__(self, url: str, timeout_s: float = 60.0):
        self.url, self.timeout_s = url.rstrip("/"), timeout_s

    def fetch(self, index: int, epoch: int) -> bytes:
        # A new connection per item, as a loader fetching images one by one does.
        with urllib.request.urlopen(f"{self.url}/items/{index}", timeout=self.timeout_s) as response:
            return response.read()


ITEMS_MARK = ".cs336-bench-items"  # in a --data-dir: its item files are loader_bench's to write again


def check_data_dir(root: str | Path, num_items: int) -> None:
    """--data-dir before any work: a directory (or none yet), and no item file there a link, not a file, or
    one that loader_bench did not write (the items are written there, over no file of the user's, never through
    a link). StorageError (one line) otherwise."""
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise StorageError(f"--data-dir {root}: not a directory")
    if not root.is_dir():
        return
    ours = (root / ITEMS_MARK).is_file()
    for index in range(num_items):
        path = item_path(root, index)
        with contextlib.suppress(FileNotFoundError):
            mode = os.lstat(path).st_mode
            if not stat.S_ISREG(mode):
                what = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
                raise StorageError(f"--data-dir {root}: {path.name} is {what}; item files are written only as files")
            if not ours:
                raise StorageError(f"--data-dir {root}: {path.name} is there and loader_bench did not write it")


def write_items(root: str | Path, num_items: int, item_bytes: int, seed: int = 0) -> None:
    """Write the dataset as one file per item, flushed to disk (so the page cache can drop it); never
    through a link planted at an item's name."""
    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        os.close(os.open(root / ITEMS_MARK, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644))
        for index in range(num_items):
            fd = os.open(item_path(root, index), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as handle:
                handle.write(item_payload(index, item_bytes, seed))
                handle.flush()
                os.fsync(handle.fileno())
    except OSError as exc:
        raise StorageError(f"--data-dir {root}: cannot write the item files ({exc.strerror})") from None


def filesystem_type(path: str | Path) -> str | None:
    """The filesystem holding `path` (from /proc/mounts), e.g. 'ext4' or 'tmpfs'."""
    try:
        mounts = [line.split() for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return None
    resolved, best = str(Path(path).resolve()), ("", None)
    for fields in mounts:
        mount = fields[1] if len(fields) >= 3 else None
        inside = mount is not None and (resolved == mount or resolved.startswith(mount.rstrip("/") + "/"))
        if inside and len(mount) > len(best[0]):
            best = (mount, fields[2])
    return best[1]


def evict_page_cache(root: str | Path) -> str | None:
    """Drop the files' pages from the OS page cache so the next read goes to the disk.

    Returns None when done, else why it cannot be done (then reads may come from memory).
    """
    if not hasattr(os, "posix_fadvise"):
        return "posix_fadvise is not available on this OS: the page cache was not evicted"
    kind = filesystem_type(root)
    if kind in ("tmpfs", "ramfs"):
        return f"{root} is on {kind} (memory): there is no disk to read from"
    for path in sorted(Path(root).glob("item_*.bin")):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return None


# -- the HTTP server ---------------------------------------------------------------------------


class ItemServer(ThreadingHTTPServer):
    """Serves GET /items/<index> from `root`, delayed and paced by `model`."""

    daemon_threads = True
    request_queue_size = 256  # many loader workers may connect at once

    def __init__(self, root: Path, model: LatencyModel, port: int = 0, host: str = HOST):
        super().__init__((host, port), _ItemHandler)
        self.root, self.model = Path(root), model
        self._requests: dict[int, int] = {}
        self._lock = threading.Lock()

    def next_epoch(self, index: int) -> int:
        """The n-th request of an item (from 0) is its epoch n."""
        with self._lock:
            epoch = self._requests.get(index, 0)
            self._requests[index] = epoch + 1
        return epoch

    @property
    def url(self) -> str:
        return f"http://{self.server_address[0]}:{self.server_address[1]}"


class _ItemHandler(BaseHTTPRequestHandler):
    server: ItemServer

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        match = re.fullmatch(r"/items/(\d+)", self.path)
        path = item_path(self.server.root, int(match.group(1))) if match else None
        if path is None or not path.is_file():
            self.send_error(404, "no such item")
            return
        index = int(match.group(1))
        body = path.read_bytes()
        model = self.server.model
        epoch = self.server.next_epoch(index)
        cached = model.is_cached(index, epoch)
        time.sleep(max(0.0, model.first_byte_s(index, epoch)))
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        start, sent = time.perf_counter(), 0
        for offset in range(0, len(body), CHUNK_BYTES):
            chunk = body[offset : offset + CHUNK_BYTES]
            self.wfile.write(chunk)
            sent += len(chunk)
            if not cached and model.bandwidth_bytes_per_s is not None:
                # pace: the first `sent` bytes may not leave before sent / bandwidth seconds
                delay = start + sent / model.bandwidth_bytes_per_s - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)

    def log_message(self, format, *args) -> None:  # noqa: A002 (silence the per-request log)
        pass


def server_arguments(model: LatencyModel) -> list[str]:
    args = [
        "--latency-ms",
        repr(model.latency_ms),
        "--jitter-ms",
        repr(model.jitter_ms),
        "--warm-latency-ms",
        repr(model.warm_latency_ms),
        "--seed",
        str(model.seed),
        "--cache-hit-rates",
        *(repr(rate) for rate in model.cache_hit_rates),
    ]
    if model.bandwidth_bytes_per_s is not None:
        args += ["--bandwidth", str(int(model.bandwidth_bytes_per_s))]
    return args


@contextlib.contextmanager
def http_server(root: str | Path, model: LatencyModel, start_timeout_s: float = 30.0) -> Iterator[str]:
    """Start `python -m cs336_systems.storage serve` in its own process; yield its URL."""
    command = [sys.executable, "-m", module_name("storage"), "serve", "--root", str(root), *server_arguments(model)]
    variables = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    # its own session: a terminal's Ctrl-C reaches the benchmark, which stops the server itself;
    # and it dies with this process, even a SIGKILLed one
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=variables,
        start_new_session=True,
        preexec_fn=child_preexec(),
    )
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            ready = selector.select(timeout=start_timeout_s)
        line = process.stdout.readline().strip() if ready else ""
        if not line.startswith("http://"):
            process.kill()
            _, stderr = process.communicate()
            raise StorageError(f"the HTTP server did not start: {stderr.strip().splitlines()[-1:] or 'no output'}")
        yield line
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for stream in (process.stdout, process.stderr):
            if stream:
                stream.close()


def model_from_args(args: argparse.Namespace) -> LatencyModel:
    model = LatencyModel(
        latency_ms=args.latency_ms,
        bandwidth_bytes_per_s=args.bandwidth,
        jitter_ms=args.jitter_ms,
        cache_hit_rates=tuple(args.cache_hit_rates),
        warm_latency_ms=args.warm_latency_ms,
        seed=args.seed,
    )
    model.validate()
    return model


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog=prog("storage"))
    sub = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)
    serve = sub.add_parser("serve", help="serve root/item_NNNNNNN.bin as GET /items/N on 127.0.0.1")
    serve.add_argument("--root", type=Path, required=True)
    serve.add_argument("--port", type=port_number, default=0, help="0: any free port (the URL is printed)")
    serve.add_argument(
        "--host", default=HOST, help=f"the interface to listen on ({HOST}: this machine only; 0.0.0.0: every one)"
    )
    serve.add_argument("--latency-ms", type=non_negative_float, default=0.0)
    serve.add_argument(
        "--bandwidth",
        type=byte_size,
        metavar="SIZE",
        help="bytes per second per request, e.g. 20MB (default unlimited)",
    )
    serve.add_argument("--jitter-ms", type=non_negative_float, default=0.0)
    serve.add_argument(
        "--cache-hit-rates", "--cache-hit-rate", type=non_negative_float, nargs="+", default=[0.0], metavar="RATE"
    )
    serve.add_argument("--warm-latency-ms", type=non_negative_float, default=0.0)
    serve.add_argument("--seed", type=int, default=0)
    return parser


def run(args: argparse.Namespace) -> int:
    """python -m cs336_systems.storage serve --root DIR [model flags]: serve until SIGTERM (exit 143) or
    Ctrl-C (130), as every tool ends on them (docs/exit-rule.md)."""
    model = model_from_args(args)
    try:
        server = ItemServer(args.root, model, args.port, args.host)
    except OSError as exc:  # a port taken or below 1024, an address not this machine's
        raise StorageError(f"--port {args.port} --host {args.host}: cannot listen there ({exc.strerror})") from None
    stopped_by: list[int] = []

    def stop(signum, frame) -> None:
        stopped_by.append(signum)
        threading.Thread(target=server.shutdown).start()

    for signum in (signal.SIGTERM, signal.SIGINT):  # the way a server ends, by the exit rule: 143 or 130
        signal.signal(signum, stop)
    print(server.url, flush=True)
    server.serve_forever()
    server.server_close()
    if not stopped_by:
        return EXIT_OK
    terminated = stopped_by[0] == signal.SIGTERM
    print(f"{prog('storage')}: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
    return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED


main = Command(build_parser, run)

__all__ = [
    "STORAGE_KINDS",
    "HttpStore",
    "LatencyModel",
    "LocalStore",
    "SimulatedStore",
    "StorageError",
    "evict_page_cache",
    "http_server",
    "item_payload",
    "write_items",
]

if __name__ == "__main__":
    main.start()
