"""Result files under faults: paths checked first, one-write rows, a full disk, a killed
writer, resume across several outputs, and one writer per file."""

import errno
import io
import json
import math
import os
import subprocess
import sys
import threading
import time

import pandas as pd
import pytest

from cs336_systems import benchmark, benchmark_direct, compare, find_max, run_benchmarks
from cs336_systems.memory.cli import main as memory_main
from cs336_systems.memory.estimate import FIND_MAX_LIMIT
from cs336_systems.results import ResultFileError, ResultSink, ResultWriteError, check_output_paths, read_results
from cs336_systems.results import writing as result_files
from cs336_systems.results.records import NONFINITE_LOSS_NOTE
from cs336_systems.runner import run_benchmark
from cs336_systems.units import parse_bytes
from tests.helpers import PYTHON, child_env, tiny_benchmark_config
from tests.tiny import TINY_SWEEP

GRID = [*TINY_SWEEP, "--pass-types", "forward", "--context-lengths", "8", "16"]


@pytest.fixture(scope="module")
def records():
    return [run_benchmark(tiny_benchmark_config(pass_type="forward", context_length=t)) for t in (8, 16, 32)]


@pytest.fixture
def fault(monkeypatch):
    """Set the fault hook in this process, counting row writes from zero."""

    def arm(spec: str) -> None:
        monkeypatch.setenv(result_files.FAULT_ENV, spec)
        monkeypatch.setattr(result_files, "_row_writes", 0)

    return arm


def _one_line_error(err: str) -> bool:
    return err.count("\n") == 1 and "Traceback" not in err


# -- 1. paths checked before any work ----------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "message"),
    [("{tmp}/adir.csv", "is a directory"), ("/proc/x.csv", "cannot write"), ("/proc/sub/x.csv", "cannot create")],
)
def test_bad_output_paths_are_one_line_before_the_model_is_built(tmp_path, capsys, monkeypatch, path, message):
    (tmp_path / "adir.csv").mkdir()
    monkeypatch.setattr(benchmark, "run_benchmark", lambda *a, **k: pytest.fail("ran before checking outputs"))
    code = benchmark.main([*TINY_SWEEP, "--output", path.format(tmp=tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and message in err and _one_line_error(err)


def test_monitor_and_summary_paths_are_checked_first(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(benchmark, "run_benchmark", lambda *a, **k: pytest.fail("ran before checking --monitor"))
    assert benchmark.main([*TINY_SWEEP, "--monitor", "/proc/m.csv"]) == 2
    assert "--monitor /proc/m.csv" in capsys.readouterr().err
    monkeypatch.setattr(find_max, "run_in_child", lambda *a, **k: pytest.fail("probed before checking --summary"))
    code = find_max.main([*TINY_SWEEP, "--dimension", "batch-size", "--summary", "/proc/s.json"])
    err = capsys.readouterr().err
    assert code == 2 and "--summary /proc/s.json" in err and _one_line_error(err)


def test_a_path_given_twice_is_used_once_and_checking_leaves_no_file(tmp_path, records):
    path = tmp_path / "r.csv"
    assert check_output_paths([path, tmp_path / "." / "r.csv"]) == [path]
    assert not path.exists()
    with ResultSink([path, str(path)]) as sink:
        sink.write(records[0])
    assert len(pd.read_csv(path)) == 1


def test_a_report_is_not_written_to_a_csv(tmp_path, capsys):
    from cs336_systems.report.cli import main as report_main

    code = report_main([str(tmp_path / "in.csv"), "--output", str(tmp_path / "r.csv")])
    err = capsys.readouterr().err
    assert code == 2 and "r.csv" in err and _one_line_error(err) and not (tmp_path / "r.csv").exists()
    assert report_main([str(tmp_path / "in.csv"), "--output", "/proc/r.md"]) == 2


# -- 2. atomic rows ------------------------------------------------------------------------


def test_csv_line_is_what_pandas_writes_and_reads_back_identically(tmp_path, records):
    path = tmp_path / "r.csv"
    with ResultSink([path]) as sink:
        for record in records:
            sink.write(record)
    fields = list(pd.read_csv(path, nrows=0).columns)
    rows = [record.to_row() for record in records]
    expected = io.StringIO()  # the previous writer: a one-row DataFrame per row
    for number, row in enumerate(rows):
        frame = pd.DataFrame([[row.get(name) for name in fields]], columns=fields)
        frame.to_csv(expected, header=number == 0, index=False)
    assert path.read_text() == expected.getvalue()
    pd.testing.assert_frame_equal(read_results(path), pd.read_csv(io.StringIO(expected.getvalue())))


def test_a_full_disk_truncates_the_partial_row_and_names_the_file(tmp_path, records, fault):
    csv_path, md_path = tmp_path / "r.csv", tmp_path / "r.md"
    with ResultSink([csv_path, md_path]) as sink:
        sink.write(records[0])
        before = csv_path.read_bytes()
        fault("enospc@1")  # the next row write (CSV): half written, then ENOSPC
        with pytest.raises(ResultWriteError, match=r"r\.csv: could not write a row \(No space left"):
            sink.write(records[1])
    assert csv_path.read_bytes() == before and before.endswith(b"\n")
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.lock"))


def test_a_failed_markdown_rewrite_keeps_the_old_one_whole(tmp_path, records, monkeypatch):
    md_path = tmp_path / "r.md"
    with ResultSink([md_path]) as sink:
        sink.write(records[0])
        before = md_path.read_text()

        def full_disk(*args):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(result_files.os, "replace", full_disk)
        with pytest.raises(ResultWriteError, match="r.md"):
            sink.write(records[1])
    assert md_path.read_text() == before and not list(tmp_path.glob("*.tmp"))


def test_damaged_files_name_the_file_and_line(tmp_path):
    jsonl = tmp_path / "r.jsonl"
    jsonl.write_text('{"a": 1}\n{"a": 2\n')
    with pytest.raises(ResultFileError, match=r"r\.jsonl:2: damaged"):
        read_results(jsonl)
    csv_path = tmp_path / "r.csv"
    csv_path.write_text("a,b\n1,2\n1,2,3,4\n")
    with pytest.raises(ResultFileError, match=r"r\.csv:3: 4 fields"):
        read_results(csv_path)


def test_a_cut_last_line_is_dropped_on_resume_and_that_configuration_runs_again(tmp_path, capsys):
    out = tmp_path / "r.csv"
    assert benchmark_direct.main([*GRID, "--output", str(out)]) == 0
    whole = out.read_text()
    out.write_text(whole[: len(whole) - 20])  # a writer killed inside the second row
    capsys.readouterr()
    assert benchmark_direct.main([*GRID, "--output", str(out), "--resume"]) == 0
    assert "dropped a cut last line" in capsys.readouterr().err
    rows = pd.read_csv(out)
    assert list(rows["context_length"]) == [8, 16] and list(rows["status"]) == ["ok", "ok"]
    assert out.read_text().count("model_size,") == 1


# -- faults in a real sweep process --------------------------------------------------------


def _sweep(module, *args, fault_spec=None):
    env = child_env()
    if fault_spec:
        env[result_files.FAULT_ENV] = fault_spec
    return subprocess.run([PYTHON, "-m", module, *args], capture_output=True, text=True, env=env, timeout=300)


def _assert_each_row_once(*paths):
    for path in paths:
        rows = read_results(path)
        assert list(rows["context_length"]) == [8, 16], path
        assert list(rows["status"]) == ["ok", "ok"], path


def test_full_disk_mid_sweep_exits_1_with_the_resume_command_and_resume_completes(tmp_path):
    csv_path, jsonl_path, md_path = tmp_path / "r.csv", tmp_path / "r.jsonl", tmp_path / "r.md"
    outputs = ["--output", str(csv_path), "--output", str(jsonl_path), "--output", str(md_path)]
    # writes: row 1 CSV, row 1 JSONL, row 2 CSV (fails half written)
    done = _sweep("cs336_systems.benchmark_direct", *GRID, *outputs, fault_spec="enospc@3")
    assert done.returncode == 1, done.stderr
    assert "r.csv: could not write a row (No space left on device)" in done.stderr and "--resume" in done.stderr
    assert "Traceback" not in done.stderr
    assert csv_path.read_text().endswith("\n") and len(pd.read_csv(csv_path)) == 1
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.lock"))
    resumed = _sweep("cs336_systems.benchmark_direct", *GRID, *outputs, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    _assert_each_row_once(csv_path, jsonl_path, md_path)


def test_killed_between_two_outputs_resume_writes_the_row_only_where_it_is_missing(tmp_path):
    csv_path, jsonl_path = tmp_path / "r.csv", tmp_path / "r.jsonl"
    outputs = ["--output", str(csv_path), "--output", str(jsonl_path)]
    # SIGKILL right after row 1 reached the CSV, before the JSONL
    killed = _sweep("cs336_systems.run_benchmarks", *GRID, *outputs, fault_spec="kill@1")
    assert killed.returncode == -9
    assert len(pd.read_csv(csv_path)) == 1 and not jsonl_path.exists()
    resumed = _sweep("cs336_systems.run_benchmarks", *GRID, *outputs, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "2 configurations, 0 already done, 2 to run" in resumed.stderr
    _assert_each_row_once(csv_path, jsonl_path)


@pytest.mark.parametrize("module", ["cs336_systems.benchmark_direct", "cs336_systems.run_benchmarks"])
def test_a_model_factory_row_is_recognised_on_resume(tmp_path, module):
    # A --model-factory row's attention is "n/a": CSV reads it back as empty (a pandas NA string),
    # JSONL as "n/a", the record holds "n/a"; all three must be one key, or resume writes it twice.
    csv_path, jsonl_path = tmp_path / "r.csv", tmp_path / "r.jsonl"
    outputs = ["--output", str(csv_path), "--output", str(jsonl_path)]
    grid = [*GRID, "--model-factory", "user_models:make_model"]
    killed = _sweep(module, *grid, *outputs, fault_spec="kill@3")  # row 2 in the CSV, not yet in the JSONL
    assert killed.returncode == -9
    assert len(pd.read_csv(csv_path)) == 2 and len(read_results(jsonl_path)) == 1
    resumed = _sweep(module, *grid, *outputs, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "2 configurations, 1 already done, 1 to run" in resumed.stderr
    _assert_each_row_once(csv_path, jsonl_path)
    assert json.loads(jsonl_path.read_text().splitlines()[-1])["attention"] == "n/a"


def test_resume_on_another_tools_file_is_refused(tmp_path, capsys):
    jsonl = tmp_path / "attention.jsonl"
    jsonl.write_text(json.dumps({"implementation": "sdpa", "d_head": 16, "mean_ms": 1.0}) + "\n")
    code = benchmark_direct.main([*GRID, "--output", str(jsonl), "--resume"])
    err = capsys.readouterr().err
    assert code == 2 and "different keys" in err and _one_line_error(err)
    csv_path = tmp_path / "attention.csv"
    csv_path.write_text("implementation,d_head,mean_ms\nsdpa,16,1.0\n")
    code = benchmark_direct.main([*GRID, "--output", str(csv_path), "--resume"])
    err = capsys.readouterr().err
    assert code == 2 and "different columns" in err and _one_line_error(err)


# -- 4. one writer at a time ---------------------------------------------------------------

HOLD = """
import sys, time
from cs336_systems.results import ResultSink
sink = ResultSink([sys.argv[1]])
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
"""


def _holder(path, seconds):
    process = subprocess.Popen(
        [PYTHON, "-c", HOLD, str(path), str(seconds)], stdout=subprocess.PIPE, text=True, env=child_env()
    )
    assert process.stdout.readline().strip() == "locked"
    return process


def test_a_second_writer_is_told_which_process_holds_the_file(tmp_path, capsys):
    out = tmp_path / "r.csv"
    holder = _holder(out, 60)
    try:
        with pytest.raises(ResultFileError, match=f"being written by process {holder.pid}"):
            ResultSink([out])
        code = benchmark_direct.main([*GRID, "--output", str(out)])
        err = capsys.readouterr().err
        assert code == 2 and f"process {holder.pid}" in err and "--wait-lock" in err and _one_line_error(err)
        assert not out.exists()
    finally:
        holder.kill()
        holder.wait()


def test_wait_lock_waits_for_the_holder_then_writes(tmp_path, records):
    out = tmp_path / "r.csv"
    holder = _holder(out, 60)
    start = time.monotonic()
    threading.Timer(0.5, holder.kill).start()  # its lock goes with it, not before: no clock of the machine's
    with ResultSink([out], wait_lock=True) as sink:
        waited = time.monotonic() - start
        sink.write(records[0])
    holder.wait()
    assert waited >= 0.5 and len(pd.read_csv(out)) == 1
    assert not list(tmp_path.glob(".*.lock"))


def test_a_lock_left_by_a_killed_writer_does_not_block(tmp_path, records):
    out = tmp_path / "r.csv"
    holder = _holder(out, 60)
    holder.kill()
    holder.wait()
    assert (tmp_path / ".r.csv.lock").exists()  # SIGKILL: no cleanup, but the flock died with it
    with ResultSink([out]) as sink:
        sink.write(records[0])
    assert len(pd.read_csv(out)) == 1 and not (tmp_path / ".r.csv.lock").exists()


@pytest.mark.parametrize("existed", [True, False])
def test_two_names_of_one_file_are_one_lock(tmp_path, records, existed):
    """Two sweeps on one CSV through a hard link: the second is refused, however the file came to be."""
    first, second = tmp_path / "a.csv", tmp_path / "elsewhere" / "b.csv"
    second.parent.mkdir()
    if existed:
        with ResultSink([first]) as sink:
            sink.write(records[0])
    with ResultSink([first]) as sink:
        sink.write(records[1])  # the row that creates the file, where it did not exist
        os.link(first, second)
        with pytest.raises(ResultFileError, match="under another name of the same file"):
            ResultSink([second])
        sink.write(records[2])
    with ResultSink([second]) as sink:  # the first writer is gone: the other name is free
        sink.write(records[0])
    text = first.read_text()
    assert text.count("model_size") == 1 and len(pd.read_csv(first)) == (4 if existed else 3)


# -- 7. numbers that pass validation but make no sense -------------------------------------


def test_sizes_under_one_byte_and_a_nan_timeout_are_refused(capsys):
    with pytest.raises(ValueError, match="at least one byte"):
        parse_bytes("0.5")
    assert parse_bytes("1") == 1
    with pytest.raises(SystemExit) as exit_info:
        memory_main(["--device-memory", "0.5"])
    err = capsys.readouterr().err
    assert (
        exit_info.value.code == 2 and "--device-memory: size must be at least one byte" in err and _one_line_error(err)
    )
    for value in ("nan", "inf", "1e20"):
        with pytest.raises(SystemExit) as exit_info:
            run_benchmarks.main([*GRID, "--timeout", value])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and "--timeout: must be more than 0" in err and _one_line_error(err)


def test_memory_find_max_never_answers_its_own_cap(capsys):
    assert memory_main(["--find-max", "batch-size", "--device-memory", "1000TB", "--model-size", "small"]) == 0
    assert f"more than {FIND_MAX_LIMIT - 1}" in capsys.readouterr().out
    assert memory_main(["--find-max", "batch-size", "--device-memory", "1000TB", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)["find_max"]
    assert answer["largest_that_fits"] is None and answer["at_least"] == FIND_MAX_LIMIT


def test_compare_never_calls_a_nan_row_faster():
    base = {"status": "ok", "median_ms": 10.0, "notes": None}
    assert compare.verdict(base, {**base, "median_ms": 5.0}, 5)[1].startswith("faster")
    for new in ({**base, "median_ms": math.nan}, {**base, "median_ms": 5.0, "notes": NONFINITE_LOSS_NOTE}):
        ratio, text, regressed = compare.verdict(base, new, 5)
        assert ratio is None and "NaN" in text and regressed
    ratio, text, regressed = compare.verdict({**base, "median_ms": math.nan}, base, 5)
    assert ratio is None and "faster" not in text and not regressed


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="flock semantics")
def test_lock_file_holds_the_pid(tmp_path):
    out = tmp_path / "r.jsonl"
    with ResultSink([out]):
        assert (tmp_path / ".r.jsonl.lock").read_text().strip() == str(os.getpid())


def test_a_nan_loss_makes_its_row_wrong():
    import torch

    from cs336_systems.factory import build_model

    config = tiny_benchmark_config(pass_type="forward-backward")
    model = build_model(config.model, torch.device("cpu"))
    with torch.no_grad():
        next(model.parameters()).fill_(float("nan"))
    record = run_benchmark(config, model=model)
    assert record.status == "wrong" and NONFINITE_LOSS_NOTE in record.error and record.median_ms is not None
    assert run_benchmark(config).status == "ok"


def test_a_full_disk_in_the_single_benchmark_is_one_line_exit_1(tmp_path, capsys, fault):
    out = tmp_path / "r.csv"
    fault("enospc@1")
    assert benchmark.main([*TINY_SWEEP, "--pass-type", "forward", "--context-length", "8", "--output", str(out)]) == 1
    err = capsys.readouterr().err
    assert "r.csv: could not write a row (No space left on device)" in err and "Traceback" not in err
    assert not out.exists() or out.read_text() == ""


def test_a_file_with_rows_is_refused_without_resume_and_left_unlocked(tmp_path, records, capsys):
    out = tmp_path / "r.csv"
    with ResultSink([out]) as sink:
        sink.write(records[0])
    before = out.read_text()
    assert benchmark_direct.main([*GRID, "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "pass --resume" in err and _one_line_error(err)
    assert out.read_text() == before and not list(tmp_path.glob(".*.lock"))


def test_a_file_written_before_the_placement_columns_gains_them_empty(tmp_path, records):
    """Rows of an older harness (no executor, Slurm job or GPU columns) stay, read back as they were, and the
    next row is appended with those columns: a sweep resumes its old file."""
    from cs336_systems.placement import PLACEMENT_FIELDS

    old_csv, old_jsonl = tmp_path / "old.csv", tmp_path / "old.jsonl"
    with ResultSink([old_csv, old_jsonl]) as sink:
        sink.write(records[0])
    frame = pd.read_csv(old_csv).drop(columns=list(PLACEMENT_FIELDS))
    frame.to_csv(old_csv, index=False)  # as an older harness wrote it
    old_jsonl.write_text(
        json.dumps({k: v for k, v in json.loads(old_jsonl.read_text()).items() if k not in PLACEMENT_FIELDS}) + "\n"
    )
    assert read_results(old_csv)["executor"].isna().all()
    with ResultSink([old_csv, old_jsonl]) as sink:
        sink.write(records[1])
    for path in (old_csv, old_jsonl):
        rows = read_results(path)
        assert len(rows) == 2 and list(rows["context_length"]) == [8, 16]
        assert pd.isna(rows["executor"][0]) and rows["executor"][1] == "inline"
    assert pd.read_csv(old_csv).columns[-len(PLACEMENT_FIELDS) :].tolist() == list(PLACEMENT_FIELDS)
