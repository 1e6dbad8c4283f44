import json
import os
from pathlib import Path

import pytest
import torch

from cs336_systems import flops, peak_flops
from cs336_systems.config import PASS_TYPES
from cs336_systems.factory import build_model
from cs336_systems.flops import (
    analytic_flops_per_step,
    counted_flops_per_step,
    flops_per_step,
    forward_flops_per_token,
    mfu,
    table_peak_tflops,
)
from cs336_systems.models import ModelConfig
from cs336_systems.peak_flops import PEAK_CACHE_ENV, PeakCache, resolve_peak
from cs336_systems.runner import run_benchmark
from tests.helpers import tiny_benchmark_config, tiny_model_config


def test_forward_flops_by_hand():
    config = ModelConfig(d_model=4, d_ff=6, num_layers=2, num_heads=2, vocab_size=10)
    # dense: 2*(2*(4*16 + 3*4*6) + 4*10) = 2*(2*136 + 40) = 624; attention: 2*2*2*T*4 = 32*T
    assert forward_flops_per_token(config, seq_len=5) == 624 + 160
    assert forward_flops_per_token(config, seq_len=5, causal_discount=True) == 624 + 80
    assert analytic_flops_per_step(config, 3, 5, "forward") == 784 * 15
    assert analytic_flops_per_step(config, 3, 5, "train-step") == 3 * 784 * 15


@pytest.mark.parametrize("attention", ["naive", "sdpa"])
@pytest.mark.parametrize("pass_type", PASS_TYPES)
@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_analytic_matches_flop_counter(attention, pass_type, device):
    config = tiny_model_config(attention=attention, d_model=64, num_heads=4)
    counted = counted_flops_per_step(lambda: build_model(config, device), config.vocab_size, 2, 16, pass_type, device)
    analytic = analytic_flops_per_step(config, 2, 16, pass_type)
    assert counted == pytest.approx(analytic, rel=0.02)
    if device == "meta":  # SDPA decomposes into plain matmuls there: the counts agree exactly
        assert counted == analytic


def test_user_model_flops_are_counted(fixtures_on_path):
    config = tiny_model_config()
    step = flops_per_step(config, 2, 16, "forward-backward", "user_models:make_model", "cpu")
    # only the head is a matmul: 2 * d * V per token (+ bias add, not counted), x3 for backward
    assert step.source == "counted" and step.flops_per_step == 3 * 2 * 32 * 97 * 32


@pytest.mark.parametrize(
    ("name", "precision", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "fp32", 66.9),
        ("NVIDIA H100 80GB HBM3", "tf32", 494.7),
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
        ("NVIDIA H100 80GB HBM3", "fp16", 989.4),
        ("NVIDIA H100 PCIe", "tf32", 378.0),
        ("NVIDIA H200", "bf16", 989.4),
        ("NVIDIA A100-SXM4-80GB", "tf32", 156.0),
        ("NVIDIA A100 80GB PCIe", "fp32", 19.5),
        ("NVIDIA A10G", "bf16", 125.0),
        ("NVIDIA L4", "tf32", 60.0),
        ("NVIDIA GeForce RTX 4090", "bf16", 165.0),
        ("NVIDIA GeForce RTX 4090 Laptop GPU", "bf16", None),
        ("NVIDIA L40S", "bf16", None),
        ("NVIDIA H100 NVL", "bf16", None),
        ("Tesla T4", "fp16", None),
    ],
)
def test_peak_table_by_device_and_precision(name, precision, expected):
    assert table_peak_tflops(name, precision) == expected


def _fake_probe(monkeypatch, values=(1.5,), others=0.0, load=0.7, shares=(1.0,)) -> list:
    """The probe reads `values` in turn (the last one after) with its threads getting `shares` of their
    time; other processes keep `others` cores busy while it runs; the 1-minute load average is `load`."""
    calls = []

    def measure(device, precision, threads):
        calls.append((device.type, precision))
        share = shares[min(len(calls), len(shares)) - 1] if threads else None
        value = values[min(len(calls), len(values)) - 1]
        return {"tflops": value, "other_processes_cores": others, "own_cpu_share": share, "cores": os.cpu_count()}

    monkeypatch.setattr(peak_flops, "probe", measure)
    monkeypatch.setattr(peak_flops, "load_average", lambda: load)
    return calls


def test_peak_resolution_order(monkeypatch, tmp_path):
    _fake_probe(monkeypatch)
    gpu, cpu, cache = torch.device("cuda", 0), torch.device("cpu"), PeakCache(tmp_path / "peaks.json")

    def peak(*args, **kwargs):
        found = resolve_peak(*args, cache=cache, **kwargs)
        return found.tflops, found.source

    assert peak(gpu, "NVIDIA H100 80GB HBM3", "tf32") == (494.7, "table")
    assert peak(gpu, "NVIDIA H100 80GB HBM3", "tf32", peak="measure") == (1.5, "measured")
    assert peak(gpu, "NVIDIA H100 80GB HBM3", "bf16", peak_tflops=700.0) == (700.0, "user")
    assert peak(gpu, "Some Future GPU", "bf16") == (1.5, "calibrated")
    assert peak(gpu, "Some Future GPU", "bf16", peak="table") == (None, "unknown")
    assert peak(cpu, "AMD EPYC", "fp32") == (1.5, "calibrated")
    assert peak(cpu, "AMD EPYC", "fp32", peak_tflops=2.0) == (2.0, "user")


def test_a_cpu_peak_is_calibrated_once_with_its_date_and_load_and_reused(monkeypatch, tmp_path):
    calls = _fake_probe(monkeypatch, values=(2.0, 3.0), others=0.1)
    cpu, cache = torch.device("cpu"), PeakCache(tmp_path / "cache" / "peaks.json")
    first = resolve_peak(cpu, "AMD EPYC", "fp32", cache=cache)
    assert (first.tflops, first.source, first.notes) == (2.0, "calibrated", ()) and first.measured_at
    ((key, entry),) = json.loads(cache.path.read_text()).items()
    assert key == PeakCache.key(cpu, "AMD EPYC", "fp32") and "AMD EPYC fp32 threads=" in key
    assert entry == {
        **{"tflops": 2.0, "measured_at": first.measured_at, "load_average": 0.7},
        **{"other_processes_cores": 0.1, "own_cpu_share": 1.0, "cores": os.cpu_count()},
    }
    again = resolve_peak(cpu, "AMD EPYC", "fp32", cache=cache)  # another run: the kept one, not measured
    assert again == first and len(calls) == 1
    assert resolve_peak(cpu, "AMD EPYC", "bf16", cache=cache).tflops == 3.0  # another precision: its own
    assert resolve_peak(cpu, "AMD EPYC", "fp32", peak_tflops=9.0, cache=cache).source == "user"
    assert len(calls) == 2
    recalibrated = resolve_peak(cpu, "AMD EPYC", "fp32", peak="calibrate", cache=cache)  # --peak calibrate
    assert (recalibrated.tflops, recalibrated.source, len(calls)) == (3.0, "calibrated", 3)
    assert resolve_peak(cpu, "AMD EPYC", "fp32", cache=cache).tflops == 3.0 and len(calls) == 3


def test_a_busy_machine_keeps_no_calibration_unless_asked(monkeypatch, tmp_path):
    _fake_probe(monkeypatch, values=(0.7,), others=1.5)
    cpu, cache = torch.device("cpu"), PeakCache(tmp_path / "peaks.json")
    busy = resolve_peak(cpu, "AMD EPYC", "fp32", cache=cache)
    assert (busy.tflops, busy.source) == (0.7, "measured") and "other processes kept 1.5 of" in busy.notes[0]
    assert "--peak calibrate" in busy.notes[0] and not cache.path.exists() and busy.low
    asked = resolve_peak(cpu, "AMD EPYC", "fp32", peak="calibrate", cache=cache)
    assert asked.source == "calibrated" and "kept 1.5 of" in asked.notes[0] and "the peak reads low" in asked.notes[0]
    kept = json.loads(cache.path.read_text())[PeakCache.key(cpu, "AMD EPYC", "fp32")]
    assert kept["other_processes_cores"] == 1.5
    again = resolve_peak(cpu, "AMD EPYC", "fp32", cache=cache)  # kept as asked, and still said to read low
    assert again.source == "calibrated" and "kept 1.5 of" in again.low


def test_the_quiet_guard_judges_the_probe_by_its_own_share_of_its_threads(monkeypatch, tmp_path):
    # other processes read 0.0 cores (the kernel's ticks), but the probe's threads ran 45% of its time
    _fake_probe(monkeypatch, values=(0.113,), others=0.0, shares=(0.45,))
    cpu, cache = torch.device("cpu"), PeakCache(tmp_path / "peaks.json")
    found = resolve_peak(cpu, "AMD EPYC", "fp32", cache=cache)
    assert found.source == "measured" and "ran 45% of its time: they waited for cores" in found.low
    assert not cache.path.exists() and "kept for this run only" in found.notes[0]


def test_a_peak_below_one_kept_for_fewer_threads_is_never_kept_nor_used(monkeypatch, tmp_path):
    calls = _fake_probe(monkeypatch, values=(0.113, 0.30))
    cpu, cache = torch.device("cpu"), PeakCache(tmp_path / "peaks.json")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    one = {"tflops": 0.162, "measured_at": "2026-11-20T10:00:00+00:00"}
    # a 2-thread peak kept low before this guard: below the 1-thread one, so measured again
    two = {"tflops": 0.113, "measured_at": "2026-11-21T10:00:00+00:00"}
    keys = [PeakCache.key(cpu, "AMD EPYC", "fp32", threads) for threads in (1, 2)]
    cache.path.write_text(json.dumps(dict(zip(keys, (one, two), strict=True))))
    low = resolve_peak(cpu, "AMD EPYC", "fp32", cache=cache)  # the probe reads 0.113 again, though quiet
    assert (low.tflops, low.source, len(calls)) == (0.113, "measured", 1)
    assert low.low == "below the 0.162 TFLOP/s kept for 1 thread(s) on 2026-11-20T10:00:00+00:00"
    asked = resolve_peak(cpu, "AMD EPYC", "fp32", peak="calibrate", cache=cache)  # nor kept when asked
    assert asked.source == "calibrated" and asked.tflops == 0.30 and asked.low is None  # the second probe: 0.30
    assert json.loads(cache.path.read_text())[keys[1]]["tflops"] == 0.30
    assert resolve_peak(cpu, "AMD EPYC", "fp32", cache=cache).tflops == 0.30 and len(calls) == 2


def test_an_mfu_over_a_peak_measured_low_is_not_a_result():
    from cs336_systems.results import plausibility

    row = {"mfu": 0.4, "peak_low": "below the 0.162 TFLOP/s kept for 1 thread(s) on 2026-11-20"}
    assert "MFU over a peak measured low (below the 0.162" in plausibility.problems(row)["mfu"]
    assert plausibility.problems({"mfu": 0.4, "peak_low": float("nan")}) == {}  # a CSV's empty cell


def test_the_probe_says_how_it_ran_once_per_process(monkeypatch):
    # this process's own work is subtracted from the machine's; its own share is its CPU time over wall x threads
    runs = []
    monkeypatch.setattr(flops, "measure_peak_tflops", lambda d, p: runs.append(1) or sum(i * i for i in range(10**6)))
    peak_flops.probe.cache_clear()
    probed = peak_flops.probe(torch.device("cpu"), "fp32", 1)
    assert probed["tflops"] > 0 and 0.0 <= probed["other_processes_cores"] <= (os.cpu_count() or 1)
    assert 0 < probed["own_cpu_share"] <= 1.5 and probed["cores"] == os.cpu_count()
    assert peak_flops.probe(torch.device("cpu"), "fp32", 1) is probed and len(runs) == 1
    peak_flops.probe.cache_clear()


def test_the_row_says_which_peak_its_mfu_divides_by(monkeypatch, tmp_path):
    monkeypatch.setenv(PEAK_CACHE_ENV, str(tmp_path))
    calls = _fake_probe(monkeypatch, values=(4.0,))
    rows = [
        run_benchmark(tiny_benchmark_config(pass_type="forward", measure_steps=2, **kw))
        for kw in ({}, {}, {"peak_tflops": 8.0})
    ]
    assert [(r.peak_source, r.peak_tflops) for r in rows] == [("calibrated", 4.0), ("calibrated", 4.0), ("user", 8.0)]
    assert rows[0].peak_measured_at == rows[1].peak_measured_at and rows[2].peak_measured_at is None
    assert len(calls) == 1 and (tmp_path / "peak_tflops.json").exists()
    assert rows[0].mfu == pytest.approx(rows[0].achieved_tflops / 4.0)
    assert rows[0].achieved_tflops == pytest.approx(rows[0].flops_per_step / (rows[0].median_ms / 1e3) / 1e12)


def test_mfu_arithmetic():
    achieved, util = mfu(3 * 10**12, 500.0, 12.0)  # 3 TFLOP in a 500 ms median step = 6 TFLOP/s
    assert achieved == pytest.approx(6.0) and util == pytest.approx(0.5)
    assert mfu(3 * 10**12, 500.0, None) == (pytest.approx(6.0), None)
    assert mfu(None, 500.0, 12.0) == (None, None)


def test_measured_probe_is_positive_and_cached():
    first = flops.measure_peak_tflops(torch.device("cpu"), "fp32")
    assert first > 0 and flops.measure_peak_tflops(torch.device("cpu"), "fp32") == first


def test_every_ok_row_has_mfu_and_its_peak_source():
    record = run_benchmark(tiny_benchmark_config(peak_tflops=0.5))
    config = tiny_benchmark_config()
    expected_flops = analytic_flops_per_step(config.model, 2, 16, "forward-backward")
    assert (record.flops_per_step, record.flops_source) == (expected_flops, "analytic")
    assert record.achieved_tflops == pytest.approx(expected_flops / (record.median_ms / 1e3) / 1e12)
    assert record.mfu == pytest.approx(record.achieved_tflops / 0.5)
    assert record.tokens_per_s == pytest.approx(config.tokens_per_step / (record.median_ms / 1e3))
    assert (record.peak_tflops, record.peak_source) == (0.5, "user")
    measured = run_benchmark(tiny_benchmark_config())  # kept as the session's calibration, or this run's (busy)
    assert measured.peak_source in ("calibrated", "measured") and measured.mfu > 0


def test_the_peak_probe_grows_past_the_first_products_set_up(monkeypatch):
    """A library's first product pays its set-up (a cuBLAS handle: longer than the probe's target);
    timed, it stopped the probe at n = 256, where per-call overhead swamps the rate (0.8 TFLOP/s
    for an H200's ~800). A machine of 1 TFLOP/s with 0.1 ms a call, set-up 1 s on the first call:"""
    calls = []

    def fake_time(a, b, sync, repeats):
        calls.append(a.shape[0])
        return 1.0 if len(calls) == 1 else 2 * a.shape[0] ** 3 / 1e12 + 1e-4

    monkeypatch.setattr(flops, "_time_matmul", fake_time)
    probe = flops.measure_peak_tflops.__wrapped__  # uncached: the real probe is measured once per process
    assert probe(torch.device("cpu"), "fp32") == pytest.approx(0.994, abs=0.01)
    assert max(calls) == 2048  # the CPU probe's largest size


@pytest.mark.parametrize("kept", [True, -5, 0, 1e308, float("inf"), float("nan"), "3.0", None])
def test_a_damaged_kept_peak_is_not_trusted_but_measured_again(monkeypatch, tmp_path, kept):
    calls = _fake_probe(monkeypatch, values=(2.0,))
    cpu, cache = torch.device("cpu"), PeakCache(tmp_path / "peaks.json")
    key = PeakCache.key(cpu, "AMD EPYC", "fp32")
    cache.path.write_text(json.dumps({key: {"tflops": kept, "measured_at": "2026-01-01T00:00:00+00:00"}}))
    found = resolve_peak(cpu, "AMD EPYC", "fp32", cache=cache)
    assert (found.tflops, found.source, len(calls)) == (2.0, "calibrated", 1)
    assert json.loads(cache.path.read_text())[key]["tflops"] == 2.0  # the damaged entry is replaced


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    "damage",
    ["directory is a file", "nested 200000 deep", "not JSON", "a list", "a directory", "a FIFO", "under /proc"],
)
def test_a_cache_that_cannot_be_read_or_written_is_a_note_never_a_lost_row(monkeypatch, tmp_path, damage):
    _fake_probe(monkeypatch, values=(2.0,))
    cache = PeakCache(tmp_path / "peaks.json")
    if damage == "directory is a file":
        (tmp_path / "file").write_text("x")
        cache = PeakCache(tmp_path / "file" / "peaks.json")
    elif damage == "nested 200000 deep":
        cache.path.write_text(_nested(200_000))
    elif damage == "not JSON":
        cache.path.write_bytes(b"\xff\x00{")
    elif damage == "a list":
        cache.path.write_text("[1, 2]")
    elif damage == "a directory":
        cache.path.mkdir()
    elif damage == "a FIFO":
        os.mkfifo(cache.path)
    else:
        cache = PeakCache(Path("/proc/self/peaks.json"))
    found = resolve_peak(torch.device("cpu"), "AMD EPYC", "fp32", cache=cache)
    assert (found.tflops, found.source) == (2.0, "calibrated")
    unwritable = damage in ("directory is a file", "a directory", "under /proc")  # a FIFO is read as empty, replaced
    assert bool(found.notes) == unwritable
    if unwritable:
        assert "not kept" in found.notes[0] and "serves this run only" in found.notes[0]


def test_concurrent_writers_keep_every_entry(tmp_path):
    import threading

    cache, errors = PeakCache(tmp_path / "peaks.json"), []

    def writer(index: int) -> None:
        for n in range(10):
            note = cache.put(f"key {index} {n}", {"tflops": 1.0 + n})
            if note:
                errors.append(note)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and len(cache.entries()) == 80
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_a_failing_peak_costs_no_measured_row(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("the probe ran out of memory")

    monkeypatch.setattr("cs336_systems.runner.resolve_peak", broken)
    record = run_benchmark(tiny_benchmark_config(profile_step=False))
    assert record.status == "ok" and record.median_ms > 0 and record.mfu is None
    assert "no MFU: finding the peak failed (RuntimeError: the probe ran out of memory)" in record.notes


def test_a_probe_that_measures_nothing_keeps_nothing(monkeypatch, tmp_path):
    _fake_probe(monkeypatch, values=(float("inf"),))
    cache = PeakCache(tmp_path / "peaks.json")
    found = resolve_peak(torch.device("cpu"), "AMD EPYC", "fp32", cache=cache)
    assert (found.tflops, found.source) == (None, "unknown") and "no MFU" in found.notes[0]
    assert not cache.path.exists()
