"""The resource monitor: real child processes, real /proc readings, NVML optional."""

import json
import sys
import time
import types

import pandas as pd
import psutil
import pytest

from cs336_systems import benchmark, monitor
from cs336_systems.monitor import GpuProbe, ResourceMonitor, monitored
from cs336_systems.monitor.sampling import METRIC_DIVISORS, PANELS
from tests.helpers import PYTHON, lines_by_label

ALLOCATE_500MB = "import sys, time; block = b'x' * (500 << 20); time.sleep(1.0); sys.exit(3)"


def run(capsys, *args):
    try:
        code = monitor.main(list(args))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def test_monitor_sees_a_500mb_child_and_returns_its_exit_status(capsys, tmp_path, saved_figures):
    path = tmp_path / "run.csv"
    code, _, err = run(capsys, "--interval", "0.1", "--output", str(path), "--", PYTHON, "-c", ALLOCATE_500MB)
    assert code == 3
    frame = pd.read_csv(path)
    assert list(frame.columns) == ["tool", *monitor.SAMPLE_FIELDS] and set(frame["tool"]) == {"monitor"}
    assert frame["tree_rss_bytes"].max() >= 400e6  # the child's 500 MB, seen while it held them
    assert len(frame) >= 8 and frame["t_s"].is_monotonic_increasing
    assert (frame["system_ram_used_bytes"] > 0).all()
    # the plot beside the CSV draws the same samples: the tree's RSS line peaks at the child's 500 MB
    (figure,) = saved_figures
    assert path.with_suffix(".png").exists() and [ax.get_ylabel() for ax in figure.axes] == [p[0] for p in PANELS]
    (rss,) = lines_by_label(figure)["tree_rss_bytes"]
    assert [t for t, _ in rss] == pytest.approx(list(frame["t_s"]), abs=1e-5)  # the CSV keeps 6 decimals
    assert max(y for _, y in rss) == pytest.approx(frame["tree_rss_bytes"].max() / METRIC_DIVISORS["tree_rss_bytes"])
    report = json.loads(path.with_suffix(".json").read_text())
    assert report["exit_status"] == 3 and report["summary"]["tree_rss_bytes"]["max"] >= 400e6
    assert "environment" in report and report["environment"]["torch_version"]
    for name in ("mean", "p50", "p90", "max", "RSS, process tree (GiB)", "System RAM used"):
        assert name in err
    if not GpuProbe().available:
        assert frame["gpu_util_pct"].isna().all() and frame["gpu_memory_used_bytes"].isna().all()
        assert "GPU: none" in err and report["summary"]["gpu_util_pct"] is None


def test_cpu_of_the_tree_adds_up_to_the_childs_cpu_time(capsys, tmp_path):
    # The child burns 0.6 s of CPU; whatever the machine's load, the integral of the sampled
    # tree CPU over time must account for it (exited processes are read before being reaped).
    spin = "import time\nwhile time.process_time() < 0.6: pass"
    path = tmp_path / "cpu.csv"
    code, _, _ = run(capsys, "--interval", "0.1", "--output", str(path), "--", PYTHON, "-c", spin)
    assert code == 0
    frame = pd.read_csv(path)
    seconds = frame["t_s"].diff().fillna(frame["t_s"].iloc[0])
    cpu_s = (frame["tree_cpu_pct"].fillna(0) / 100 * (psutil.cpu_count() or 1) * seconds).sum()
    assert 0.55 <= cpu_s <= 1.2  # 0.6 s of spinning plus the interpreter's start-up


def test_killed_command_reports_128_plus_signal(capsys, tmp_path):
    code, _, _ = run(
        capsys,
        "--interval",
        "0.1",
        "--output",
        str(tmp_path / "k.csv"),
        "--",
        PYTHON,
        "-c",
        "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
    )
    assert code == 128 + 9


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "no command to run"),
        (["--interval", "0", "--", "true"], "must be a positive number"),
        (["--output", "run.txt", "--", "true"], "must end in .csv"),
        (["--", "no-such-command-xyz"], "command not found: no-such-command-xyz"),
        (["--gpus", "-1", "--", "true"], "must be zero or more"),
    ],
)
def test_cli_errors_are_one_line_and_exit_2(capsys, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, *args)
    assert code == 2
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_existing_output_is_not_overwritten(capsys, tmp_path):
    path = tmp_path / "run.csv"
    path.write_text("precious\n")
    code, _, err = run(capsys, "--output", str(path), "--", "true")
    assert code == 2 and "already exists" in err and path.read_text() == "precious\n"


def test_monitored_context_streams_rows_around_any_code(tmp_path, capsys):
    path = tmp_path / "inproc.csv"
    with monitored(path, interval_s=0.05, label="test") as running:
        block = bytearray(b"y" * (200 << 20))
        time.sleep(0.4)
        assert path.read_text().count("\n") >= 3  # rows are on disk while the code runs
        del block
    assert len(running.samples) >= 6
    frame = pd.read_csv(path)
    assert frame["tree_rss_bytes"].max() >= 200e6
    assert path.with_suffix(".png").exists() and path.with_suffix(".json").exists()
    assert "monitor:" in capsys.readouterr().err


def test_monitored_none_does_nothing():
    with monitored(None) as running:
        assert running is None


def test_gpu_columns_from_nvml(monkeypatch):
    """The NVML path on a machine without a GPU: a fake pynvml with two devices."""
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3",
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=[40, 100][h]),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=[1, 3][h] * 2**30),
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    probe = GpuProbe()
    assert probe.available and probe.read() == (70.0, 4 * 2**30)
    assert GpuProbe([1]).read() == (100.0, 3 * 2**30)
    with pytest.raises(ValueError, match="no GPU with NVML index 5"):
        GpuProbe([5])
    sample = ResourceMonitor(0.1).start().stop()[-1]
    assert sample.gpu_util_pct == 70.0 and sample.gpu_memory_used_bytes == 4 * 2**30


def test_nvml_monitors_the_jobs_gpus_by_default(monkeypatch):
    """Not an average over every GPU of the machine: CUDA_VISIBLE_DEVICES' GPUs, else the current one."""
    uuids = {"GPU-aaaa": 0, "GPU-bbbb": 1}
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetHandleByUUID=lambda uuid: uuids[uuid],
        nvmlDeviceGetIndex=lambda h: h,
        nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3",
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=[40, 100][h]),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=[1, 3][h] * 2**30),
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert GpuProbe().read() == (40.0, 2**30)  # the current device, 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert GpuProbe().read() == (100.0, 3 * 2**30)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bbbb,bogus,0")  # CUDA stops at the first bad entry
    assert GpuProbe().read() == (100.0, 3 * 2**30)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    probe = GpuProbe()
    assert not probe.available and "CUDA_VISIBLE_DEVICES" in probe.unavailable_reason


def test_without_nvml_the_gpu_columns_are_empty_and_say_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    probe = GpuProbe()
    assert not probe.available and probe.read() == (None, None)
    assert "nvidia-ml-py is not installed" in probe.describe() and "empty" in probe.describe()


def test_benchmark_accepts_monitor(capsys, tmp_path):
    path = tmp_path / "bench_monitor.csv"
    tiny = [
        "--d-model",
        "32",
        "--d-ff",
        "64",
        "--num-layers",
        "2",
        "--num-heads",
        "2",
        "--vocab-size",
        "97",
        "--context-length",
        "16",
        "--batch-size",
        "2",
        "--warmup-steps",
        "1",
        "--measure-steps",
        "2",
        "--device",
        "cpu",
        "--peak-tflops",
        "1",
    ]
    assert benchmark.main([*tiny, "--monitor", str(path), "--monitor-interval", "0.05"]) == 0
    assert len(pd.read_csv(path)) >= 1 and path.with_suffix(".png").exists()
    assert "monitor:" in capsys.readouterr().err


@pytest.mark.parametrize("module", ["benchmark_direct", "run_benchmarks", "find_max"])
def test_sweeps_check_the_monitor_path_first(module, capsys):
    import importlib

    main = importlib.import_module(f"cs336_systems.{module}").main
    extra = ["--dimension", "batch-size"] if module == "find_max" else []
    code = main([*extra, "--device", "cpu", "--monitor", "bad.txt"])
    err = capsys.readouterr().err
    assert code == 2 and "must end in .csv" in err and err.count("\n") == 1


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
def test_nvml_sees_a_busy_gpu(tmp_path, capsys):
    import torch

    path = tmp_path / "gpu.csv"
    a = torch.randn(8192, 8192, device="cuda")
    with monitored(path, interval_s=0.1):
        deadline = time.perf_counter() + 1.5
        while time.perf_counter() < deadline:
            a @ a
            torch.cuda.synchronize()
    frame = pd.read_csv(path)
    assert frame["gpu_util_pct"].max() > 50 and frame["gpu_memory_used_bytes"].max() > 256 * 2**20
    assert "monitored through NVML" in capsys.readouterr().err


def test_the_run_record_is_a_result_record_with_the_commands_status(capsys, tmp_path):
    ok, failed = tmp_path / "ok.csv", tmp_path / "failed.csv"
    assert run(capsys, "--monitor-interval", "0.1", "--output", str(ok), "--", PYTHON, "-c", "pass")[0] == 0
    assert run(capsys, "--interval", "0.1", "--output", str(failed), "--", PYTHON, "-c", "raise SystemExit(4)")[0] == 4
    good, bad = (json.loads(path.with_suffix(".json").read_text()) for path in (ok, failed))
    assert good["status"] == "ok" and good["error"] is None and good["interval_s"] == 0.1 and good["timestamp"]
    assert bad["status"] == "error" and "status 4" in bad["error"] and bad["exit_status"] == 4
    assert bad["environment"]["torch_version"]


def test_monitor_interval_is_typed_in_every_command():
    parser = benchmark.build_parser()
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["--monitor-interval", "-1"])
    assert exit_info.value.code == 2
