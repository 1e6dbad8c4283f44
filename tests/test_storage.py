"""Storage backends: closed forms of the simulated store, real files, a real HTTP server."""

import signal
import subprocess
import time
import urllib.error
import urllib.request

import psutil
import pytest

from cs336_systems.latency_model import LatencyModel, unit_hash
from cs336_systems.storage import (
    HttpStore,
    LocalStore,
    SimulatedStore,
    StorageError,
    evict_page_cache,
    filesystem_type,
    http_server,
    item_path,
    item_payload,
    write_items,
)
from tests.helpers import PYTHON, child_env


def test_item_time_closed_form():
    model = LatencyModel(latency_ms=10, bandwidth_bytes_per_s=1e6)
    assert model.item_s(3, 0, 5_000) == pytest.approx(0.010 + 0.005)
    assert model.mean_item_s(0, 5_000) == pytest.approx(0.015)
    assert model.batch_s([1, 2, 3, 4], 0, 5_000) == pytest.approx(4 * 0.015)  # one after another
    assert LatencyModel(latency_ms=10).item_s(0, 0, 10**9) == pytest.approx(0.010)  # unlimited bandwidth


def test_cold_then_warm_cache():
    model = LatencyModel(latency_ms=20, cache_hit_rates=(0.0, 0.5, 0.9), warm_latency_ms=1, seed=7)
    n, nbytes = 10_000, 1000
    cached = [{i for i in range(n) if model.is_cached(i, epoch)} for epoch in range(4)]
    assert not cached[0]
    assert len(cached[1]) / n == pytest.approx(0.5, abs=0.02)
    assert len(cached[2]) / n == pytest.approx(0.9, abs=0.02)
    assert cached[1] <= cached[2] == cached[3]  # hits nest; the last rate repeats
    assert model.item_s(next(iter(cached[1])), 1, nbytes) == pytest.approx(0.001)
    # expectation h*warm + (1-h)*(latency + transfer), and the dataset mean agrees with it
    assert model.mean_item_s(1, nbytes) == pytest.approx(0.5 * 0.001 + 0.5 * 0.020)
    mean = sum(model.item_s(i, 2, nbytes) for i in range(n)) / n
    assert mean == pytest.approx(model.mean_item_s(2, nbytes), rel=0.05)


def test_jitter_is_bounded_has_mean_zero_and_is_reproducible():
    model = LatencyModel(latency_ms=10, jitter_ms=4, seed=3)
    times = [model.item_s(i, 0, 0) for i in range(20_000)]
    assert min(times) >= 0.006 and max(times) <= 0.014
    assert sum(times) / len(times) == pytest.approx(0.010, abs=0.0001)
    assert model.item_s(5, 1, 0) == LatencyModel(latency_ms=10, jitter_ms=4, seed=3).item_s(5, 1, 0)
    assert model.item_s(5, 1, 0) != model.item_s(5, 2, 0)  # a new draw per epoch
    assert 0 <= unit_hash(1, 2, 3) < 1 and unit_hash(1, 2, 3) == unit_hash(1, 2, 3)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(latency_ms=5, jitter_ms=6), "jitter"),
        (dict(cache_hit_rates=(0.0, 1.5)), "between 0 and 1"),
        (dict(bandwidth_bytes_per_s=0.0), "bandwidth"),
        (dict(latency_ms=-1), "zero or more"),
    ],
)
def test_invalid_models_are_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        LatencyModel(**changes).validate()


def test_simulated_store_sleeps_the_closed_form():
    slept = []
    model = LatencyModel(latency_ms=8, bandwidth_bytes_per_s=2e6, jitter_ms=2, cache_hit_rates=(0.0, 1.0))
    store = SimulatedStore(model, 4000, sleep=slept.append)
    assert store.fetch(5, 0) == item_payload(5, 4000, 0)
    store.fetch(5, 1)
    assert slept == [model.item_s(5, 0, 4000), 0.0]
    assert len({item_payload(i, 4000) for i in range(50)}) == 50  # items differ


def test_local_files_hold_the_items(tmp_path):
    write_items(tmp_path, 5, 3000, seed=2)
    assert item_path(tmp_path, 4).read_bytes() == item_payload(4, 3000, 2)
    assert LocalStore(tmp_path).fetch(3, 0) == item_payload(3, 3000, 2)


@pytest.mark.skipif(
    filesystem_type("/tmp") not in ("ext4", "xfs", "btrfs") or psutil.disk_io_counters() is None,
    reason="needs a disk-backed temp directory and disk counters",
)
def test_evicted_files_are_read_from_disk(tmp_path_factory):
    root = tmp_path_factory.mktemp("evict", numbered=True)
    if filesystem_type(root) not in ("ext4", "xfs", "btrfs"):
        pytest.skip(f"temp directory on {filesystem_type(root)}")
    write_items(root, 2, 8 << 20)
    assert evict_page_cache(root) is None
    before = psutil.disk_io_counters().read_bytes
    LocalStore(root).fetch(0, 0)
    assert psutil.disk_io_counters().read_bytes - before >= 8 << 20  # other processes can only add


def test_http_server_serves_real_bytes_with_latency_and_bandwidth(tmp_path):
    write_items(tmp_path, 3, 200_000, seed=1)
    model = LatencyModel(latency_ms=150, bandwidth_bytes_per_s=4e6, cache_hit_rates=(0.0, 1.0))
    with http_server(tmp_path, model) as url:
        assert url.startswith("http://127.0.0.1:")
        store = HttpStore(url)
        start = time.perf_counter()
        data = store.fetch(2, 0)
        cold = time.perf_counter() - start
        assert data == item_payload(2, 200_000, 1) == item_path(tmp_path, 2).read_bytes()
        assert cold >= model.item_s(2, 0, 200_000) - 0.005  # 150 ms + 50 ms: it cannot be faster
        start = time.perf_counter()
        assert store.fetch(2, 1) == data  # the item's second request is epoch 1: a cache hit
        assert time.perf_counter() - start < cold  # no latency, no pacing: less than the cold fetch, however busy
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(f"{url}/items/99")
    with pytest.raises(urllib.error.URLError):  # the server is gone with the context
        urllib.request.urlopen(f"{url}/items/0", timeout=2)


def test_http_server_that_cannot_start_is_one_error(tmp_path):
    with pytest.raises(StorageError, match="did not start"), http_server(tmp_path, LatencyModel(latency_ms=-5)):
        pass


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--latency-ms", "-1"], "must be zero or more"),
        (["--bandwidth", "fast"], "not a size"),
        (["--cache-hit-rate", "x"], "expected a number"),
        (["--port", "99999"], "must be a port from 0 to 65535"),
    ],
)
def test_serve_flags_are_typed_and_bad_input_is_one_line(capsys, tmp_path, args, message):
    from cs336_systems.storage import main

    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--root", str(tmp_path), *args])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and err.strip().count("\n") == 0


def test_server_arguments_parse_back_to_the_same_model():
    from cs336_systems.storage import build_parser, model_from_args, server_arguments

    model = LatencyModel(latency_ms=5.0, bandwidth_bytes_per_s=20e6, jitter_ms=1.0, cache_hit_rates=(0.0, 0.9), seed=3)
    args = build_parser().parse_args(["serve", "--root", ".", *server_arguments(model)])
    assert model_from_args(args) == model


def test_storage_serve_listens_on_this_machine_unless_told_and_a_bad_interface_is_one_line(tmp_path, capsys):
    from cs336_systems.storage import ItemServer, main

    server = ItemServer(tmp_path, LatencyModel())
    try:
        assert server.server_address[0] == "127.0.0.1" and server.url.startswith("http://127.0.0.1:")
    finally:
        server.server_close()
    code = main(["serve", "--root", str(tmp_path), "--host", "203.0.113.7"])  # an address that is not this machine's
    err = capsys.readouterr().err
    assert code == 2 and "--host 203.0.113.7: cannot listen there" in err and err.count("\n") == 1


@pytest.mark.parametrize(("stop", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_storage_serve_ends_on_a_signal_with_the_exit_rules_status(tmp_path, stop, status):
    process = subprocess.Popen(
        [PYTHON, "-m", "cs336_systems.storage", "serve", "--root", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        assert process.stdout.readline().startswith("http://127.0.0.1:")
        process.send_signal(stop)
        assert process.wait(timeout=60) == status
        assert "Traceback" not in process.stderr.read()
    finally:
        process.kill()
        process.wait()
        process.stdout.close()
        process.stderr.close()
