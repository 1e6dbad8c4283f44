"""Hostile paths and damaged files: planted links, FIFOs, over-long names, full disks, result
files that are not what they claim, terminals that cannot show '±'."""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from cs336_systems.compare import main as compare_main
from cs336_systems.report.cli import main as report_main
from cs336_systems.results import ResultFileError, ResultSink, ResultWriteError, write_whole
from cs336_systems.results.paths import check_output_path, check_output_paths
from cs336_systems.results.readers import read_results
from cs336_systems.results.writing import repair_cut_line
from cs336_systems.terminal import ascii_locale, ascii_spelling

REPO = Path(__file__).resolve().parents[1]


class Row:
    """A record as the sink needs it: one CSV/JSONL row and a key."""

    def __init__(self, **row):
        self.row = row

    def to_row(self):
        return self.row

    def to_json(self):
        return self.row

    def key(self):
        return tuple(self.row.items())

    @classmethod
    def row_fields(cls):
        return ("name", "mean_ms")

    @classmethod
    def markdown(cls, rows):
        return f"{len(rows)} rows\n"

    @classmethod
    def row_key(cls, row):
        return tuple(row.items())


def sink(paths, **kwargs):
    return ResultSink(paths, Row, **kwargs)


# -- family: paths ------------------------------------------------------------------------


def test_a_planted_symlink_as_output_is_refused_and_its_target_untouched(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    for name in ("link.csv", "dangling.csv"):
        (tmp_path / name).symlink_to(victim if name == "link.csv" else tmp_path / "nowhere.csv")
        with pytest.raises(ResultFileError, match="is a symbolic link"):
            sink([tmp_path / name])
    assert victim.read_text() == "precious\n" and not (tmp_path / "nowhere.csv").exists()


def test_a_symlink_to_dev_full_is_refused_before_any_work(tmp_path):
    (tmp_path / "full.csv").symlink_to("/dev/full")
    with pytest.raises(ResultFileError, match="symbolic link"):
        check_output_path(tmp_path / "full.csv")


@pytest.mark.parametrize(
    "make, why",
    [
        (lambda p: os.mkfifo(p), "FIFO"),
        (lambda p: p.mkdir(), "is a directory"),
    ],
)
def test_fifos_and_directories_are_refused_without_blocking(tmp_path, make, why):
    target = tmp_path / "out.csv"
    make(target)
    with pytest.raises(ResultFileError, match=why):
        check_output_path(target, suffixes=(".csv",))


def test_a_trailing_slash_is_refused(tmp_path):
    with pytest.raises(ResultFileError, match="ends in '/'"):
        check_output_path(f"{tmp_path}/x.csv/", suffixes=(".csv",))
    assert not (tmp_path / "x.csv").exists()


def test_names_and_paths_past_the_filesystem_limits_are_refused_first(tmp_path):
    name_max = os.pathconf(tmp_path, "PC_NAME_MAX")
    with pytest.raises(ResultFileError, match="file name too long"):  # fits alone, not with ".NAME.lock"
        check_output_path(tmp_path / ("a" * (name_max - 6) + ".csv"))
    check_output_path(tmp_path / ("a" * (name_max - 10) + ".csv"))
    with pytest.raises(ResultFileError, match="path too long"):
        check_output_path(tmp_path / ("d/" * 2100 + "x.csv"))


def test_a_lock_sidecar_that_is_a_link_or_a_directory_is_refused_and_the_victim_kept(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / ".a.csv.lock").symlink_to(victim)
    (tmp_path / ".b.csv.lock").mkdir()
    with pytest.raises(ResultFileError, match="lock file .a.csv.lock is a symbolic link"):
        sink([tmp_path / "a.csv"])
    with pytest.raises(ResultFileError, match="lock file .b.csv.lock is not a regular file"):
        sink([tmp_path / "b.csv"])
    assert victim.read_text() == "precious\n"


def test_a_planted_link_at_the_markdown_temp_name_is_not_written_through(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "r.md.tmp").symlink_to(victim)
    with sink([tmp_path / "r.md"]) as out:
        out.write(Row(name="a", mean_ms=1.0))
    assert victim.read_text() == "precious\n"
    assert (tmp_path / "r.md").read_text() == "1 rows\n" and not (tmp_path / "r.md.tmp").exists()


def test_two_outputs_that_are_one_file_are_refused(tmp_path):
    (tmp_path / "a.csv").write_text("")
    os.link(tmp_path / "a.csv", tmp_path / "b.csv")
    with pytest.raises(ResultFileError, match="same file"):
        check_output_paths([tmp_path / "a.csv", tmp_path / "b.csv"])
    assert check_output_paths([tmp_path / "a.csv", tmp_path / "." / "a.csv"]) == [tmp_path / "a.csv"]


def test_report_refuses_to_overwrite_its_own_input(tmp_path, capsys):
    (tmp_path / "in.md").write_text("| a |\n|---|\n| 1 |\n")
    assert report_main([str(tmp_path / "in.md"), "--output", str(tmp_path / "in.md")]) == 2
    assert "same file" in capsys.readouterr().err


def test_a_writable_file_in_an_unwritable_directory_is_refused_before_any_work():
    """As a user who cannot write the directory: root drops to nobody in a forked child."""
    import shutil
    import tempfile

    top = Path(tempfile.mkdtemp(dir="/tmp"))  # not under pytest's root-only directory
    try:
        top.chmod(0o755)
        locked = top / "locked"
        locked.mkdir()
        (locked / "r.csv").write_text("")
        (locked / "r.csv").chmod(0o666)
        locked.chmod(0o555)
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 1
            try:
                if os.geteuid() == 0:
                    os.setgid(65534)
                    os.setuid(65534)
                check_output_path(locked / "r.csv")
            except ResultFileError as exc:
                code = 0 if "cannot write in its directory" in str(exc) else 1
            except BaseException:
                code = 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        (top / "locked").chmod(0o755)
        shutil.rmtree(top)


def test_the_lock_message_names_only_flags_the_tool_has(tmp_path):
    first = sink([tmp_path / "r.csv"])
    try:
        script = (
            "from cs336_systems.results import ResultSink\n"
            "class Row:\n    row_fields = classmethod(lambda cls: ('name', 'mean_ms'))\n"
            "    markdown = classmethod(lambda cls, rows: '')\n"
            f"ResultSink([{str(tmp_path / 'r.csv')!r}], Row)"
        )
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}
        )
        assert "is being written by process" in done.stderr and "--wait-lock" not in done.stderr
    finally:
        first.close()


# -- family: damaged result files ---------------------------------------------------------

HEADER = "name,status,mean_ms"
DAMAGED = {
    "header_twice.csv": (f"{HEADER}\na,ok,1.0\n{HEADER}\nb,ok,2.0\n", r":3: the header line again"),
    "text_number.csv": (f"{HEADER}\na,ok,1.0\nb,ok,fast\n", r":3: column mean_ms holds 'fast'"),
    "short_row.csv": (f"{HEADER}\na,ok\n", r":2: 2 fields, the header has 3"),
    "markdown.csv": ("| name | mean_ms |\n|---|---|\n| a | 1 |\n", r":1: a Markdown file named .csv"),
    "not_utf8.csv": (b"name,status\n\xff\xfe,ok\n", r":2: not UTF-8"),
    "scalar.jsonl": ('{"name": "a", "mean_ms": 1}\n3\n', r":2: a JSON int, not an object"),
    "mixed.jsonl": ('{"name": "a", "mean_ms": 1}\n{"world_size": 2}\n', r":2: other keys than line 1"),
    "text.jsonl": ('{"name": "a", "mean_ms": "slow"}\n', r":1: column mean_ms holds 'slow'"),
}


@pytest.mark.parametrize("name", sorted(DAMAGED))
def test_a_damaged_result_file_is_named_as_file_and_line(tmp_path, name):
    content, message = DAMAGED[name]
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ResultFileError, match=f"{name}{message}"):
        read_results(path)


@pytest.mark.parametrize("name", ["header_twice.csv", "text_number.csv", "mixed.jsonl"])
def test_report_and_compare_refuse_a_damaged_file_in_one_line(tmp_path, capsys, name):
    content, message = DAMAGED[name]
    path = tmp_path / name
    path.write_text(content)
    assert report_main([str(path), "--output", str(tmp_path / "r.md")]) == 2
    assert compare_main([str(path), str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(f"{name}:" in line for line in err)


def _benchmark_rows(tmp_path, name: str, **columns) -> Path:
    """Three committed benchmark rows, with `columns` set on each, as a CSV."""
    import pandas as pd

    rows = pd.read_csv(REPO / "results" / "cpu_sweep.csv").head(3)
    for column, value in columns.items():
        rows[column] = value
    path = tmp_path / name
    rows.to_csv(path, index=False)
    return path


def test_a_field_over_128_kib_is_read_by_report_and_compare_and_never_written(tmp_path, capsys):
    """The csv module stops at 128 KiB a field (a _csv.Error traceback): the readers read a longer one,
    and the writers cut a cell to what the csv module reads with its default limit."""
    import csv

    from cs336_systems.results.validate import FIELD_CHARS

    path = _benchmark_rows(tmp_path, "long.csv", notes="x" * 200_000)
    assert report_main([str(path), "--output", str(tmp_path / "r.md")]) == 0
    assert compare_main([str(path), str(path)]) == 0
    assert "Traceback" not in capsys.readouterr().err
    out = tmp_path / "written.csv"
    with sink([out]) as rows:
        rows.write(Row(name="a" * 300_000, mean_ms=1.0))
    with out.open(newline="") as handle:  # the csv module as a user's script reads it
        cells = list(csv.DictReader(handle))[0]
    assert len(cells["name"]) == FIELD_CHARS and cells["name"].endswith("[cut: 300,000 characters]")


def test_all_nan_numbers_are_a_report_of_empty_cells(tmp_path, capsys):
    numbers = ["mean_ms", "std_ms", "median_ms", "min_ms", "max_ms", "flops_per_step", "peak_memory_bytes", "mfu"]
    path = _benchmark_rows(tmp_path, "nan.csv", **dict.fromkeys(numbers, float("nan")))
    assert report_main([str(path), "--output", str(tmp_path / "r.md")]) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_a_row_written_twice_is_one_line_in_report(tmp_path, capsys):
    import pandas as pd

    path = _benchmark_rows(tmp_path, "twice.csv")
    rows = pd.read_csv(path)
    pd.concat([rows, rows.head(1)]).to_csv(path, index=False)  # the same configuration, the same moment
    assert report_main([str(path), "--output", str(tmp_path / "r.md")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "two rows of one configuration measured at the same moment" in err[0]


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_fifty_thousand_columns_are_one_line_not_minutes(tmp_path, capsys, suffix):
    names = [f"c{i}" for i in range(50_000)]
    path = tmp_path / f"wide{suffix}"
    if suffix == ".csv":
        path.write_text(",".join(names) + "\n" + ",".join("1" for _ in names) + "\n")
    else:
        path.write_text(json.dumps(dict.fromkeys(names, 1)) + "\n")
    assert report_main([str(path), "--output", str(tmp_path / "r.md")]) == 2
    assert compare_main([str(path), str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("50,000 columns; a result file has at most" in line for line in err)


def test_a_json_result_nested_200000_deep_is_one_line(tmp_path, capsys):
    deep = '{"a": ' + "[" * 200_000 + "]" * 200_000 + "}\n"
    (tmp_path / "deep.jsonl").write_text(deep)
    (tmp_path / "deep.json").write_text(deep)
    for name in ("deep.jsonl", "deep.json"):
        assert report_main([str(tmp_path / name), "--output", str(tmp_path / "r.md")]) == 2
        assert "nested too deep" in capsys.readouterr().err


def test_a_fifo_given_as_input_is_refused_without_blocking(tmp_path, capsys):
    os.mkfifo(tmp_path / "in.csv")
    assert report_main([str(tmp_path / "in.csv"), "--output", str(tmp_path / "r.md")]) == 2
    assert compare_main([str(tmp_path / "in.csv"), str(tmp_path / "in.csv")]) == 2
    assert "not a regular file" in capsys.readouterr().err


def test_resume_refuses_a_damaged_output_naming_its_line(tmp_path):
    from cs336_systems.results import BenchmarkRecord

    out = tmp_path / "r.csv"
    header = ",".join(BenchmarkRecord.row_fields())
    out.write_text(f"{header}\n{header}\n")  # the tool's own columns, a file joined to another
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "cs336_systems.benchmark_direct",
            "--device",
            "cpu",
            "--d-model",
            "16",
            "--d-ff",
            "32",
            "--num-layers",
            "1",
            "--num-heads",
            "2",
            "--vocab-size",
            "31",
            "--context-lengths",
            "4",
            "--batch-sizes",
            "1",
            "--warmup-steps",
            "0",
            "--measure-steps",
            "1",
            "--output",
            str(out),
            "--resume",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "r.csv:2: the header line again" in done.stderr


# -- family: faults (a last row without its newline, a full disk) --------------------------


def test_a_whole_last_row_missing_its_newline_is_kept_and_said_so(tmp_path, capsys):
    csv_path, jsonl_path = tmp_path / "r.csv", tmp_path / "r.jsonl"
    csv_path.write_text("name,mean_ms\na,1.0\nb,2.0")
    jsonl_path.write_text('{"name": "a", "mean_ms": 1.0}\n{"name": "b", "mean_ms": 2.0}')
    with sink([csv_path, jsonl_path]) as out:
        out.write(Row(name="c", mean_ms=3.0))
    err = capsys.readouterr().err
    assert err.count("lacked its newline; kept it") == 2
    assert csv_path.read_text() == "name,mean_ms\na,1.0\nb,2.0\nc,3.0\n"
    assert [json.loads(line)["name"] for line in jsonl_path.read_text().splitlines()] == ["a", "b", "c"]


def test_a_cut_last_row_is_dropped_and_the_message_does_not_promise_a_rerun(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text('name,mean_ms\na,1.0\n"b,2')
    message = repair_cut_line(path)
    assert path.read_text() == "name,mean_ms\na,1.0\n"
    assert message.endswith("dropped a cut last line (a writer stopped mid-row); that row is not in the file")
    assert "r.csv:3:" in message


def test_a_full_disk_keeps_the_previous_file_and_names_it(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    path.write_text("old\n")

    def full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(ResultWriteError, match=r"summary\.json: could not write \(No space left on device\); kept"):
        write_whole(path, "new\n")
    assert path.read_text() == "old\n" and not (tmp_path / "summary.json.tmp").exists()


def test_report_on_a_full_disk_writes_its_markdown_and_says_what_it_could_not(tmp_path, monkeypatch, capsys):
    from cs336_systems.results.writing import FAULT_ENV

    rows = REPO / "results" / "cpu_sweep.csv"
    monkeypatch.setenv(FAULT_ENV, "full:.png,.tex")  # the figures and the LaTeX do not fit; the Markdown does
    md, tex = tmp_path / "r.md", tmp_path / "r.tex"
    assert report_main([str(rows), "--output", str(tex), "--output", str(md)]) == 1
    err = capsys.readouterr().err
    assert md.is_file() and "## " in md.read_text() and ".png" not in md.read_text()
    assert not tex.exists() and not list(tmp_path.glob("*.png")) and not list(tmp_path.glob("*.tmp"))
    lines = [line for line in err.splitlines() if "error:" in line]
    assert any(re.search(r"r_\w+\.png", line) for line in lines) and any("r.tex" in line for line in lines)
    assert all("No space left on device" in line for line in lines) and "Traceback" not in err


def test_monitor_csv_on_a_full_disk_keeps_whole_rows_and_says_so_once(tmp_path, monkeypatch):
    from cs336_systems.monitor.files import SampleCsvWriter
    from cs336_systems.monitor.sampling import SAMPLE_FIELDS, Sample

    path = tmp_path / "m.csv"
    writer = SampleCsvWriter(path)
    sample = Sample(**{name: 1.0 for name in SAMPLE_FIELDS})
    writer(sample)
    real_write = os.write

    def half(fd, data):
        real_write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", half)
    writer(sample)
    writer(sample)  # after the first failure the file is left alone
    monkeypatch.undo()
    lines = path.read_text().splitlines(keepends=True)
    assert len(lines) == 2 and all(line.endswith("\n") for line in lines)
    assert writer.rows == 1 and "m.csv" in writer.error.strerror


# -- terminals ----------------------------------------------------------------------------


def test_ascii_spelling_and_the_locale_rule():
    assert ascii_spelling("±5% × 3 → µs é") == "+/-5% x 3 -> us e"
    assert ascii_locale({"LANG": "C", "LC_CTYPE": "C.UTF-8"})  # Python's own coercion
    assert ascii_locale({"LC_ALL": "POSIX"})
    assert not ascii_locale({"LANG": "C.UTF-8"})
    assert not ascii_locale({"LANG": "C", "PYTHONIOENCODING": "utf-8"})


@pytest.mark.parametrize("env", [{"LANG": "C"}, {"PYTHONIOENCODING": "ascii"}])
def test_compare_prints_to_a_terminal_that_cannot_show_plus_minus(tmp_path, env):
    from cs336_systems.runner import run_benchmark
    from tests.helpers import tiny_benchmark_config

    path = tmp_path / "r.csv"
    with ResultSink([path]) as out:
        out.write(run_benchmark(tiny_benchmark_config(pass_type="forward")))
    rows = pd.read_csv(path)  # measured quiet whatever this machine is: busy rows get no verdict to print
    rows.assign(other_load_cores=0.0).to_csv(path, index=False)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "LANG", "PYTHONIO", "PYTHONUTF"))}
    done = subprocess.run(
        [sys.executable, "-m", "cs336_systems.compare", str(path), str(path)],
        capture_output=True,
        env={**clean, **env, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert b"+/-5%" in done.stdout and done.stdout.isascii()


# -- sane upper bounds ----------------------------------------------------------------------


def test_sizes_and_counts_have_sane_upper_bounds():
    import argparse

    from cs336_systems.argtypes import MAX_INT, positive_int
    from cs336_systems.distributed.driver import LaunchError, resolve_world_sizes
    from cs336_systems.models import ConfigError, ModelConfig

    assert positive_int(str(MAX_INT)) == MAX_INT
    with pytest.raises(argparse.ArgumentTypeError, match="at most 2\\*\\*40"):
        positive_int(str(2**62))
    with pytest.raises(ConfigError, match="d_model must be at most"):
        ModelConfig(d_model=2**21, d_ff=64, num_layers=1, num_heads=2).validate()
    with pytest.raises(LaunchError, match="--world-sizes 1000: at most 64"):
        resolve_world_sizes([2, 1000], "gloo", "cpu", torchrun=False)


def test_monitor_and_output_that_are_one_file_are_refused(tmp_path):
    import argparse

    from cs336_systems.monitor.files import MonitorPathError, check_monitor_arguments

    args = argparse.Namespace(monitor=str(tmp_path / "r.csv"), monitor_interval=1.0, output=[str(tmp_path / "r.csv")])
    with pytest.raises(MonitorPathError, match="--monitor .* and --output .* are the same file"):
        check_monitor_arguments(args)
    args.output = [str(tmp_path / "r.json")]  # where the monitor's summary goes
    with pytest.raises(MonitorPathError, match="--monitor's JSON"):
        check_monitor_arguments(args)


def test_a_markdown_results_file_is_refused_as_input_to_report_and_compare(tmp_path, capsys):
    (tmp_path / "rows.md").write_text("| model_size | mean_ms |\n|---|---|\n| small | 1.0 |\n")
    assert report_main([str(tmp_path / "rows.md"), "--output", str(tmp_path / "r.md")]) == 2
    assert compare_main([str(tmp_path / "rows.md"), str(tmp_path / "rows.md")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("a Markdown rendering" in line for line in err)


def test_the_attention_figure_of_a_run_whose_every_row_failed_is_drawn(tmp_path):
    from cs336_systems.attention_bench.figure import plot

    row = {
        "implementation": "user:exits",
        "head_dim": 8,
        "context_length": 16,
        "status": "error",
        "batch_size": 1,
        "precision": "fp32",
        "forward_mean_ms": None,
        "backward_mean_ms": None,
    }
    assert plot([row], tmp_path / "p.png").stat().st_size > 0


def test_loader_bench_writes_no_item_through_a_link_in_its_data_dir(tmp_path, capsys):
    from cs336_systems.loader_bench.cli import main as loader_main

    data, victim = tmp_path / "data", tmp_path / "victim.bin"
    data.mkdir()
    victim.write_bytes(b"theirs")
    (data / "item_0000001.bin").symlink_to(victim)
    argv = ["--storage", "local", "--data-dir", str(data), "--num-items", "8", "--item-bytes", "64"]
    assert loader_main([*argv, "--batch-size", "2", "--epochs", "1", "--compute-ms", "0.1", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "item_0000001.bin is a symbolic link" in err and len(err.strip().splitlines()) == 1
    assert victim.read_bytes() == b"theirs"


def test_report_writes_no_figure_through_a_planted_link(tmp_path):
    victim = tmp_path / "victim.png"
    victim.write_bytes(b"theirs")
    figure = tmp_path / "r_amd_epyc_forward.png"  # a figure report makes from these rows
    figure.symlink_to(victim)
    assert report_main([str(REPO / "results" / "cpu_sweep.csv"), "--output", str(tmp_path / "r.md")]) == 0
    assert victim.read_bytes() == b"theirs"
    assert figure.read_bytes().startswith(b"\x89PNG") and not figure.is_symlink()  # a file of its own now
