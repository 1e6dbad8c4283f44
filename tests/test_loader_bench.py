"""loader_bench: closed forms, verdicts, the RAM prediction, real DataLoaders, the stories.

The speed-up checks use latency-dominated fetching (sleeps, a local HTTP server), so
they hold on a loaded 2-core machine: waiting does not need a free core.
"""

import dataclasses
import json
import statistics

import pandas as pd
import pytest
import torch

from cs336_systems import loader_bench
from cs336_systems.latency_model import LatencyModel
from cs336_systems.loader_bench import (
    BenchConfig,
    EpochMeasurement,
    LoaderConfig,
    epoch_record,
    loader_grid,
    predicted_buffer_bytes,
    predicted_epoch_s,
    recommend,
    run_configuration,
    verdict,
)
from cs336_systems.results import ResultSink, read_results

SLOW_STORE = ["--storage", "simulated", "--item-bytes", "1KiB", "--compute-ms", "1"]


@pytest.mark.parametrize(
    ("pct", "expected"),
    [
        (0.0, "not input-bound"),
        (4.99, "not input-bound"),
        (5.0, "moderately input-bound"),
        (20.0, "moderately input-bound"),
        (20.01, "input-bound"),
        (93.0, "input-bound"),
    ],
)
def test_verdict_bands(pct, expected):
    assert verdict(pct) == expected


def test_ram_prediction():
    # docs/reference.md section 5: 12 workers x prefetch 3 x 230 MB ~= 8 GB in flight, + the step's batch
    assert predicted_buffer_bytes(12, 3, 230 * 10**6, pinned=False) == 37 * 230 * 10**6
    # pinned: up to 36 batches waiting in shared memory and 37 in page-locked memory
    assert predicted_buffer_bytes(12, 3, 230 * 10**6, pinned=True) == (36 + 37) * 230 * 10**6
    assert predicted_buffer_bytes(0, None, 1000, pinned=False) == 2000  # loading one, the step holds one
    assert predicted_buffer_bytes(0, None, 1000, pinned=True) == 3000


def test_epoch_closed_form():
    # no workers: fetch then compute, every step
    assert predicted_epoch_s(10, 0.04, 0.02, 0) == pytest.approx(10 * 0.06)
    # one worker overlaps fetching with compute: the slower of the two sets the pace
    assert predicted_epoch_s(10, 0.04, 0.02, 1) == pytest.approx(0.04 + 9 * 0.04 + 0.02)
    # enough workers: compute-bound after the first batch
    assert predicted_epoch_s(10, 0.04, 0.02, 4) == pytest.approx(0.04 + 9 * 0.02 + 0.02)
    assert predicted_epoch_s(0, 0.04, 0.02, 4) == 0.0


def test_grid_collapses_flags_that_mean_nothing_without_workers():
    grid = loader_grid([0, 2], [2, 4], [False, True], [False, True])
    assert len(grid) == 2 + 2 * 2 * 2
    assert grid[0] == LoaderConfig(0, None, False, False) and grid[1] == LoaderConfig(0, None, True, False)
    assert all(c.prefetch_factor is None and not c.persistent_workers for c in grid if c.num_workers == 0)
    processes = loader_grid([0], [2], [False], [False], processes=[1, 3])
    assert [(c.processes, c.child_processes) for c in processes] == [(1, True), (3, True)]


def fake_epoch(epoch, wall_s, waits_ms, compute_ms, start=100.0):
    return EpochMeasurement(
        epoch=epoch,
        start_s=start,
        end_s=start + wall_s,
        steps=len(waits_ms),
        samples=4 * len(waits_ms),
        wait_ms=waits_ms,
        h2d_ms=None,
        compute_ms=compute_ms,
        final_wait_ms=0.0,
        batch_bytes=4096,
        worker_rss_bytes=10,
        worker_uss_bytes=5,
        shm_bytes=1,
    )


def test_epoch_record_arithmetic():
    bench = BenchConfig(batch_size=4, item_bytes=1024, model=LatencyModel(latency_ms=10), compute_ms=20)
    loader = LoaderConfig(num_workers=2, prefetch_factor=3)
    record = epoch_record(bench, loader, [fake_epoch(0, 2.0, [100, 100, 100, 100], [250] * 4)], None, "c", None)
    assert record.samples == 16 and record.samples_per_s == pytest.approx(8.0)
    assert record.data_wait_pct == pytest.approx(20.0) and record.verdict == "moderately input-bound"
    assert record.compute_idle_pct == pytest.approx(50.0)
    assert record.predicted_buffer_bytes == (2 * 3 + 1) * 4096 and record.batch_bytes == 4096
    # closed form: fetch 4 x 10 ms per batch, compute 20 ms, 2 workers, 4 steps
    assert record.predicted_samples_per_s == pytest.approx(16 / predicted_epoch_s(4, 0.04, 0.02, 2))
    # processes mode: the epoch spans the earliest start to the latest end; samples add up
    two = [fake_epoch(0, 2.0, [10] * 4, [200] * 4, 100.0), fake_epoch(0, 2.0, [10] * 4, [200] * 4, 100.5)]
    record = epoch_record(bench, LoaderConfig(processes=2, child_processes=True), two, None, "c", None)
    assert record.wall_s == pytest.approx(2.5) and record.samples_per_s == pytest.approx(32 / 2.5)
    assert record.predicted_buffer_bytes == 2 * 2 * 4096  # two processes, each loading one and holding one


def test_recommendation_respects_the_ram_budget(tmp_path):
    def row(workers, samples_per_s, buffer):
        return dict(
            status="ok",
            processes=1,
            num_workers=workers,
            prefetch_factor=2,
            pin_memory=False,
            persistent_workers=False,
            samples=int(samples_per_s),
            wall_s=1.0,
            predicted_buffer_bytes=buffer,
            worker_rss_bytes=7,
        )

    rows = [row(1, 100, 10), row(4, 300, 1000), row(8, 320, 5000), dict(row(16, 999, 1), status="error")]
    best = recommend(rows, ram_budget_bytes=2000)
    assert best.flags["num_workers"] == 4 and best.samples_per_s == 300 and best.excluded == 1
    assert best.fastest_overall["num_workers"] == 8
    assert recommend(rows, None).flags["num_workers"] == 8
    assert recommend(rows, 5) is None


def test_persistent_workers_see_each_epoch_and_the_cold_epoch_is_slower():
    """Story: a cold first epoch is slower than the second (here: every item a cache hit).
    The epoch reaches persistent workers through the sampler, not the Dataset."""
    bench = BenchConfig(
        num_items=48,
        item_bytes=256,
        batch_size=4,
        epochs=2,
        compute_ms=1,
        model=LatencyModel(latency_ms=20, cache_hit_rates=(0.0, 1.0)),
    )
    loader = LoaderConfig(num_workers=2, prefetch_factor=2, persistent_workers=True)
    (epochs,) = run_configuration(bench, loader)
    records = [epoch_record(bench, loader, [m], None, "c", None) for m in epochs]
    cold, warm = records
    assert cold.samples == warm.samples == 48
    # 12 batches x 4 items x 20 ms over 2 workers >= 0.48 s; the warm epoch has no latency at all
    assert cold.wall_s >= 0.45 and warm.samples_per_s > 2 * cold.samples_per_s
    assert cold.verdict == "input-bound"


def test_four_workers_give_3x_one_worker_when_latency_bound():
    """Story: data-bound (each item waits 50 ms), 4 workers >= 3x one worker. Steady state:
    persistent workers, epoch 1 (epoch 0 also pays for starting the worker processes).
    A per-step overhead o (IPC, a loaded machine) gives (100 + o) / (25 + o): >= 3 up to 12 ms."""
    bench = BenchConfig(
        num_items=32, item_bytes=256, batch_size=2, epochs=2, compute_ms=1, model=LatencyModel(latency_ms=50)
    )
    rates = {}
    for workers in (1, 4):
        loader = LoaderConfig(num_workers=workers, prefetch_factor=2, persistent_workers=True)
        (epochs,) = run_configuration(bench, loader)
        rates[workers] = epoch_record(bench, loader, [epochs[1]], None, "c", None).samples_per_s
    assert rates[4] >= 3 * rates[1], rates


def test_data_wait_drops_under_5_percent_with_enough_workers():
    """Story: input-bound without workers, not input-bound (< 5% waiting) with 4. Fetching a
    batch takes 40 ms, a step 100 ms: 4 workers keep up with 10x headroom, and the one wait
    left, the epoch's first batch (40 ms even with persistent workers), is 1.3% of the epoch."""
    bench = BenchConfig(
        num_items=60, item_bytes=256, batch_size=2, epochs=2, compute_ms=100, model=LatencyModel(latency_ms=20)
    )
    none = LoaderConfig(num_workers=0)
    (alone,) = run_configuration(dataclasses.replace(bench, epochs=1, num_items=20), none)
    input_bound = epoch_record(bench, none, [alone[0]], None, "c", None)
    assert input_bound.verdict == "input-bound"  # 40 of 140 ms
    four = LoaderConfig(num_workers=4, prefetch_factor=2, persistent_workers=True)
    (epochs,) = run_configuration(bench, four)
    steady = epoch_record(bench, four, [epochs[1]], None, "c", None)
    # Each batch after the first comes prefetched: its wait is the hand-over alone, however busy the
    # machine (a loaded one adds to both runs' waits alike; quiet, the share is 1.3%, "not input-bound").
    prefetched, fetched = statistics.median(epochs[1].wait_ms[1:]), statistics.median(alone[0].wait_ms)
    assert prefetched < fetched / 4 and steady.data_wait_pct < input_bound.data_wait_pct / 2


def test_three_processes_give_2_5x_one_when_fetching_is_latency_bound(capsys, tmp_path):
    """Story (the captioning report): items fetched one by one from a slow HTTP server,
    1 process vs 3 independent processes each fetching and computing its share."""
    out = tmp_path / "procs.csv"
    code = loader_bench.main(
        [
            "--storage",
            "http",
            "--latency-ms",
            "100",
            "--item-bytes",
            "20KB",
            "--num-items",
            "18",
            "--batch-size",
            "1",
            "--compute-ms",
            "2",
            "--epochs",
            "1",
            "--num-workers",
            "0",
            "--processes",
            "1",
            "3",
            "--output",
            str(out),
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    rows = pd.read_csv(out)
    assert list(rows["processes"]) == [1, 3] and (rows["child_processes"]).all()
    one, three = rows["samples_per_s"]
    assert three >= 2.5 * one
    assert "recommended: --processes 3" in captured.out


def test_cli_end_to_end_writes_every_format(capsys, tmp_path):
    outputs = [tmp_path / "l.csv", tmp_path / "l.md", tmp_path / "l.jsonl"]
    code = loader_bench.main(
        [
            *SLOW_STORE,
            "--latency-ms",
            "2",
            "--num-items",
            "32",
            "--batch-size",
            "4",
            "--num-workers",
            "0",
            "2",
            "--prefetch-factor",
            "3",
            "--pin-memory",
            "false",
            "true",
            "--persistent-workers",
            "true",
            "--ram-budget",
            "1MiB",
            *sum((["--output", str(p)] for p in outputs), []),
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    frame = read_results(outputs[0])
    for name in ("num_workers", "prefetch_factor", "pin_memory", "persistent_workers", "processes", "samples_per_s"):
        assert name in frame.columns
    assert len(frame) == 4 * 2 and set(frame["epoch"]) == {0, 1}  # (0 workers, pin x2) + (2 workers, pin x2)
    assert (frame["status"] == "ok").all() and frame["torch_version"].notna().all()
    two = frame[frame["num_workers"] == 2]
    assert (two["batch_bytes"] == 4 * 1024).all()
    assert (two["predicted_buffer_bytes"] == (2 * 3 + 1) * 4 * 1024).all()  # no GPU: nothing is pinned
    assert (two["worker_rss_bytes"] > 0).all() and (two["worker_uss_bytes"] > 0).all()
    assert "pin_memory has no effect without a GPU" in " ".join(frame["notes"].dropna())
    lines = [json.loads(line) for line in outputs[2].read_text().splitlines()]
    assert len(lines[0]["step_wait_ms"]) == lines[0]["steps"] == 8
    assert "| num_workers" in outputs[1].read_text() and "recommended:" in captured.out
    assert "samples/s" in captured.err  # progress per configuration
    assert read_results(outputs[1])["samples_per_s"].notna().all()


def test_local_storage_and_a_real_training_step(capsys, tmp_path):
    out = tmp_path / "local.csv"
    code = loader_bench.main(
        [
            "--storage",
            "local",
            "--model",
            "tiny",
            "--item-bytes",
            "64",
            "--num-items",
            "16",
            "--batch-size",
            "4",
            "--epochs",
            "1",
            "--num-workers",
            "1",
            "--data-dir",
            str(tmp_path / "items"),
            "--output",
            str(out),
        ]
    )
    assert code == 0, capsys.readouterr().err
    row = pd.read_csv(out).iloc[0]
    assert row["storage"] == "local" and row["compute"].startswith("tiny-model") and row["compute_s"] > 0
    assert len(list((tmp_path / "items").glob("item_*.bin"))) == 16


def test_user_dataset(capsys, tmp_path, fixtures_on_path):
    out = tmp_path / "user.csv"
    code = loader_bench.main(
        [
            "--dataset",
            "user_datasets:make_pairs",
            "--batch-size",
            "4",
            "--compute-ms",
            "1",
            "--epochs",
            "1",
            "--num-workers",
            "0",
            "2",
            "--output",
            str(out),
        ]
    )
    assert code == 0, capsys.readouterr().err
    rows = pd.read_csv(out)
    assert (rows["storage"] == "dataset").all() and (rows["samples"] == 32).all()
    assert (rows["batch_bytes"] == 4 * (3 * 8 * 8 * 4 + 8)).all()  # float32 images + int64 labels
    assert rows["latency_ms"].isna().all()


def test_a_failing_dataset_is_a_row_not_a_traceback(capsys, tmp_path, fixtures_on_path):
    out = tmp_path / "broken.csv"
    code = loader_bench.main(
        [
            "--dataset",
            "user_datasets:make_broken",
            "--batch-size",
            "4",
            "--compute-ms",
            "1",
            "--epochs",
            "1",
            "--num-workers",
            "0",
            "1",
            "--output",
            str(out),
        ]
    )
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    rows = pd.read_csv(out)
    assert list(rows["status"]) == ["error", "error"]
    assert rows["error"].str.contains("OSError: item .* is corrupt").all()


def test_a_dataset_item_raising_a_base_exception_is_the_rows_error(capsys, tmp_path, fixtures_on_path):
    """In this process (no workers) the user's __getitem__ ran unguarded: a BaseException ended the tool."""
    out = tmp_path / "boom.csv"
    flags = ["--batch-size", "4", "--compute-ms", "1", "--epochs", "1", "--num-workers", "0", "--output", str(out)]
    assert loader_bench.main(["--dataset", "user_datasets:make_boom_items", *flags]) == 1
    assert "Traceback" not in capsys.readouterr().err
    (error,) = pd.read_csv(out)["error"]
    assert "--dataset user_datasets:make_boom_items raised Boom (a BaseException, not an Exception): item" in error


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--num-workers", "-1"], "must be zero or more"),
        (["--prefetch-factor", "0"], "must be a positive integer"),
        (["--pin-memory", "maybe"], "expected true or false"),
        (["--item-bytes", "12XB"], "not a size"),
        (["--latency-ms", "5", "--jitter-ms", "6"], "jitter"),
        (["--cache-hit-rates", "0", "1.5"], "between 0 and 1"),
        (["--model", "tiny", "--compute-ms", "5"], "either --model tiny or --compute-ms"),
        (["--dataset", "no_such_module_xyz:make"], "cannot load --dataset no_such_module_xyz:make"),
        (["--dataset", "user_datasets:not_a_dataset"], "expected a map-style Dataset"),
        (["--dataset", "user_datasets:exits"], r"--dataset user_datasets:exits called sys.exit(0)"),
        (["--dataset", "user_datasets:raises_boom"], "raised Boom (a BaseException, not an Exception): the dataset's"),
        (["--num-items", "4", "--batch-size", "8"], "no full batch"),
        (["--num-items", "8", "--batch-size", "4", "--processes", "3"], "per process with 3 processes"),
        (["--processes", "0"], "must be a positive integer"),
        (["--storage", "ftp"], "invalid choice"),
        (["--output", "x.xlsx"], "unknown suffix"),
        (["--monitor", "x.txt"], "must end in .csv"),
        (["--device", "tpu"], "unknown device"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, fixtures_on_path, args, message):
    try:
        code = loader_bench.main(args)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_cuda_without_cuda_exits_2(capsys, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert loader_bench.main(["--device", "cuda"]) == 2
    assert "CUDA is not available" in capsys.readouterr().err


def test_rows_round_trip_through_the_result_writers(tmp_path):
    bench = BenchConfig(batch_size=4, item_bytes=1024, compute_ms=20)
    loader = LoaderConfig(num_workers=2, prefetch_factor=2)
    record = epoch_record(bench, loader, [fake_epoch(0, 1.0, [1.0] * 4, [200.0] * 4)], None, "c", 10**9)
    sink = ResultSink([tmp_path / "r.csv"], loader_bench.LoaderRecord)
    sink.write(record)
    back = read_results(tmp_path / "r.csv").to_dict("records")
    assert recommend(back, 10**9).flags == recommend([record.to_row()], 10**9).flags
    assert back[0]["prefetch_factor"] == 2 and bool(back[0]["pin_memory"]) is False


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_copy_and_compute_are_timed_with_events():
    bench = BenchConfig(
        num_items=64,
        item_bytes=1 << 20,
        batch_size=8,
        epochs=1,
        compute_ms=5,
        device="cuda",
        model=LatencyModel(latency_ms=0),
    )
    loader = LoaderConfig(num_workers=2, prefetch_factor=2, pin_memory=True)
    (epochs,) = run_configuration(bench, loader)
    record = epoch_record(bench, loader, epochs, None, "c", None)
    assert record.pinned and record.predicted_buffer_bytes == (4 + 5) * (8 << 20)
    assert record.h2d_s > 0 and len(record.step_h2d_ms) == 8
    assert record.compute_s == pytest.approx(8 * 0.005, rel=0.3)  # the spin kernel, calibrated with events


def test_processes_mode_with_workers_inside():
    bench = BenchConfig(
        num_items=16, item_bytes=128, batch_size=2, epochs=1, compute_ms=1, model=LatencyModel(latency_ms=1)
    )
    per_process = run_configuration(
        bench, LoaderConfig(num_workers=1, prefetch_factor=2, processes=2, child_processes=True)
    )
    assert len(per_process) == 2 and all(p[0].samples == 8 for p in per_process)
    assert all(p[0].worker_rss_bytes > 0 for p in per_process)


def test_plural_flags_and_their_old_singular_spellings_build_the_same_grid():
    parser = loader_bench.build_parser()
    plural = parser.parse_args(["--prefetch-factors", "2", "4", "--cache-hit-rates", "0", "0.9"])
    singular = parser.parse_args(["--prefetch-factor", "2", "4", "--cache-hit-rate", "0", "0.9"])
    assert plural.prefetch_factor == singular.prefetch_factor == [2, 4]
    assert plural.cache_hit_rates == singular.cache_hit_rates == [0.0, 0.9]
    assert parser.parse_args([]).device == "auto"


def test_loader_rows_carry_their_identity_through_a_file(tmp_path):
    bench = BenchConfig(batch_size=4, item_bytes=1024, compute_ms=20)
    records = [
        epoch_record(
            bench,
            LoaderConfig(num_workers=w, prefetch_factor=2),
            [fake_epoch(0, 1.0, [1.0] * 4, [200.0] * 4)],
            None,
            "c",
            10**9,
        )
        for w in (1, 2)
    ]
    assert records[0].key() != records[1].key()
    assert "num_workers" in loader_bench.LoaderRecord.identity_fields()
    assert "samples_per_s" not in loader_bench.LoaderRecord.identity_fields()
    sink = ResultSink([tmp_path / "r.csv", tmp_path / "r.md"], loader_bench.LoaderRecord)
    for record in records:
        sink.write(record)
    back = read_results(tmp_path / "r.csv").to_dict("records")
    assert [loader_bench.LoaderRecord.row_key(row) for row in back] == [r.key() for r in records]
    text = (tmp_path / "r.md").read_text()
    assert text.startswith("# cs336-bench loader benchmark") and "verdict bands" in text
    assert "sample standard deviation" not in text  # the loader states its own conventions
    shown = read_results(tmp_path / "r.md")["predicted_buffer_mib"].tolist()
    assert shown == pytest.approx([r.predicted_buffer_bytes / 2**20 for r in records], abs=5e-4)  # 3 decimals
