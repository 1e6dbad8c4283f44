"""report's formats, its one-row-one-number tables and --verify, from committed result rows and
from rows built where compile/eager, bf16/fp32, checkpointed, fast-path and strategy rows coexist."""

import re
from pathlib import Path

import pandas as pd
import pytest

from cs336_systems.report import cli as report
from cs336_systems.report.build import build_document
from cs336_systems.report.document import sig3
from cs336_systems.report.grid import FoldedRows, Value, grid
from cs336_systems.report.latex import escape
from cs336_systems.report.load import load
from cs336_systems.report.typst_source import string
from cs336_systems.report.verify import parse_tables
from cs336_systems.results import BenchmarkRecord
from tests.helpers import REPO, tiny_benchmark_config

RESULTS = REPO / "results"


def _subset(tmp_path, name: str, rows: pd.DataFrame) -> str:
    path = tmp_path / name
    rows.to_csv(path, index=False)
    return str(path)


def _read(name: str) -> pd.DataFrame:
    return pd.read_csv(RESULTS / name, dtype={"cuda_version": str, "cudnn_version": str})


@pytest.fixture
def files(tmp_path):
    """A few rows of each tool, real columns and values: CPU and H100 benchmark rows (one of
    them an OOM), attention with an OOM and a FlashAttention row, all-reduce, DDP, loader, warmup."""
    gpu = _read("gpu_sweep_h100.csv")
    gpu = gpu[gpu["model_size"].isin(["small", "medium"]) & gpu["context_length"].isin([128, 256])]
    attention = _read("attention_cpu.csv")
    flash = attention[attention["implementation"] == "sdpa"].assign(implementation="flash-triton")
    return {
        "benchmark": [
            _subset(tmp_path, "cpu.csv", _read("cpu_sweep.csv").head(6)),
            _subset(tmp_path, "cap.csv", _read("cpu_sweep_4gib.csv")),
            _subset(tmp_path, "gpu.csv", gpu),
        ],
        "attention": [_subset(tmp_path, "attention.csv", pd.concat([attention, flash]))],
        "allreduce": [_subset(tmp_path, "allreduce.csv", _read("allreduce_gloo_cpu.csv"))],
        "ddp": [_subset(tmp_path, "ddp.csv", _read("ddp_gloo_cpu.csv"))],
        "loader": [_subset(tmp_path, "loader.csv", _read("input_pipeline_enough_workers_cpu.csv"))],
        "warmup": [_subset(tmp_path, "warmup.csv", _read("warmup_study_cpu.csv"))],
    }


def _all(files) -> list[str]:
    return [path for paths in files.values() for path in paths]


def _balanced(tex: str) -> bool:
    stack = []
    for kind, name in re.findall(r"\\(begin|end)\{(\w+)\}", tex):
        if kind == "begin":
            stack.append(name)
        elif not stack or stack.pop() != name:
            return False
    return not stack


def test_every_format_holds_every_table_row_and_the_markdown_verifies(files, tmp_path, capsys):
    outputs = [tmp_path / "out" / f"report.{ext}" for ext in ("md", "tex", "typ")]
    assert report.main([*_all(files), *(x for o in outputs for x in ("--output", str(o)))]) == 0
    md, tex, typ = (o.read_text() for o in outputs)
    frames = load(_all(files))
    document = build_document(frames, tmp_path, "check", [])
    assert len(document.tables()) > 12
    for table in document.tables():
        assert f"#### {table.title}" in md
        for label, cells in table.frame.iterrows():
            line = f"{escape(label)} & " + " & ".join(escape(c) for c in cells)
            assert line in tex.replace(" \\\\\n", "\n"), (table.title, line)
            assert ", ".join(string(c) for c in (label, *cells)) in typ, (table.title, label)
    assert _balanced(tex) and tex.count("\\begin{table}") == len(document.tables())
    assert "\\usepackage{booktabs,graphicx}" in tex and "\\toprule" in tex and "\\includegraphics" in tex
    for section in ("Step time", "Attention", "All-reduce"):  # a section per kind of row
        assert f"## {section}" in md and f"\\section{{{section}}}" in tex
    assert "NVIDIA H100 80GB HBM3" in md and "AMD EPYC" in md  # every caption names what its rows share
    capsys.readouterr()
    assert report.main(["--verify", str(outputs[0]), *_all(files)]) == 0
    assert "each cell of its" in capsys.readouterr().err


def test_pdf_compiles_with_typst(files, tmp_path):
    pytest.importorskip("typst")
    output = tmp_path / "report.pdf"
    assert report.main([*_all(files), "--output", str(output)]) == 0
    assert output.read_bytes().startswith(b"%PDF") and output.stat().st_size < 1_000_000
    assert not list(tmp_path.glob("*.typ"))  # the source compiled was temporary


def _row(**changes) -> dict:
    """A benchmark row of the tiny model as the tools write it, with the given settings and values."""
    config = {
        k: changes.pop(k) for k in list(changes) if k in ("pass_type", "precision", "compile", "grad_accum_steps")
    }
    row = BenchmarkRecord.for_config(tiny_benchmark_config(**config), "cpu", None, 1000).to_row()
    if "mean_ms" in changes:  # the tables show the median (IQR): a row of steps alike has the two equal
        changes.setdefault("median_ms", changes["mean_ms"])
    row.update(
        status="ok", std_ms=0.1, cv_pct=1.0, iqr_ms=0.1, iqr_pct=1.0, device_name="cpu test", torch_version="2.13.0"
    )
    return {**row, **changes}


@pytest.fixture
def coexisting(tmp_path):
    """One model and context, measured eager and compiled, fp32 and bf16, checkpointed and not, on
    the fast path and not: every one a row of its own, with distinct values."""
    rows = [
        _row(pass_type="forward", mean_ms=10.0, peak_memory_bytes=14 * 2**20),
        _row(pass_type="forward", compile=True, mean_ms=6.0, peak_memory_bytes=88 * 2**20),
        _row(pass_type="forward", precision="bf16", mean_ms=5.0, peak_memory_bytes=12 * 2**20),
        _row(pass_type="train-step", mean_ms=30.0, peak_memory_bytes=23 * 2**20),
        _row(pass_type="train-step", compile=True, mean_ms=20.0, peak_memory_bytes=96 * 2**20),
        _row(pass_type="train-step", checkpoint_blocks=1, mean_ms=36.0, peak_memory_bytes=9 * 2**20),
        _row(pass_type="train-step", grad_accum_steps=4, mean_ms=110.0, peak_memory_bytes=20 * 2**20),
    ]
    path = tmp_path / "coexisting.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path, rows


def test_rows_that_differ_in_any_setting_never_share_a_cell(coexisting, tmp_path):
    path, rows = coexisting
    output = tmp_path / "report.md"
    assert report.main([str(path), "--output", str(output)]) == 0
    text = output.read_text()
    shown = [cell for table in parse_tables(text) for row in table.rows for cell in row]
    for row in rows:  # every row's time is in a cell of its own
        assert f"{sig3(row['median_ms'])} (0.100)" in shown, row["median_ms"]
    memory = next(t for t in parse_tables(text) if "Peak memory" in t.title)
    cells = {tuple(r[: len(r) - 2]): r for r in memory.rows}
    assert any("14.0" in r for r in memory.rows) and any("88.0" in r for r in memory.rows)
    eager = [r for r in memory.rows if "eager" in r]
    assert eager and all("88.0" not in r and "96.0" not in r for r in eager), cells  # compiled never in eager's row
    assert report.main(["--verify", str(output), str(path)]) == 0


def test_a_table_that_would_fold_two_rows_is_refused_when_built():
    rows = pd.DataFrame([_row(pass_type="forward", mean_ms=1.0), _row(pass_type="forward", compile=True, mean_ms=2.0)])
    table = grid(
        rows.assign(source="x.csv"),
        "benchmark",
        title="t",
        labels=[("model", "model")],
        values=[Value("ms", "mean_ms", "ms±")],
    )
    assert list(table.frame.columns)[:1] == ["compile"]  # compile varies: it became a label, not a blend
    with pytest.raises(FoldedRows):
        from cs336_systems.report.grid import cell_value

        cell_value(rows.to_dict("records"), Value("ms", "mean_ms", "ms±"), ("x",))


def test_verify_names_a_changed_cell_and_a_folded_table(coexisting, tmp_path, capsys):
    path, _ = coexisting
    output = tmp_path / "report.md"
    assert report.main([str(path), "--output", str(output)]) == 0
    text = output.read_text()
    changed = tmp_path / "changed.md"
    changed.write_text(text.replace("30.0 (0.100)", "31.0 (0.100)", 1))
    capsys.readouterr()
    assert report.main(["--verify", str(changed), str(path)]) == 1
    err = capsys.readouterr().err
    assert "shows '31.0 (0.100)', the result row gives '30.0 (0.100)'" in err and "column" in err
    # the same tables with the keys that pick a column's row dropped: fp32 and bf16 rows both fit a cell
    folded = tmp_path / "folded.md"
    folded.write_text(re.sub(r"<!-- cells (.*) -->", lambda m: f"<!-- cells {_unkeyed(m.group(1))} -->", text))
    assert report.main(["--verify", str(folded), str(path)]) == 1
    assert "not one row's value (" in capsys.readouterr().err
    bare = tmp_path / "bare.md"
    bare.write_text(re.sub(r"<!-- cells .* -->\n", "", text))
    assert report.main(["--verify", str(bare), str(path)]) == 1
    assert "no spec" in capsys.readouterr().err


def _unkeyed(spec: str) -> str:
    import json

    data = json.loads(spec)
    for value in data["values"]:
        value.pop("where", None)
        value.pop("ratio_to", None)
    return json.dumps(data)


def test_verify_refuses_a_source_not_given_in_one_line(coexisting, tmp_path, capsys):
    path, _ = coexisting
    output = tmp_path / "report.md"
    assert report.main([str(path), "--output", str(output)]) == 0
    other = tmp_path / "other.csv"
    pd.read_csv(path).to_csv(other, index=False)
    capsys.readouterr()
    assert report.main(["--verify", str(output), str(other)]) == 1
    assert "coexisting.csv is not among the result files given" in capsys.readouterr().err
    assert report.main(["--verify", str(tmp_path / "no.md"), str(path)]) == 2


def test_environment_once_with_versions_as_torch_wrote_them(files, tmp_path):
    rows = _read("gpu_sweep_h100.csv").head(2)
    jsonl = tmp_path / "gpu.jsonl"  # JSON keeps cudnn an int; a missing value would make pandas a float of it
    rows.assign(cudnn_version=[91900, None]).to_json(jsonl, orient="records", lines=True)
    output = tmp_path / "report.md"
    assert report.main([files["benchmark"][0], str(jsonl), "--output", str(output)]) == 0
    text = output.read_text()
    environment = text[text.index("## Environment") : text.index("## Step time")]
    assert "| AMD EPYC " in environment and "| NVIDIA H100 80GB HBM3 " in environment
    assert "| 13.0 " in environment and "2.11.0+cu130" in environment
    assert "13.000" not in text and text.count("## Environment") == 1


def test_sections_appear_only_with_their_data(files, tmp_path):
    output = tmp_path / "report.md"
    fp32 = _read("cpu_sweep.csv").query("precision == 'fp32'")
    assert report.main([_subset(tmp_path, "fp32.csv", fp32), "--output", str(output)]) == 0
    text = output.read_text()
    assert "## Step time" in text and "## Memory" in text and "## Phases" in text
    for absent in ("## Mixed precision", "## Attention", "## All-reduce", "## Data-parallel", "## Warmup"):
        assert absent not in text
    assert report.main([*files["attention"], "--output", str(output)]) == 0
    text = output.read_text()
    assert "## Attention" in text and "## Step time" not in text and "## All-reduce" not in text
    assert "Speedup of compiled over naive" in text and "Speedup of flash-triton over sdpa" in text
    table = next(t for t in parse_tables(text) if t.title.startswith("Attention: time"))
    assert sum(cell == "OOM" for row in table.rows for cell in row) >= 4  # naive's OOM shapes are marked


def test_ddp_rows_are_never_folded_and_the_bytes_per_rank_are_shown(files, tmp_path):
    output = tmp_path / "report.md"
    assert report.main([*files["ddp"], "--output", str(output)]) == 0
    text = output.read_text()
    rows = _read("ddp_gloo_cpu.csv")
    time = next(t for t in parse_tables(text) if t.title.startswith("Time per training step"))
    assert len(time.rows) == len(rows)
    if "param_bytes_per_rank" in rows and rows["param_bytes_per_rank"].notna().any():
        assert any(t.title.startswith("Bytes each rank holds") for t in parse_tables(text))


def test_tables_only_writes_one_file_per_table(files, tmp_path):
    output = tmp_path / "t" / "tables.tex"
    assert report.main([*files["allreduce"], "--output", str(output), "--tables-only"]) == 0
    written = sorted(p.name for p in output.parent.glob("tables_*.tex"))
    assert len(written) == 3  # time, bandwidth, environment
    for path in output.parent.glob("tables_*.tex"):
        text = path.read_text()
        assert text.startswith("\\begin{table}[!htbp]") and _balanced(text) and "\\documentclass" not in text


def _one_line_exit_2(capsys, argv, expected):
    code = report.main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and expected in err, err


def test_bad_input_is_one_line_and_exit_2(files, tmp_path, capsys, monkeypatch):
    with pytest.raises(SystemExit) as exit_info:
        report.main([])
    assert exit_info.value.code == 2 and capsys.readouterr().err.count("\n") == 1
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"\xff\xfe\x00garbage\x00\xff")
    (tmp_path / "folder.csv").mkdir()
    for argv, expected in (  # nothing left to report: exit 2, one line
        ([str(tmp_path / "missing.csv")], "no such file"),
        ([str(binary)], "binary.csv:1: not UTF-8 text"),
        ([str(tmp_path / "folder.csv")], "is a directory"),
        ([str(RESULTS / "checks" / "bench_timing_cpu.csv")], "not the output of any tool of this project"),
        ([*files["ddp"], "--output", str(tmp_path / "r.csv")], "unknown format '.csv'"),
        ([*files["ddp"], "--output", str(tmp_path / "r.pdf"), "--tables-only"], "not PDF"),
        (["--verify", str(tmp_path / "r.txt"), *files["ddp"]], "expected a Markdown write-up"),
    ):
        _one_line_exit_2(capsys, argv, expected)
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "typst" else object())
    _one_line_exit_2(capsys, [*files["ddp"], "--output", str(tmp_path / "r.pdf")], 'pip install "typst>=0.14"')
    assert not (tmp_path / "r.pdf").exists() and not (tmp_path / "r.csv").exists()


def test_a_file_of_no_tool_is_one_line_and_the_rest_is_reported(files, tmp_path, capsys):
    checks = sorted(str(p) for p in (RESULTS / "checks").glob("*.csv"))
    missing = str(tmp_path / "missing.csv")
    output = tmp_path / "report.md"
    code = report.main([*files["ddp"], *checks, missing, *files["warmup"], "--output", str(output)])
    err = capsys.readouterr().err.splitlines()
    left_out = [line for line in err if "left out" in line]
    assert code == 1 and len(left_out) == len(checks) + 1 and "Traceback" not in "\n".join(err)
    assert all(any(Path(path).name in line for line in left_out) for path in [*checks, missing])
    text = output.read_text()
    assert "Data-parallel training" in text and "Warmup effect" in text


def test_monitor_probe_and_find_max_outputs_are_reported_and_verify(tmp_path, capsys):
    outputs = [
        RESULTS / "monitor_captioning_cpu.csv",
        RESULTS / "monitor_captioning_cpu.json",
        RESULTS / "probe_story_cpu.csv",
        RESULTS / "find_max_cpu_4gib.json",
    ]
    output = tmp_path / "report.md"
    assert report.main([*map(str, outputs), "--output", str(output)]) == 0
    text = output.read_text()
    monitor = pd.read_csv(outputs[0])
    assert "Resources over a run" in text and f"{len(monitor)} samples" in text
    assert "python -m cs336_systems.loader_bench" in text  # the command, from the run record
    assert "Your training loop" in text and "num_workers=8" in text
    answer = pd.read_json(outputs[3], typ="series")
    assert "Largest that fits" in text and re.search(
        rf"\|\s*{answer['largest_ok']}\s*\|\s*{answer['smallest_oom']}\s*\|", text
    )
    assert report.main(["--verify", str(output), *map(str, outputs)]) == 0


def test_tex_compiles_with_pdflatex(files, tmp_path):
    """Only booktabs and graphicx: a standard distribution compiles it (skipped without one)."""
    import shutil
    import subprocess

    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex is not installed")
    output = tmp_path / "report.tex"
    assert report.main([*_all(files), "--output", str(output)]) == 0
    done = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", output.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:]


def test_model_label_names_the_size_table_where_a_size_changed_shape_and_a_factory_by_name():
    from cs336_systems.report.fields import model_label

    assert model_label({"model_size": "xl", "size_table": "2025"}) == "xl (2025)"
    assert model_label({"model_size": "xl", "size_table": "2026"}) == "xl (2026)"
    assert model_label({"model_size": "small", "size_table": "2026"}) == "small"  # same shape in both
    assert model_label({"model_size": "10B", "size_table": "2026"}) == "10B"
    assert model_label({"model_size": "xl"}) == "xl"  # files written before size_table existed
    factory = {"model_size": "custom", "model_factory": "cs336_basics.model:BasicsTransformerLM", "d_model": 128}
    factory.update(num_layers=2, d_ff=352, vocab_size=1000)
    assert model_label(factory) == "BasicsTransformerLM d128 L2 ff352 V1000"


def test_typst_gives_a_long_text_column_a_width_and_a_too_wide_table_a_landscape_page_and_smaller_text():
    """A wrapped column has a width of its own (1fr beside wide columns can be nothing, and its words run into
    the next column); a table wider than a landscape page is set there at the smaller font."""
    import pandas as pd

    from cs336_systems.report.document import Table
    from cs336_systems.report.typst_source import table_typst

    long_text = "all-gather + reduce-scatter time of one profiled step"
    narrow = Table("t", "T", "c", pd.DataFrame({"strategy": ["fsdp2"], "measured as": [long_text]}))
    source = table_typst(narrow)
    assert "columns: (auto, 55mm,)" in source and "flipped" not in source and "5.5pt" not in source
    wide = Table("w", "W", "c", pd.DataFrame({f"column {i}": ["x" * 30] for i in range(8)}))
    source = table_typst(wide)
    assert source.startswith("#page(flipped: true)[") and "set text(size: 5.5pt)" in source
