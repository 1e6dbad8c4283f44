import json
import math

import pandas as pd
import pytest
import torch

from cs336_systems.results import BenchmarkRecord, ResultFileError, ResultSink, collect_environment, read_results
from cs336_systems.results.environment import FAKE_CPU_NAME_ENV, checkout_state
from cs336_systems.runner import run_benchmark
from tests.helpers import tiny_benchmark_config


@pytest.fixture(scope="module")
def records():
    ok = run_benchmark(tiny_benchmark_config(pass_type="forward"))
    unsupported = run_benchmark(tiny_benchmark_config(precision="tf32"))
    return [ok, unsupported]


def test_environment_is_recorded(records):
    row = records[0].to_row()
    for name in (
        "torch_version",
        "device_name",
        "hostname",
        "git_commit",
        "timestamp",
        "matmul_precision",
        "cuda_matmul_allow_tf32",
        "cudnn_allow_tf32",
        "num_threads",
        "python_version",
    ):
        assert name in row
    assert row["torch_version"] == torch.__version__
    assert collect_environment(torch.device("cpu")).num_threads == torch.get_num_threads()


def test_a_faked_cpu_name_is_the_one_rows_record(monkeypatch):
    """CI runs tests again as on another CPU (.ci/run): rows carry the name it fakes, as device and CPU."""
    monkeypatch.setenv(FAKE_CPU_NAME_ENV, "Intel(R) Xeon(R) Processor")
    environment = collect_environment(torch.device("cpu"))
    assert environment.device_name == environment.cpu_name == "Intel(R) Xeon(R) Processor"


def test_csv_round_trip_appends_header_once(tmp_path, records):
    path = tmp_path / "r.csv"
    sink = ResultSink([path])
    for record in records:
        sink.write(record)
    ResultSink([path]).write(records[0])  # a later run appends to the same file
    assert path.read_text().count("model_size,") == 1
    frame = read_results(path)
    assert list(frame.columns) == list(BenchmarkRecord.row_fields())
    assert len(frame) == 3
    first = records[0].to_row()
    for name in ("model_size", "num_params", "context_length", "pass_type", "status", "torch_version"):
        assert frame.loc[0, name] == first[name]
    for name in ("mean_ms", "std_ms", "cv_pct", "p90_ms", "tokens_per_s"):
        assert frame.loc[0, name] == pytest.approx(first[name], rel=1e-12)
    assert frame.loc[1, "status"] == "unsupported" and math.isnan(frame.loc[1, "mean_ms"])


def test_csv_with_other_columns_is_refused(tmp_path, records):
    path = tmp_path / "r.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(ResultFileError, match="different columns"):
        ResultSink([path])


def test_jsonl_round_trip_keeps_raw_samples(tmp_path, records):
    path = tmp_path / "r.jsonl"
    sink = ResultSink([path])
    for record in records:
        sink.write(record)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["step_ms"] == records[0].step_ms
    assert lines[0]["warmup_step_ms"] == records[0].warmup_step_ms
    frame = read_results(path)
    assert frame.loc[0, "mean_ms"] == pytest.approx(records[0].mean_ms)
    assert frame.loc[1, "error"] == records[1].error


def test_markdown_round_trip(tmp_path, records):
    path = tmp_path / "r.md"
    sink = ResultSink([path])
    sink.write(records[0])
    sink.write(records[1])
    text = path.read_text()
    assert "Environment:" in text and "sample standard deviation (ddof=1)" in text and "100*IQR/median" in text
    assert "status unsupported" in text
    frame = read_results(path)
    assert list(frame.columns) == list(BenchmarkRecord.markdown_columns)
    row = records[0].to_row()
    assert frame.loc[0, "model_size"] == row["model_size"]
    assert frame.loc[0, "num_params"] == row["num_params"]
    assert frame.loc[0, "mean_ms"] == pytest.approx(row["mean_ms"], abs=5e-4)
    assert frame.loc[0, "iqr_pct"] == pytest.approx(row["iqr_pct"], abs=0.05)
    assert frame.loc[0, "median_ms"] == pytest.approx(row["median_ms"], abs=5e-4)
    assert frame.loc[1, "status"] == "unsupported" and pd.isna(frame.loc[1, "mean_ms"])


def test_markdown_carries_a_results_html_as_text(tmp_path, records):
    """A device name, a size or an error holding HTML is shown, never rendered; it reads back as written."""
    import dataclasses

    hostile = dataclasses.replace(
        records[0],
        model_size="<i>small</i>",
        status="error",
        error="<script>alert(1)</script> & more",
        environment=dataclasses.replace(records[0].environment, device_name="<img src=x onerror=alert(1)>"),
    )
    path = tmp_path / "r.md"
    with ResultSink([path]) as sink:
        sink.write(hostile)
    text = path.read_text()
    assert "<script>" not in text and "<img" not in text and "<i>" not in text
    assert "&lt;script>alert(1)&lt;/script> & more" in text and "&lt;img src=x onerror=alert(1)>" in text
    assert read_results(path).loc[0, "model_size"] == "<i>small</i>"
    assert "<script>" not in BenchmarkRecord.console([hostile.to_row()])


def test_markdown_warns_about_noise():
    row = {
        "model_size": "small",
        "context_length": 128,
        "pass_type": "forward",
        "precision": "fp32",
        "status": "ok",
        "median_ms": 1.0,
        "iqr_pct": 12.5,
        "cv_pct": 3.0,
    }
    # the table leads with the median: its noise rule is IQR/median, whatever the mean's CV says
    assert "high variance, IQR/median 12.5% > 10%; treat the median with care" in BenchmarkRecord.markdown([row])
    assert "high variance" not in BenchmarkRecord.markdown([{**row, "iqr_pct": 9.0, "cv_pct": 40.0}])


def test_unknown_output_suffix(tmp_path):
    with pytest.raises(ResultFileError, match="unknown suffix"):
        ResultSink([tmp_path / "r.xlsx"])


def test_output_directories_are_created(tmp_path, records):
    path = tmp_path / "deep" / "er" / "r.csv"
    ResultSink([path]).write(records[0])
    assert path.exists()


def test_checkout_is_dirty_only_for_changes_outside_outputs(tmp_path):
    import shutil
    import subprocess

    if shutil.which("git") is None:
        pytest.skip("git not installed")

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "sweep.csv").write_text("a\n1\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    commit, dirty = checkout_state(tmp_path)
    assert len(commit) == 40 and dirty is False
    (tmp_path / "results" / "sweep.csv").write_text("a\n2\n")  # a regenerated result
    (tmp_path / "new_untracked.py").write_text("")
    assert checkout_state(tmp_path) == (commit, False)
    (tmp_path / "code.py").write_text("x = 2\n")
    assert checkout_state(tmp_path) == (commit, True)
    assert checkout_state(tmp_path / "results") == ("unknown", None)


# -- the one schema ---------------------------------------------------------------------------

from dataclasses import dataclass  # noqa: E402
from typing import ClassVar  # noqa: E402

from cs336_systems.results import (  # noqa: E402
    Record,
    Timing,
    fill_timing,
    identity_field,
    samples_field,
    timing_columns,
)
from cs336_systems.stats import summarize  # noqa: E402


@dataclass
class _PhaseRecord(timing_columns("backward_"), timing_columns("forward_"), Record):
    name: str = identity_field()
    size: int = identity_field()
    flops: int | None = None
    forward_ms: list[float] = samples_field()

    tool: ClassVar[str] = "phases"
    title: ClassVar[str] = "phases"
    markdown_columns: ClassVar[tuple[str, ...]] = ("name", "size", "status", "forward_median_ms", "backward_cv_pct")
    label_columns: ClassVar[tuple[str, ...]] = ("name", "size")


def test_common_fields_are_declared_once_and_come_last():
    fields = _PhaseRecord.row_fields()
    assert fields[:3] == ("tool", "name", "size")  # the tool that wrote the row, then its identity
    assert _PhaseRecord(name="a", size=1, status="ok").to_row()["tool"] == "phases"
    assert fields.index("forward_mean_ms") < fields.index("backward_mean_ms") < fields.index("status")
    tail = fields[fields.index("status") :]
    assert tail[:4] == ("status", "error", "notes", "timestamp") and tail[4] == "device_name"
    assert "forward_ms" not in fields  # raw samples go to JSONL only
    for record_type in (BenchmarkRecord, _PhaseRecord):
        assert record_type.row_fields().count("status") == 1 and issubclass(record_type, Record)
    assert issubclass(BenchmarkRecord, Timing)


def test_fill_timing_fills_prefixed_columns_from_one_summary():
    record = _PhaseRecord(name="a", size=1, status="ok")
    fill_timing(record, summarize([1.0, 2.0, 3.0, 4.0]), prefix="forward_")
    assert record.forward_mean_ms == 2.5 and record.forward_median_ms == 2.5
    assert record.forward_min_ms == 1.0 and record.forward_max_ms == 4.0
    assert record.forward_cv_pct == pytest.approx(100 * record.forward_std_ms / 2.5)
    assert record.forward_iqr_ms == 1.5 and record.forward_iqr_pct == pytest.approx(60.0)  # quartiles 1.75, 3.25
    assert record.backward_mean_ms is None  # the other prefix is untouched
    with pytest.raises(AttributeError, match="no timing column 'median_ms'"):
        fill_timing(record, summarize([1.0, 2.0]))


def test_identity_is_marked_and_survives_every_file(tmp_path, records):
    identity = BenchmarkRecord.identity_fields()
    assert identity[0] == "model_size" and identity[-1] == "target_iqr_pct" and "num_params" not in identity
    assert records[0].key() != records[1].key()  # forward fp32 vs tf32
    paths = [tmp_path / "r.csv", tmp_path / "r.jsonl"]
    sink = ResultSink(paths)
    for record in records:
        sink.write(record)
    for path in paths:
        rows = read_results(path).to_dict("records")
        assert [BenchmarkRecord.row_key(row) for row in rows] == [record.key() for record in records]


def test_one_sink_writes_any_record_type_with_its_own_view(tmp_path):
    record = _PhaseRecord(name="flash", size=64, status="oom", error="out of memory")
    fill_timing(record, summarize([1.0, 3.0]), prefix="backward_")
    md, csv = tmp_path / "p.md", tmp_path / "p.csv"
    ResultSink([md, csv], _PhaseRecord).write(record)
    text = md.read_text()
    assert text.startswith("# phases\n")
    assert "- name=flash size=64: status oom: out of memory" in text
    assert list(read_results(md).columns) == list(_PhaseRecord.markdown_columns)
    assert list(read_results(csv).columns) == list(_PhaseRecord.row_fields())
    assert read_results(csv).loc[0, "backward_median_ms"] == 2.0


def test_csv_written_with_the_old_column_order_is_appended_in_its_order(tmp_path, records):
    path = tmp_path / "old.csv"
    old_order = list(reversed(BenchmarkRecord.row_fields()))
    path.write_text(",".join(old_order) + "\n")
    ResultSink([path]).write(records[0])
    frame = read_results(path)
    assert list(frame.columns) == old_order
    assert frame.loc[0, "model_size"] == records[0].model_size
    assert frame.loc[0, "mean_ms"] == pytest.approx(records[0].mean_ms, rel=1e-12)


def test_console_view_is_compact_and_keeps_the_notes(records):
    rows = [record.to_row() for record in records]
    text = BenchmarkRecord.console(rows)
    assert text.startswith("# cs336-bench benchmark results\n")
    header = next(line for line in text.splitlines() if line.startswith("| "))
    for name in ("median_ms", "iqr_pct", "tokens_per_s", "mfu", "peak_memory_gib", "status"):
        assert name in header
    assert "std_ms" not in header and "p90_ms" not in header
    assert (
        len(BenchmarkRecord.console_columns) < len(BenchmarkRecord.markdown_columns) < len(BenchmarkRecord.row_fields())
    )
    assert "status unsupported" in text
    # the settings both rows share are one line above the table, those that differ are columns
    shared = f"every row: model_size custom, context_length {rows[0]['context_length']}, batch_size "
    assert shared in text and "| precision " in header and "| batch_size" not in header
    assert "| pass_type " in header  # not a console column, but it differs between the rows
    every = next(line for line in BenchmarkRecord.console(rows, all_columns=True).splitlines() if line.startswith("| "))
    assert [cell.strip() for cell in every.split("|")[1:-1]] == list(BenchmarkRecord.markdown_columns)


def test_an_mfu_over_a_peak_read_on_a_busy_machine_says_so_on_its_line(records):
    row = {**records[0].to_row(), "mfu": 0.295, "peak_low": "other processes kept 1.3 of 2 cores busy"}
    line = next(line for line in BenchmarkRecord.console([row]).splitlines() if line.startswith("| custom"))
    assert "| 0.295 (high) |" in line


def test_record_key_equals_the_configuration_key(records):
    from cs336_systems.config import IDENTITY_FIELDS
    from tests.helpers import tiny_benchmark_config

    assert BenchmarkRecord.identity_fields() == IDENTITY_FIELDS
    assert records[0].key() == tiny_benchmark_config(pass_type="forward").key()
    assert records[1].key() == tiny_benchmark_config(precision="tf32").key()
    assert BenchmarkRecord.row_key(records[0].to_row()) == records[0].key()


def test_files_written_before_the_column_renames_read_as_todays_rows(tmp_path):
    from cs336_systems.report.load import load

    attention = {"implementation": "sdpa", "head_dim": 16, "seq_len": 128, "steps": 10, "status": "ok", "mean_ms": 1.0}
    (tmp_path / "att.csv").write_text(",".join(attention) + "\n" + ",".join(map(str, attention.values())) + "\n")
    (tmp_path / "att.jsonl").write_text(json.dumps({**attention, "forward_ms": [1.0, 2.0]}) + "\n")
    (tmp_path / "ddp.csv").write_text("strategy,world_size,per_device_batch,mean_ms,status\nddp,2,4,1.0,ok\n")
    for name in ("att.csv", "att.jsonl"):
        row = read_results(tmp_path / name).iloc[0]
        assert (row["context_length"], row["measure_steps"]) == (128, 10) and "seq_len" not in row
    assert list(read_results(tmp_path / "att.jsonl").iloc[0]["forward_samples_ms"]) == [1.0, 2.0]
    assert read_results(tmp_path / "ddp.csv").iloc[0]["batch_size"] == 4
    tools = load([tmp_path / "att.csv", tmp_path / "ddp.csv"])  # the report tells old files' tools apart too
    assert set(tools) == {"attention_bench", "ddp_bench"} and tools["ddp_bench"].iloc[0]["batch_size"] == 4


def test_old_per_phase_columns_read_back_under_todays_names(tmp_path):
    """Files written before each phase had every timing column (forward_ms was the mean) and before
    the IQR was a column: the means come back as forward_mean_ms, a JSONL file's IQR from its samples."""
    old = {"model_size": "small", "pass_type": "train-step", "status": "ok", "mean_ms": 10.0, "median_ms": 10.0}
    phases = {"forward_ms": 2.0, "backward_ms": 5.0, "optimizer_ms": 1.0, "forward_median_ms": 1.9}
    (tmp_path / "bench.csv").write_text(
        ",".join({**old, **phases}) + "\n" + ",".join(map(str, {**old, **phases}.values())) + "\n"
    )
    samples = {"step_ms": [10.0, 10.0, 12.0, 14.0], "forward_samples_ms": [2.0, 2.0, 2.0, 2.0]}
    (tmp_path / "bench.jsonl").write_text(json.dumps({**old, **phases, **samples}) + "\n")
    (tmp_path / "ddp.csv").write_text(
        "strategy,world_size,batch_size,mean_ms,forward_ms,backward_ms,status\nddp,2,4,9.0,2.5,6.0,ok\n"
    )
    for name in ("bench.csv", "bench.jsonl"):
        row = read_results(tmp_path / name).iloc[0]
        assert (row["forward_mean_ms"], row["backward_mean_ms"], row["optimizer_mean_ms"]) == (2.0, 5.0, 1.0)
        assert row["forward_median_ms"] == 1.9 and "forward_ms" not in row
    jsonl = read_results(tmp_path / "bench.jsonl").iloc[0]
    # quartiles of 10, 10, 12, 14: 10 and 12.5 -> IQR 2.5 of a median of 11
    assert jsonl["iqr_ms"] == pytest.approx(2.5) and jsonl["iqr_pct"] == pytest.approx(100 * 2.5 / 11)
    assert jsonl["forward_iqr_pct"] == 0.0
    assert "iqr_pct" not in read_results(tmp_path / "bench.csv").columns  # no samples, no IQR
    ddp = read_results(tmp_path / "ddp.csv").iloc[0]
    assert (ddp["forward_mean_ms"], ddp["backward_mean_ms"]) == (2.5, 6.0)
